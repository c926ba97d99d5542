"""What ``tether train`` would otherwise find only after its model loads, checked before: the task is built (its
data read, split and typed exactly as the run will), a local model directory holds a model, the device is here,
the launch fits the strategy, the batch arithmetic makes sense, and inputs an earlier command writes are named
with that command.

Run by :func:`tether.checks.check_config` after the machine checks pass, so by ``tether validate`` and by every
command before its model loads alike.
"""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path
from typing import Any

from tether.checks.context import policy_reads_images
from tether.checks.findings import Findings
from tether.checks.machine import looks_like_hub_id, model_inputs
from tether.checks.workload import beside_the_config, workload_class
from tether.config import Config, ConfigError, SFTConfig

WEIGHT_FILES = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json", "*.gguf")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
                   "preprocessor_config.json")


def data_inputs(cfg: Config, sft: SFTConfig | None = None) -> dict[str, str]:
    """Config key -> file, for the data files the run reads: ``*path`` settings of the task, env and ``sft`` (the
    section of a ``tether sft`` config)."""
    found = {}
    workload = cfg.task if cfg.task is not None else cfg.env
    section = "task" if cfg.task is not None else "env"
    for key, value in workload.kwargs.items():
        if key.endswith("path") and isinstance(value, str):
            found[f"{section}.kwargs.{key}"] = value
    if sft is not None and sft.path is not None:
        found["sft.path"] = sft.path
    return found


def _is_alias(name: str) -> bool:
    from tether.models.policy import is_alias  # here, not at the top: the config checks import no torch

    return is_alias(name)


def missing_inputs(cfg: Config, *, policy: bool = True, training: bool = True,
                   sft: SFTConfig | None = None) -> dict[str, str]:
    """Config key -> path of each model or data file the config names that is not here: no such path, and for a
    model not a tether alias nor a Hub model in the local cache either."""
    from tether.checks.context import hub_file

    missing = {key: value for key, value in data_inputs(cfg, sft).items() if not Path(value).expanduser().exists()}
    for key, value in model_inputs(cfg, policy=policy, training=training).items():
        if not (_is_alias(value) or Path(value).expanduser().exists() or hub_file(value, "config.json") is not None):
            missing[key] = value
    return missing


def prerequisite_line(missing: dict[str, str], written_by: list[str], whose: str = "this config's") -> str:
    """One line naming ``missing`` (key -> path) and, to run first, the commands of ``# written by:`` lines."""
    commands = "; then ".join(f"`{c}`" for c in written_by)
    keys = ", ".join(f"{key}={value}" for key, value in missing.items())
    return f"{keys}: not here yet; {whose} inputs are written by {commands} (run that first)"


def check_prerequisites(cfg: Config, found: Findings, *, policy: bool = True, training: bool = True,
                        sft: SFTConfig | None = None) -> None:
    """A model or data path the config names that is not here yet, when the config says which command writes its
    inputs (``# written by: COMMAND`` comment lines): that command is named, to run first."""
    if not cfg.written_by:
        return
    missing = missing_inputs(cfg, policy=policy, training=training, sft=sft)
    if missing:
        raise ConfigError(prerequisite_line(missing, cfg.written_by))


def check_model_dirs(cfg: Config, found: Findings, *, policy: bool = True, training: bool = True) -> None:
    """Each local model directory holds a model: a config (or a LoRA adapter's), weights, and a tokenizer (a LoRA
    adapter directory of tether's carries its tokenizer too). An empty directory fails here, not in
    ``from_pretrained`` after the run directory is created."""
    for key, value in model_inputs(cfg, policy=policy, training=training).items():
        directory = Path(value).expanduser()
        if _is_alias(value) or not directory.is_dir():
            continue
        names = sorted(p.name for p in directory.iterdir())
        listing = ", ".join(names[:8]) + (" ..." if len(names) > 8 else "") if names else "it is empty"
        if not (directory / "config.json").is_file() and not (directory / "adapter_config.json").is_file():
            raise ConfigError(f"{key}: {value} holds no model: no config.json (nor adapter_config.json); {listing}")
        if not any(any(directory.glob(pattern)) for pattern in WEIGHT_FILES):
            raise ConfigError(f"{key}: {value} has no weights (*.safetensors or *.bin); {listing}")
        if key == "model.name" and not any((directory / name).is_file() for name in TOKENIZER_FILES):
            raise ConfigError(f"{key}: {value} has no tokenizer (tokenizer.json, tokenizer_config.json or "
                              f"tokenizer.model); {listing}")


def _hub_dataset(cfg: Config) -> str | None:
    """The dataset task's ``path`` when it can only come from the Hub (not here, not a ``datasets`` builder, written
    as a Hub id), else ``None``: a task of one's own may take a ``path`` of another kind (``s3://...``)."""
    from tether.files import written_as_local_path
    from tether.tasks.dataset_task import BUILDERS, DatasetTask

    path = cfg.task.kwargs.get("path") if cfg.task is not None else None
    if (not isinstance(path, str) or workload_class(cfg)[1] is not DatasetTask or path in BUILDERS
            or Path(path).expanduser().exists() or written_as_local_path(path) or not looks_like_hub_id(path)):
        return None
    return path


def _dataset_cached(hub_id: str) -> bool:
    """Whether ``datasets`` can read ``hub_id`` with the Hub not answering: from its own Arrow cache
    (``HF_DATASETS_CACHE/org___name``, where a data set loaded once is kept) or the Hub cache's snapshot."""
    from datasets import config as datasets_config
    from datasets.naming import camelcase_to_snakecase

    from tether.checks.context import hub_file

    org, _, name = hub_id.rpartition("/")  # datasets snake-cases the name: HuggingFaceH4___math-500
    folder = "___".join(part for part in (org, camelcase_to_snakecase(name)) if part)
    arrow = Path(datasets_config.HF_DATASETS_CACHE).expanduser() / folder
    return arrow.is_dir() or hub_file(hub_id, "README.md", repo_type="dataset") is not None


def hub_dataset_left_to_run(cfg: Config, found: Findings) -> bool:
    """Whether the task's Hub data set is left to the run to read (said in a warning): with the Hub switched off
    (``HF_HUB_OFFLINE``), or surely not reachable (:func:`~tether.checks.context.hub_unreachable`) with the data set
    in a local cache, which ``datasets`` falls back to after its retries.

    Raises:
        ConfigError: the Hub cannot be reached and the data set is in no local cache: the run could not read it.
    """
    from huggingface_hub import constants

    from tether.checks.context import hub_unreachable

    hub_id = _hub_dataset(cfg)
    if hub_id is None:
        return False
    later = "so its rows, columns and splits are checked when the run loads it"
    if constants.HF_HUB_OFFLINE:
        found.warn(f"task.kwargs.path={hub_id!r}: a Hub dataset cannot be read offline (HF_HUB_OFFLINE), {later}")
        return True
    problem = hub_unreachable()
    if problem is None:
        return False
    if not _dataset_cached(hub_id):
        raise ConfigError(f"task.kwargs.path={hub_id!r}: the Hub cannot be reached ({problem}) and the data set is in "
                          "no local cache; load it once where the Hub answers, or download its files (hf download "
                          f"--repo-type dataset {hub_id} --local-dir DIR) and give path: DIR")
    found.warn(f"task.kwargs.path={hub_id!r}: the Hub cannot be reached ({problem}); the run reads the local cache's "
               f"copy after the Hub's retries (HF_HUB_OFFLINE=1 skips them), {later}")
    return True


def check_task_builds(cfg: Config, found: Findings, *, policy: bool = True) -> None:
    """Build the task as the trainer will (reading, splitting and typing its data): a 50-row file with
    ``val_size=100``, or a prompt field holding a list, fails here as one line. A task whose prompts carry images
    (its ``image_column``: a data set's ``image`` column, say) needs a vision-language policy (``policy``: the run
    loads it), as an env that renders images does. Each reward function is called once on the first training row
    (:func:`~tether.rewards.task.check_reward_calls`): a return that is not one value per completion is an error, a
    fault of that row's call (a raise, a NaN, a timeout) a warning."""
    if cfg.task is None or hub_dataset_left_to_run(cfg, found):
        return
    from tether.tasks import make_task
    from tether.tasks.base import task_split

    try:
        task = make_task(cfg.task.name, **cfg.task.kwargs)
        check_task_shape(cfg.task.name, task)
    except (ValueError, TypeError, KeyError, OSError) as err:
        message = str(err.args[0] if isinstance(err, KeyError) and err.args else err)
        raise ConfigError.under("task.kwargs", err, message + beside_the_config(cfg, "task", message)) from None
    try:
        held_out = task_split(task, cfg.val.split) if cfg.val.every else task.val
    except ValueError as err:  # a split the task does not have: val.split's value, not the task's settings
        raise ConfigError(f"val.split={cfg.val.split!r}: {err}") from None
    if not task.train:
        raise ConfigError(f"task.kwargs: the task {cfg.task.name!r} has no training prompts")
    if cfg.val.every and not held_out:
        raise ConfigError(f"val.split={cfg.val.split!r}: the task has no held-out prompts there; set val.every=0 "
                          "or give it held-out data")
    images = getattr(task, "image_column", None)
    if policy and images is not None and policy_reads_images(cfg.model.name) is False:
        from tether.tasks.images import CONTENT_PARTS

        where = "the image parts of its messages" if images == CONTENT_PARTS else f"column {images!r}"
        raise ConfigError(f"task.kwargs: the data's prompts carry images ({where}), but model.name={cfg.model.name} "
                          "is a text model (no vision_config): use a vision-language model (e.g. "
                          "Qwen/Qwen2.5-VL-3B-Instruct; tiny-qwen2.5-vl for a smoke run), or a format_fn that "
                          "returns no images")
    if cfg.task.rewards:  # the reward functions' arguments against the columns the rows give them
        from tether.rewards import check_reward_columns, item_columns

        check_reward_columns(cfg.task.rewards, item_columns([*task.train, *held_out]))
    if os.environ.get("RANK", "0") != "0":  # a failed call raises on the first rank; torchrun then stops the others
        return  # a call may cost (a paid API, a sandbox): once per start, by the first rank, not once per rank
    from tether.rewards.task import check_reward_calls, check_task_score

    for line in check_task_score(task, cfg.task) + check_reward_calls(cfg.task.rewards or [], task.train[0]):
        found.warn(line)


def check_env(cfg: Config, found: Findings, *, policy: bool = True) -> None:
    """One env built with ``env.kwargs``, as the run builds its first, for what validate must know of it; built
    once, only when one of these needs it:

    * its settings: a class without a ``check_config`` of them (an env of your own, TextWorld) is built, so a
      constructor that refuses them fails here as one line, not after the policy loads ("no episode can start"). A
      tether class with a ``check_config`` has had it called, cheaply, and is not built for this: ALFWorld's and
      WebShop's constructors load their data.
    * its answers: an env of the user's own (its class outside tether) has what the run uses of the protocol
      (:func:`missing_members`) and answers one ``reset`` and one ``step`` (:func:`play_once`).
    * its observations (``policy``: the run loads its policy): an env that renders images (its ``renders_images``)
      needs a vision-language policy; the collector refuses a text tokenizer once the model has loaded.

    The build runs under the run's reset limit (``env.reset_timeout_s``, else ``env.timeout_s``), so a constructor
    that hangs stops validate as it would stop the run; one that fails is this check's to report only when its
    settings are checked here, else the run's."""
    from tether.checks.workload import workload_class
    from tether.envs.safe import EnvFault, call_with_timeout

    cls = workload_class(cfg)[1] if cfg.env is not None else None
    if cls is None:
        return
    users_own = cls.__module__.partition(".")[0] != "tether"
    settings = users_own or not hasattr(cls, "check_config")
    observations = policy and hasattr(cls, "renders_images") and policy_reads_images(cfg.model.name) is False
    if not (settings or observations):
        return
    try:
        env = call_with_timeout(functools.partial(cls, **cfg.env.kwargs), cfg.env.reset_timeout_s or cfg.env.timeout_s,
                                f"building env {cfg.env.name}")
    except EnvFault as fault:
        if settings:
            raise ConfigError(f"env.kwargs: {fault}") from None
        return
    try:
        missing = missing_members(env) if users_own else []
        problem = play_once(cfg, env) if users_own and not missing else None
        images = observations and bool(env.renders_images)
    finally:
        if callable(close := getattr(env, "close", None)):
            with contextlib.suppress(Exception):  # best effort: a probe's env is dropped either way
                close()
    if missing:
        raise ConfigError(f"env.name={cfg.env.name}: the env has no {', '.join(missing)}, which the run uses (the "
                          "TextEnv protocol, docs/environments.md; tether.envs.base has parse_tagged_action, and "
                          "train_seeds and eval_seeds to set as staticmethods)")
    if problem:
        raise ConfigError(f"env.name={cfg.env.name}: {problem}; reset returns tether.envs.EnvReset(observation, task, "
                          "admissible_actions, info) and step tether.envs.EnvStep(observation, reward, done, info) "
                          "(docs/environments.md)")
    if images:
        raise ConfigError(f"env.name={cfg.env.name} observes images (env.kwargs), but model.name={cfg.model.name} is a "
                          "text model (no vision_config): use a vision-language model, or env.kwargs.observation: "
                          "text")


# What the run reads of a task (tether.tasks.Task): a task of one's own without one stopped the run after the policy
# had loaded (AttributeError: ... no attribute 'system_prompt')
TASK_READS = ("name", "train", "val", "system_prompt")


def check_task_shape(name: str, task: Any) -> None:
    """``task`` has what the run reads of a :class:`~tether.tasks.Task` (:data:`TASK_READS`, a callable ``score``
    or ``score_batch``), its splits are lists of :class:`~tether.tasks.TaskItem`, and every prompt is a text or a
    conversation as the data set task reads one (:func:`~tether.tasks.dataset_task.check_messages`): an ``int``
    prompt stopped the run at its first batch, after the model loaded.

    Raises:
        ConfigError: naming the task and what is missing or which item holds what.
    """
    missing = [member for member in TASK_READS if not hasattr(task, member)]
    if not any(callable(getattr(task, method, None)) for method in ("score", "score_batch")):
        missing.append("score")
    if missing:
        raise ConfigError(f"task.name={name}: the task has no {', '.join(missing)}, which the run reads (a task has "
                          "name, train, val, system_prompt and score: tether.tasks.Task, docs/tasks.md)")
    for split in ("train", "val"):
        items = getattr(task, split)
        if not isinstance(items, list):
            raise ConfigError(f"task.name={name}: its {split} is {type(items).__name__}, not a list of TaskItem")
        for index, item in enumerate(items):
            problem = task_item_problem(item)
            if problem is not None:
                raise ConfigError(f"task.name={name}: {split}[{index}] {problem}")


def task_item_problem(item: Any) -> str | None:
    """What makes ``item`` no :class:`~tether.tasks.TaskItem` the run can encode, or None."""
    from tether.tasks.base import TaskItem
    from tether.tasks.dataset_task import check_messages

    if not isinstance(item, TaskItem):
        return f"is {type(item).__name__}, not a tether.tasks.TaskItem"
    if isinstance(item.prompt, str):
        return None
    try:
        check_messages(item.prompt, "has a prompt that")
    except ValueError as err:
        return str(err)
    return None


# What the run reads of an env (tether.envs.base.TextEnv), which the collector would find missing only after the
# policy loaded; solution() is left out: only a warm start's solver data and the rule analyzer call it.
RUN_READS = ("name", "max_turns", "action_format")
RUN_CALLS = ("reset", "step", "parse_action", "train_seeds", "eval_seeds", "close")


def missing_members(env: Any) -> list[str]:
    """The members of :data:`RUN_READS` and :data:`RUN_CALLS` ``env`` lacks (a method set to something that is not
    callable counts as missing)."""
    return [name for name in RUN_READS if not hasattr(env, name)] + \
        [name for name in RUN_CALLS if not callable(getattr(env, name, None))]


def play_once(cfg: Config, env: Any) -> str | None:
    """What is wrong with the types of ``env``'s answers to one ``reset`` (its first training seed) and one ``step``
    (the first admissible action, else ``""``), or None: one that returns gymnasium's tuples would fault every episode
    once the model has loaded. A call that raises or hangs is the run's to report, with its retries."""
    from tether.envs.safe import EnvFault, call_with_timeout, reset_problem, step_problem

    seeds = getattr(env, "train_seeds", None)
    seed = seeds(1)[0] if callable(seeds) else 0
    try:
        reset = call_with_timeout(lambda: env.reset(seed), cfg.env.reset_timeout_s or cfg.env.timeout_s, "reset")
        if (problem := reset_problem(reset)) is not None:
            return f"reset({seed}) {problem}"
        action = (reset.admissible_actions or [""])[0]
        problem = step_problem(call_with_timeout(lambda: env.step(action), cfg.env.timeout_s, "step"))
    except EnvFault:
        return None
    return problem and f"step({action!r}) {problem}"


def warn_no_chat_template(cfg: Config, found: Findings) -> None:
    """The policy's tokenizer (with ``model.chat_template``, :func:`~tether.checks.context.policy_tokenizer`) has a
    chat template: without one every prompt, a task's, a data set's or an env's, is encoded as plain text, which
    :func:`tether.models.encode_chat` warns about at the first prompt, after the model has loaded. A
    vision-language model's template is its processor's, not its tokenizer's: left to the run."""
    from tether.checks.context import policy_tokenizer
    from tether.models.chat import NO_CHAT_TEMPLATE

    if policy_reads_images(cfg.model.name):
        return
    tokenizer = policy_tokenizer(cfg)
    if tokenizer is not None and not getattr(tokenizer, "chat_template", None):
        found.warn(f"model.name={cfg.model.name}: {NO_CHAT_TEMPLATE}; set model.chat_template to a Jinja template "
                   "file")


def check_device(cfg: Config, found: Findings) -> None:
    """``train.device`` exists on this machine (a CPU-only torch and ``cuda`` fail here)."""
    from tether.distributed import resolve_device

    resolve_device(cfg.train.device)


def warn_launch(cfg: Config, found: Findings) -> None:
    """``distributed.strategy=fsdp2`` needs a torchrun launch; a validate outside one can only say so."""
    launched = "MASTER_ADDR" in os.environ or int(os.environ.get("WORLD_SIZE", "1")) > 1
    if cfg.distributed.strategy == "fsdp2" and not launched:
        found.warn("distributed.strategy=fsdp2 runs only under torchrun (torchrun --nproc_per_node N -m tether.cli "
                   "train CONFIG); `tether train` without it stops before any model loads")


def warn_batch_arithmetic(cfg: Config, found: Findings) -> None:
    """A micro-batch larger than the rows of a mini-batch is legal but means the setting does nothing."""
    o, r = cfg.optim, cfg.rollout
    if o.max_tokens_per_micro_batch is not None or cfg.env is not None:
        return  # token budgets and agent turns make the row count vary
    if o.micro_batch_size == type(o).model_fields["micro_batch_size"].default:
        return  # the default (16) is a ceiling for any batch, not a choice that does nothing (a run's config.yaml
        # writes every field, so the value, not whether it was set, tells)
    rows = -(-r.prompts_per_step * r.group_size // o.mini_batches)  # torch.chunk's: the largest mini-batch's rows
    if o.micro_batch_size > rows:
        found.warn(f"optim.micro_batch_size={o.micro_batch_size} exceeds the {rows} rows of a mini-batch "
                   f"(rollout.prompts_per_step x rollout.group_size / optim.mini_batches): every mini-batch is one "
                   "micro-batch, so the setting changes nothing")


def startup_checks(*, policy: bool = True, training: bool = True) -> tuple:
    """The checks of this module; ``policy=False`` when the caller brings the policy itself, ``training=False``
    without those about training alone (the launch, the batch arithmetic) for a command that trains nothing."""
    def models(cfg: Config, found: Findings) -> None:
        check_model_dirs(cfg, found, policy=policy, training=training)

    def env(cfg: Config, found: Findings) -> None:
        check_env(cfg, found, policy=policy)

    def task(cfg: Config, found: Findings) -> None:
        check_task_builds(cfg, found, policy=policy)

    policy_checks = (warn_no_chat_template,) if policy else ()
    training_checks = (warn_launch, warn_batch_arithmetic) if training else ()
    return (models, task, env, *policy_checks, check_device, *training_checks)
