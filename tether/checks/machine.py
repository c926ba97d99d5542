"""What a config names must be on this machine: models, data files, packages, the engine. Checked before any model
loads.

Kept apart from the checks of what a config says because a shipped config may name a checkpoint that an earlier
stage will write, or a data file to fetch first: such a config is valid, and only a run of it needs the files.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
from pathlib import Path

from tether.checks.context import hub_file, hub_unreachable, warn_context
from tether.checks.findings import Findings
from tether.checks.workload import beside_the_config, workload_class
from tether.config import Config, ConfigError, SFTConfig, SkillSFTSettings
from tether.files import nearest_path_guess, relative_to_cwd, written_as_local_path

HUB_ID_PARTS = 2  # "org/name"
HUB_ID_PART = re.compile(r"[A-Za-z0-9][\w.-]*")  # a Hub user, organisation or repository name


def looks_like_hub_id(name: str) -> bool:
    """Whether ``name`` is written as a Hub id: ``org/name``, or one word (the Hub's oldest models: gpt2)."""
    parts = name.split("/")
    return len(parts) <= HUB_ID_PARTS and all(HUB_ID_PART.fullmatch(p) for p in parts)


def check_model(key: str, name: str) -> None:
    """``name`` is a tether alias, a local directory, or a Hub id already in the local cache (tether loads
    offline when ``HF_HUB_OFFLINE`` is set; otherwise a Hub id not cached yet is left to download, when the Hub
    answers: :func:`~tether.checks.context.hub_unreachable`, one probe). A name written
    as a local path (:func:`~tether.files.written_as_local_path`: ``runs/x`` where ``runs/`` is here) that is not
    here is refused, with the nearest entries of its folder. A one-word
    name close to an alias (``smollm2-135m``) that is neither here nor cached is refused with the alias: it reads as
    a Hub id, which would cost a run directory, the Hub's retries and a traceback before failing."""
    from tether.models.char import char_size_problem, parse_char_alias
    from tether.models.loading import SMOLLM2, TINY_ALIAS, tiny_size_problem
    from tether.models.policy import ALIAS_LIST, TINY_VLMS, close_alias

    char, tiny = parse_char_alias(name), TINY_ALIAS.fullmatch(name)
    sized = char_size_problem(*char) if char else tiny_size_problem(*map(int, tiny.groups())) if tiny else None
    if sized is not None:
        raise ConfigError(f"{key}: {sized}")
    if name == SMOLLM2 or name in TINY_VLMS or char or tiny or Path(name).expanduser().is_dir():
        return
    cached = hub_file(name, "config.json") is not None
    # runs/x where runs/ is here: read as a Hub id, it was left to a download; a cached Hub id is still one (Qwen/...
    # beside a folder Qwen/)
    if written_as_local_path(name) and not cached:
        raise ConfigError(f"{key}: {name!r} is not a directory here{relative_to_cwd(name)}, and is not a Hub id "
                          f"(org/name){nearest_path_guess(name)}")
    alias = close_alias(name)
    if not looks_like_hub_id(name):
        guess = f"; did you mean {alias}?" if alias is not None else ""
        raise ConfigError(f"{key}: {name!r} is not a directory here, nor a tether alias ({ALIAS_LIST}), "
                          f"nor a Hub id (org/name, or one word like gpt2){guess}")
    if not cached and alias is not None:
        raise ConfigError(f"{key}: {name!r} is not a tether alias, a directory here or a cached Hub model; did you "
                          f"mean {alias}? (tether's aliases: {ALIAS_LIST})")
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "") or \
        os.environ.get("TRANSFORMERS_OFFLINE", "0") not in ("0", "")
    if offline and not cached:
        raise ConfigError(f"{key}: {name!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; "
                          f"download it first (hf download {name}) or give a local directory")
    # with no network, the download retries the Hub for about 25 s, after the run directory is written, and fails
    if not cached and (problem := hub_unreachable()) is not None:
        raise ConfigError(f"{key}: {name!r} is not in the local Hugging Face cache and the Hub cannot be reached "
                          f"({problem}); connect and download it first (hf download {name}), or run with "
                          "HF_HUB_OFFLINE=1 where a cached copy is, or give a local directory")


def model_inputs(cfg: Config, *, policy: bool = True, training: bool = True) -> dict[str, str]:
    """Config key -> model name or path, for every model the command loads: the policy unless the caller brings it;
    the reference and each model a method loads unless the command trains nothing (``tether eval`` samples with the
    policy alone, so a run's moved reference or EAPO prior does not stop the evaluation of its checkpoint)."""
    from tether.methods import METHODS, method_config

    found = {"model.name": cfg.model.name} if policy else {}
    if not training:
        return found
    if cfg.model.ref_name:
        found["model.ref_name"] = cfg.model.ref_name
    for name, section in cfg.methods.items():
        found.update(METHODS[name].named_models(method_config(name, section)))
    return found


def check_models(cfg: Config, found: Findings, *, policy: bool = True, training: bool = True) -> None:
    """Each model the command loads (:func:`model_inputs`) is an alias, a directory here or a cached Hub model."""
    for key, model in model_inputs(cfg, policy=policy, training=training).items():
        check_model(key, model)


def check_tokenizers(cfg: Config, found: Findings) -> None:
    """``model.ref_name`` and each model a method reads at the policy's token ids (EAPO's prior,
    ``Method.policy_tokenizer_models``) use the policy's tokenizer, compared from the tokenizers alone (no weights
    load): where the model loads, the same comparison (``models.policy.check_vocabulary``) stopped the run after the
    policy had loaded. A name whose tokenizer cannot be loaded alone here is left to that check."""
    from tether.checks.context import load_tokenizer
    from tether.methods import METHODS, method_config
    from tether.models.policy import REFERENCE_TOKENIZER_WHY, check_tokenizer

    others = {"model.ref_name": (cfg.model.ref_name, REFERENCE_TOKENIZER_WHY)} if cfg.model.ref_name else {}
    for method, section in cfg.methods.items():
        settings = method_config(method, section)
        names, bound = METHODS[method].named_models(settings), METHODS[method].policy_tokenizer_models(settings)
        others.update({key: (names[key], why) for key, why in bound.items()})
    others = {key: (name, why) for key, (name, why) in others.items() if name != cfg.model.name}
    mine = load_tokenizer(cfg.model.name) if others else None
    if mine is None:
        return
    for key, (name, why) in others.items():
        theirs = load_tokenizer(name)
        if theirs is not None:
            check_tokenizer(mine, theirs, key, name, why)


def check_packages(cfg: Config, found: Findings) -> None:
    """Optional packages the config turns on."""
    # (key, package, tether's extra that installs it, is it used)
    wanted = [("logging.wandb", "wandb", "wandb", cfg.logging.wandb is not None),
              ("logging.mlflow", "mlflow", "mlflow", cfg.logging.mlflow is not None),
              ("logging.tensorboard", "tensorboard", None, cfg.logging.tensorboard),
              ("env.workers", "ray", "ray", cfg.env is not None and cfg.env.workers > 0),
              ("model.lora", "peft", "lora", cfg.model.lora is not None)]
    for key, package, extra, used in wanted:
        if used and importlib.util.find_spec(package) is None:
            install = f"pip install -e '.[{extra}]'" if extra else f"pip install {package}"
            raise ConfigError(f"{key} is set but the package {package!r} is not installed; {install} (the version "
                              f"tether is tested with), or unset {key}")


def check_engine_here(cfg: Config, found: Findings) -> None:
    """The engine's own packages and devices (vLLM, Ray), asked of its registry entry."""
    from tether.engine.base import EngineUnavailableError
    from tether.engine.registry import check_engine_available

    try:
        check_engine_available(cfg.rollout.engine)
    except EngineUnavailableError as err:
        raise ConfigError(str(err)) from None  # it names rollout.engine, what is missing and how to install it


def check_workload_inputs(cfg: Config, found: Findings) -> None:
    """The task's or environment's own inputs (data files, its package), through its optional
    ``check_inputs(**kwargs)`` hook, which raises for what is missing and may return warning lines."""
    section, cls = workload_class(cfg)
    if cls is None:
        raise ConfigError(f"env.name={cfg.env.name}: its module cannot be imported here (a package it needs is "
                          "missing); see docs/environments.md")
    hook = getattr(cls, "check_inputs", None)
    if hook is None:
        return
    try:
        for line in hook(**getattr(cfg, section).kwargs) or []:
            found.warn(f"{section}.kwargs: {line}")
    except (OSError, ValueError) as err:
        raise ConfigError.under(f"{section}.kwargs", err, f"{err}{beside_the_config(cfg, section, str(err))}") from None


def check_chat_template(cfg: Config, found: Findings) -> None:
    """``model.chat_template`` is a file holding a Jinja template that compiles."""
    if cfg.model.chat_template is None:
        return
    from tether.models.chat_template import read_chat_template

    try:
        read_chat_template(cfg.model.chat_template)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def check_rewards_here(cfg: Config, found: Findings) -> None:
    """Each reward class's own check of its settings (``task.rewards``): a reward model's directory or cached Hub
    id, a judge's URL and parser."""
    if cfg.task is not None and cfg.task.rewards:
        from tether.rewards import check_reward_terms

        check_reward_terms(cfg.task.rewards)


def probe_endpoints(cfg: Config) -> list[str]:
    """Warning lines for the servers the config calls that do not answer (an LLM judge's, ``tether seed-sft``'s
    analyzer), each asked once with a short timeout. Run by ``tether validate`` only: not a check of every start,
    which must not wait on the network, and a warning, since the server may be started between validate and train."""
    lines = []
    skills = getattr(cfg, "sft", None)
    if isinstance(skills, SkillSFTSettings) and skills.analyzer == "openai":
        from tether.openai_chat import unreachable
        from tether.rewards.judge import PROBE_TIMEOUT_S

        o = skills.openai
        problem = unreachable(os.environ.get(o.base_url_env, ""), os.environ.get(o.api_key_env, ""),
                              timeout=PROBE_TIMEOUT_S)
        if problem is not None:
            lines.append(f"sft.openai (${o.base_url_env}): {problem}; every analysis would fail after the rollouts: "
                         "start the analyzer's server before tether seed-sft")
    task = getattr(cfg, "task", None)
    if task is not None and task.rewards:
        from tether.rewards import probe_reward_terms

        lines += probe_reward_terms(task.rewards)
    return lines


def check_analyzer_env(skills: SkillSFTSettings) -> None:
    """``sft.analyzer: openai`` (``tether seed-sft``): the environment variables naming its endpoint and model are
    set. The analyzer is built after the model loads and every trajectory is played, so this is checked first.

    Raises:
        ConfigError: naming the unset variables.
    """
    if skills.analyzer != "openai":
        return
    o = skills.openai
    unset = [f"${name}" for name in (o.base_url_env, o.model_env) if not os.environ.get(name)]
    if unset:
        raise ConfigError(f"sft.analyzer=openai: {' and '.join(unset)} not set; the analyzer reads its endpoint from "
                          f"${o.base_url_env} (e.g. http://localhost:8000/v1) and its model from ${o.model_env} "
                          "(sft.openai names the variables), or use sft.analyzer=rule")


def check_sft_data(cfg: Config, sft: SFTConfig) -> None:
    """``sft.data``: the workload it reads (solver: an env; task, rejection: a task); for ``task`` without
    demonstrations, a task that draws more questions (``seed`` and ``train_size``); for ``jsonl``, the file exists,
    every line has a prompt and a response (the first bad line named), and a text policy is given no images."""
    if sft.data == "solver" and cfg.env is None:
        raise ConfigError("sft.data=solver plays an environment's solver: the config needs env: ... (with a task, "
                          "use sft.data: task, jsonl or rejection)")
    if sft.data in ("task", "rejection") and cfg.task is None:
        raise ConfigError(f"sft.data={sft.data} reads a task's prompts: the config needs task: ... (with an env, use "
                          "sft.data: solver or jsonl)")
    if sft.data == "task":
        from tether.tasks.registry import task_factory

        factory = task_factory(cfg.task.name)
        params = inspect.signature(factory).parameters
        takes = any(p.kind is p.VAR_KEYWORD for p in params.values()) or {"seed", "train_size"} <= set(params)
        if not hasattr(factory, "demonstration") and not takes:
            raise ConfigError(f"sft.data=task: task {cfg.task.name!r} has no demonstrations and does not take seed "
                              "and train_size, with which sft draws questions outside its splits (answered with "
                              "sft.response); use sft.data: jsonl or rejection")
    if sft.data != "jsonl":
        return
    from tether.checks.context import policy_reads_images
    from tether.sft_data import jsonl_examples

    if any(example.images for example in jsonl_examples(sft)) and policy_reads_images(cfg.model.name) is False:
        # the run found it only while encoding, after writing its data/: a traceback, and a run directory that
        # the corrected command then refused to start over
        raise ConfigError(f"sft.path: the examples of {sft.path} carry images, but model.name={cfg.model.name} is a "
                          "text model (no vision_config): use a vision-language model (e.g. "
                          "Qwen/Qwen2.5-VL-3B-Instruct; tiny-qwen2.5-vl for a smoke run), or examples without images")


def check_lora_targets(cfg: Config, found: Findings) -> None:
    """``model.lora.target_modules`` each name a linear layer of the policy, as PEFT matches them (the layer's name
    or its last dotted parts). The layer names come from the policy's config, built on the meta device: no weight is
    read or allocated. A policy whose config is not on this machine yet is left to PEFT, which refuses targets it
    finds none of."""
    if cfg.model.lora is None:
        return
    names = _linear_layer_names(cfg.model.name)
    if names is None:
        return
    missing = [t for t in cfg.model.lora.target_modules if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        kinds = sorted({n.rsplit(".", 1)[-1] for n in names})
        raise ConfigError(f"model.lora.target_modules: {', '.join(missing)} name no linear layer of "
                          f"{cfg.model.name}; its linear layers end in: {', '.join(kinds)}")


def _linear_layer_names(name: str) -> list[str] | None:
    """Dotted names of the ``nn.Linear`` layers of model ``name``, or None when its config is not at hand."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, LlamaConfig

    from tether.models.char import parse_char_alias
    from tether.models.loading import SMOLLM2, TINY_ALIAS
    from tether.models.lora import adapter_base_name, is_adapter_dir
    from tether.models.policy import TINY_VLMS

    if name in TINY_VLMS:  # a few million weights, built as the run builds them: a second or two
        from tether.models.vision import tiny_vlm

        return [n for n, m in tiny_vlm(TINY_VLMS[name])[0].named_modules() if isinstance(m, torch.nn.Linear)]
    if name == SMOLLM2 or parse_char_alias(name) is not None or TINY_ALIAS.fullmatch(name):
        # tether's text aliases are Llamas; the names of the layers do not depend on their sizes
        config = LlamaConfig(vocab_size=8, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                             num_attention_heads=1, num_key_value_heads=1)
    elif (local := Path(name).expanduser()).is_dir():
        if is_adapter_dir(local):  # a LoRA run's checkpoint: the layers are those of the base it names
            try:
                return _linear_layer_names(adapter_base_name(local))
            except ValueError:  # it names none: left to the load, which says so
                return None
        config = AutoConfig.from_pretrained(local)
    elif hub_file(name, "config.json") is not None:
        config = AutoConfig.from_pretrained(name)
    else:
        return None
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except ValueError:  # not a causal LM: a vision-language config, built as load_vision_policy loads it
        try:
            with torch.device("meta"):
                model = AutoModelForImageTextToText.from_config(config)
        except ValueError:  # neither: left to PEFT
            return None
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]


def machine_checks(*, policy: bool = True, training: bool = True, sft: SFTConfig | None = None,
                   skills: SkillSFTSettings | None = None) -> tuple:
    """The checks of this module; ``policy=False`` when the caller brings the policy itself; ``training=False`` for a
    command that loads the policy alone (:func:`model_inputs`); ``sft``, the section of a ``tether sft`` config, adds
    the check of its data; ``skills``, a ``tether seed-sft`` config's, its analyzer's."""
    def models(cfg: Config, found: Findings) -> None:
        check_models(cfg, found, policy=policy, training=training)

    def sft_data(cfg: Config, found: Findings) -> None:
        check_sft_data(cfg, sft)

    def analyzer(cfg: Config, found: Findings) -> None:
        check_analyzer_env(skills)

    # the reference's and the methods' tokenizers against the policy's: only where the command loads them
    tokenizers = (check_tokenizers,) if policy and training else ()
    optional = ((warn_context, check_lora_targets, *tokenizers) if policy else ()) + \
        ((sft_data,) if sft is not None else ()) + ((analyzer,) if skills is not None else ())
    return (models, check_packages, check_engine_here, check_chat_template, check_workload_inputs,
            check_rewards_here, *optional)
