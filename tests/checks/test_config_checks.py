"""What a config says, checked before any model loads: each bad setting is one line naming key, value and what is
allowed; suspicious legal settings are one warning line each."""

from __future__ import annotations

import ast
import copy
import re
from pathlib import Path

import pytest

from tests.trainer.helpers import tiny_config
from tether.checks import check_config
from tether.config import ConfigError, load_config
from tether.methods import METHODS, Method, MethodSettings, register_method
from tether.tasks.registry import register_task, unregister_task
from tether.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
TASK = {"task": {"name": "reasoning_gym", "kwargs": {"dataset": "chain_sum"}}}
ENV = {"task": None, "env": {"name": "scripted"}}


def errors_of(data: dict) -> str:
    """The error lines of a config that passes the schema, from the checks alone."""
    cfg = load_config(data={**TASK, **data})
    with pytest.raises(ConfigError) as info:
        check_config(cfg, machine=False)
    return str(info.value)


def warnings_of(data: dict) -> list[str]:
    return check_config(load_config(data={**TASK, **data}), machine=False)


@pytest.mark.parametrize("data, message", [
    # values of loss settings, asked of the loss itself
    ({"algorithm": {"loss_kwargs": {"clip_low": -0.1}}}, r"^algorithm\.loss_kwargs: clip_low must be in \[0, 1\], "
                                                         r"got -0\.1$"),
    ({"algorithm": {"loss_kwargs": {"clip_high": -0.2}}}, r"^algorithm\.loss_kwargs: clip_high must be >= 0"),
    ({"algorithm": {"loss_kwargs": {"dual_clip": 0.5}}}, r"^algorithm\.loss_kwargs: dual_clip must be > 1"),
    ({"algorithm": {"loss_kwargs": {"clip_high": "0.28"}}}, r"^algorithm\.loss_kwargs\.clip_high: '0\.28' is not a "
                                                            r"valid float"),
    ({"algorithm": {"policy_loss": "armor", "use_ref": True, "loss_kwargs": {"alpha": 1.5}}},
     r"^algorithm\.loss_kwargs: armor alpha must be in \(0, 1\], got 1\.5$"),
    ({"algorithm": {"policy_loss": "armor", "use_ref": True, "loss_kwargs": {"alpha": 0}}}, r"armor alpha"),
    ({"algorithm": {"policy_loss": "armor", "use_ref": True, "loss_kwargs": {"scope": "some"}}}, r"armor scope"),
    ({"algorithm": {"policy_loss": "eapo", "loss_kwargs": {"cap": 0}}}, r"^algorithm\.loss_kwargs: eapo cap must be "
                                                                        r"> 0"),
    # the reference the loss reads
    ({"algorithm": {"policy_loss": "armor"}}, r"^algorithm\.policy_loss=armor reads the reference's log-probs, but "
                                              r"this run loads no reference; set algorithm\.use_ref=true"),
    # values of advantage settings, asked of the estimator itself
    ({"algorithm": {"advantage": "episode", "advantage_kwargs": {"mode": "median"}}},
     r"^algorithm\.advantage_kwargs: episode mode must be 'mean_std_norm' or 'mean_norm', got 'median'$"),
    ({"algorithm": {"advantage": "qae", "advantage_kwargs": {"quantile": 2}}}, r"qae quantile must be in \[0, 1\]"),
    ({"algorithm": {"advantage_kwargs": {"eps": "small"}}}, r"^algorithm\.advantage_kwargs\.eps: 'small' is not a "
                                                            r"valid float"),
    # the task's own check, and the types of its settings
    ({"task": {"name": "reasoning_gym", "kwargs": {"dataset": "chain_summ"}}},
     r"^task\.kwargs: unknown reasoning-gym dataset 'chain_summ'\. Did you mean chain_sum"),
    ({"task": {"name": "reasoning_gym", "kwargs": {"dataset": "chain_sum", "dataset_kwargs": {"terms": 3}}}},
     r"^task\.kwargs: bad dataset_kwargs for reasoning-gym 'chain_sum': .*Allowed: .*min_terms"),
    ({"task": {"name": "reasoning_gym", "kwargs": {"dataset": "chain_sum",
                                                   "dataset_kwargs": {"min_terms": 5, "max_terms": 2}}}},
     r"^task\.kwargs: invalid dataset_kwargs for reasoning-gym 'chain_sum': max_terms must be >= min_terms"),
    ({"task": {"name": "reasoning_gym", "kwargs": {"dataset": "chain_sum", "train_size": "10"}}},
     r"^task\.kwargs\.train_size: '10' is not a valid int"),
    ({"task": {"name": "reasoning_gym", "kwargs": {"dataset": "chain_sum", "extract": "xml"}}}, r"^task\.kwargs: "),
    ({"task": {"name": "jsonl", "kwargs": {"train_path": "a.jsonl"}}}, r"^task\.kwargs: the jsonl task needs either"),
    ({"task": {"name": "jsonl", "kwargs": {"path": "a.txt"}}}, r"^task\.kwargs: path: 'a\.txt' is not one of"),
    # the environment's own check
    ({**ENV, "env": {"name": "scripted", "kwargs": {"turns": 0}}}, r"^env\.kwargs: turns must be >= 1, got 0$"),
    ({**ENV, "env": {"name": "sokoban", "kwargs": {"num_boxes": 0}}}, r"^env\.kwargs: num_boxes must be >= 1"),
    ({**ENV, "env": {"name": "frozenlake", "kwargs": {"p": 0}}}, r"^env\.kwargs: p must be in \(0, 1\], got 0$"),
    ({**ENV, "env": {"name": "thin_ice", "kwargs": {"hole_p": 0.7}}}, r"^env\.kwargs: hole_p must be in \[0, 0\.5\)"),
    ({**ENV, "env": {"name": "scripted", "kwargs": {"turns": 2.5}}}, r"^env\.kwargs\.turns: 2\.5 is not a valid int"),
    ({**ENV, "env": {"name": "alfworld", "kwargs": {"eval_split": "test"}}},
     r"^env\.kwargs: eval_split must be one of valid_seen, valid_unseen, got 'test'$"),
    ({**ENV, "env": {"name": "webshop", "kwargs": {"num_products": 500}}},
     r"^env\.kwargs: num_products must be 1000 \(the small product set\) or null \(the full one\), got 500$"),
    ({**ENV, "env": {"name": "ezpoints", "kwargs": {"observation": "pixels"}}},
     r"^env\.kwargs: observation must be 'image' or 'text', got 'pixels'$"),
    ({**ENV, "env": {"name": "ezpoints", "kwargs": {"card_px": 8}}}, r"^env\.kwargs: card_px must be >= 16, got 8$"),
    ({**ENV, "env": {"name": "sokoban_visual", "kwargs": {"cell_px": 2}}}, r"^env\.kwargs: cell_px must be >= 4"),
    ({**ENV, "env": {"name": "sokoban_visual", "kwargs": {"num_boxes": 0}}}, r"^env\.kwargs: num_boxes must be >= 1"),
    # methods' class-level checks, which ran in setup after the policy had loaded
    ({**ENV, "methods": {"armor": {}}}, r"^methods\.armor\.anchors=true needs a single-turn task"),
    ({"rollout": {"group_size": 1}, "algorithm": {"advantage": "episode"}, "methods": {"armor": {}}},
     r"^methods\.armor\.anchors: rollout\.group_size=1; it must be >= 2"),
    ({"methods": {"seed": {}}}, r"^methods\.seed analyses multi-turn trajectories"),
    ({**ENV, "methods": {"seed": {}, "opsd": {}}}, r"^methods\.seed and methods\.opsd both set the teacher"),
    ({"methods": {"opsd": {}}}, r"^methods\.opsd reads env observations"),
    # DAPO's overlong penalty: single-turn rows, its buffer inside the budget (else every response pays it)
    ({"rollout": {"max_new_tokens": 8, "overlong": {"enabled": True}}},
     r"^rollout\.overlong\.buffer=16 exceeds rollout\.max_new_tokens=8: the penalty would start at -8 tokens, so "
     r"every response pays it \(one token: 0\.562\); DAPO's buffer lies inside the budget: set buffer <= 8$"),
    ({**ENV, "rollout": {"overlong": {"enabled": True}}}, r"^rollout\.overlong\.enabled=true with env: only "
                                                          r"single-turn tasks add the overlong penalty"),
    # never saves a best checkpoint
    ({"train": {"best_metric": "val/accuracy"}}, r"^train\.best_metric: 'val/accuracy' is never logged, so no best "
                                                 r"checkpoint would ever be saved; validation logs: val/avg@k"),
    ({**ENV, "train": {"best_metric": "val/reward_mean"}}, r"^train\.best_metric: 'val/reward_mean' is never logged"),
])
def test_a_bad_setting_is_one_line_naming_key_value_and_what_is_allowed(data, message):
    assert len(errors_of(data).splitlines()) == 1
    with pytest.raises(ConfigError, match=message):
        check_config(load_config(data={**TASK, **data}), machine=False)


def test_every_failed_check_is_reported_at_once():
    lines = errors_of({"algorithm": {"loss_kwargs": {"clip_low": -1}, "advantage_kwargs": {"eps": "x"}},
                       "train": {"best_metric": "val/acc"}}).splitlines()
    assert [line.split(":")[0] for line in lines] == ["algorithm.advantage_kwargs.eps", "algorithm.loss_kwargs",
                                                      "train.best_metric"]


def test_a_bad_setting_stops_the_trainer_before_the_run_directory_is_written(tmp_path):
    cfg = tiny_config(tmp_path, "algorithm.policy_loss=armor", "algorithm.use_ref=true")
    cfg.algorithm.loss_kwargs = {"alpha": 2.0}  # after tiny_config's own checks, as a caller of Trainer may
    with pytest.raises(ConfigError, match=r"^algorithm\.loss_kwargs: armor alpha"):
        Trainer(cfg)
    assert not Path(cfg.run_dir).exists()


@pytest.mark.parametrize("data, warning", [
    ({"optim": {"mini_batches": 100}}, r"^optim\.mini_batches=100 exceeds the 64 rows a step has at most"),
    ({**ENV, "optim": {"mini_batches": 1000}}, r"exceeds the 640 rows .* x env\.max_turns\)"),
    ({"model": {"ref_name": "org/ref"}}, r"^model\.ref_name='org/ref' is never loaded: nothing uses a reference"),
    ({"optim": {"lr": 1000.0}}, r"^optim\.lr=1000\.0 is far above the rates that fine-tune a language model"),
    ({"val": {"every": 200}}, r"^val\.every=200 exceeds train\.steps=100: validation runs only before the first step"),
    ({"methods": {"armor": {"reset": "every", "tau": 500}}}, r"^methods\.armor\.tau=500 exceeds train\.steps=100: the "
                                                             r"reference is never reset"),
    ({"methods": {"armor": {}}, "model": {"ref_name": "org/other"}},
     r"^methods\.armor with model\.ref_name='org/other': ARMOR's reference is the checkpoint"),
    ({"methods": {"eapo": {"prior": "p"}}}, r"^methods\.eapo with algorithm\.policy_loss='ppo': injected tokens"),
])
def test_a_suspicious_legal_setting_is_one_warning_line(data, warning):
    lines = warnings_of(data)
    assert len(lines) == 1 and "\n" not in lines[0]
    assert re.search(warning, lines[0]), lines


def test_a_valid_config_has_no_warnings():
    assert warnings_of({"model": {"ref_name": "org/ref"}, "algorithm": {"kl": {"coef": 0.01}}}) == []
    assert warnings_of({"optim": {"mini_batches": 64}}) == []


class _Refuses(MethodSettings):
    limit: int = 1


def test_every_configured_method_runs_its_class_level_check():
    calls = []

    @register_method
    class Refuses(Method):
        name = "test_refuses"
        Settings = _Refuses

        @classmethod
        def check_config(cls, settings, cfg):
            calls.append((settings.limit, cfg.rollout.group_size))
            if settings.limit > cfg.rollout.group_size:
                raise ConfigError(f"methods.test_refuses.limit={settings.limit} exceeds rollout.group_size")
            return ["methods.test_refuses: a warning"]

    try:
        assert warnings_of({"methods": {"test_refuses": {"limit": 2}}}) == ["methods.test_refuses: a warning"]
        assert "methods.test_refuses.limit=99" in errors_of({"methods": {"test_refuses": {"limit": 99}}})
        assert calls == [(2, 8), (99, 8)]
    finally:
        METHODS.unregister("test_refuses")


def test_a_task_exposes_its_own_check():
    @register_task("test_checked")
    class Checked:
        @staticmethod
        def check_config(*, size: int = 1) -> None:
            if size > 3:
                raise ValueError(f"size must be <= 3, got {size}")

        def __init__(self, *, size: int = 1) -> None:
            raise AssertionError("the check builds nothing")

    try:
        assert errors_of({"task": {"name": "test_checked", "kwargs": {"size": 4}}}) == \
            "task.kwargs: size must be <= 3, got 4"
        check_config(load_config(data={"task": {"name": "test_checked", "kwargs": {"size": 2}}}), machine=False)
    finally:
        unregister_task("test_checked")


def test_config_package_imports_nothing_of_tethers_but_its_errors():
    files = sorted((ROOT / "tether" / "config").glob("*.py"))
    assert {f.stem for f in files} >= {"__init__", "schemas", "loading"}
    for file in files:
        tree = ast.parse(file.read_text())
        imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
        imported += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
        outside = [name for name in imported if name.split(".")[0] == "tether"
                   and name != "tether.errors" and not name.startswith("tether.config.")]
        assert outside == [], file


def test_the_metrics_best_metric_may_name_are_what_validation_logs(tmp_path, tiny_policy):
    from tests.rollout.helpers import agent_config
    from tether.checks.components import VALIDATION_METRICS

    model, tok = tiny_policy
    for kind, cfg in (("task", tiny_config(tmp_path / "task", "val.max_prompts=2")),
                      ("env", agent_config(tmp_path / "env", "env.val_tasks=1"))):
        trainer = Trainer(cfg, policy=copy.deepcopy(model), tokenizer=tok)
        metrics = trainer.collector.validate(trainer.engine, trainer.seed_for("val"))
        logged = [key for key in metrics if key.startswith("val/")]
        assert sorted(logged) == sorted(VALIDATION_METRICS[kind])


def test_a_loss_reading_a_methods_per_token_tensor_needs_that_method(tmp_path):
    """algorithm.policy_loss=eapo without methods.eapo passed validate and crashed train's first step with a
    traceback (LossInputs.tokens['gate_mask'] missing); it is one line now, naming the method that adds it."""
    assert re.fullmatch(r"algorithm\.policy_loss=eapo reads the per-token tensor gate_mask, which no method of this "
                        r"config adds; add methods\.eapo, or use a loss without it \(e\.g\. ppo\)",
                        errors_of({"algorithm": {"policy_loss": "eapo"}}))
    assert not warnings_of({"algorithm": {"policy_loss": "eapo"}, "methods": {"eapo": {"prior": "char-64x1"}}})


def test_an_hf_decode_mode_the_engine_refuses_is_one_line(monkeypatch):
    """rollout.engine_kwargs.decode=fast (or compiled on the CPU) passed validate, then train raised HFEngine's
    ValueError as a traceback once the model had loaded."""
    assert errors_of({"rollout": {"engine_kwargs": {"decode": "fast"}}}) == (
        "rollout.engine_kwargs.decode: HFEngine: unknown decode mode 'fast'; one of: dynamic, static, compiled")
    cpu = {"train": {"device": "cpu"}}
    assert errors_of({"rollout": {"engine_kwargs": {"decode": "compiled"}}, **cpu}).startswith(
        "rollout.engine_kwargs.decode: HFEngine(decode='compiled') needs a CUDA GPU")
    assert warnings_of({"rollout": {"engine_kwargs": {"decode": "static"}}, **cpu}) == []


def test_generation_batches_that_cannot_fill_a_step_are_refused():
    """rollout.gen_batch_prompts=1 with max_gen_batches=1 and prompts_per_step=2 passed validate, then train's first
    step always stopped with RefillShortfall (exit 4): 1 prompt a step can never make 2 groups."""
    rollout = {"prompts_per_step": 2, "gen_batch_prompts": 1, "max_gen_batches": 1}
    assert errors_of({"rollout": rollout}) == (
        "rollout.gen_batch_prompts=1 x rollout.max_gen_batches=1 = 1 prompts a step at most, fewer than "
        "rollout.prompts_per_step=2, so the first step stops; raise either, or set rollout.partial_batches=true")
    assert warnings_of({"rollout": {**rollout, "partial_batches": True}}) == []
    assert warnings_of({"rollout": {**rollout, "max_gen_batches": 2}}) == []


@pytest.mark.parametrize("key, value, spelled", [("dynamic_sampling", True, "true"), ("gen_batch_prompts", 2, "2"),
                                                 ("max_gen_batches", 1, "1"), ("partial_batches", True, "true")])
def test_dapo_refill_settings_with_env_are_refused(key, value, spelled):
    """The agent collector reads none of DAPO's refill settings: with env: they passed validate and did nothing."""
    assert errors_of({**ENV, "rollout": {key: value}}) == (
        f"rollout.{key}={spelled} with env: DAPO's dynamic sampling and refill act on single-turn tasks only; an "
        "agent step plays rollout.prompts_per_step tasks once and never filters or refills, so the setting would do "
        "nothing; leave it unset with env:")
    assert warnings_of({"rollout": {key: value}}) == []  # a task reads it


def test_dapo_refill_settings_at_their_defaults_pass_with_env():
    defaults = {"dynamic_sampling": False, "gen_batch_prompts": None, "max_gen_batches": 4, "partial_batches": False}
    assert warnings_of({**ENV, "rollout": defaults}) == []
    both = errors_of({**ENV, "rollout": {"dynamic_sampling": True, "max_gen_batches": 2}})
    assert both.startswith("rollout.dynamic_sampling=true, rollout.max_gen_batches=2 with env: ")
    assert len(both.splitlines()) == 1


def test_engine_kwargs_of_the_wrong_type_are_one_line():
    """The builders' annotations name ModelConfig for type checkers only, which hid every type: score_rows="abc"
    reached the engine."""
    assert errors_of({"rollout": {"engine_kwargs": {"score_rows": "abc"}}}).startswith(
        "rollout.engine_kwargs.score_rows: 'abc' is not a valid int")
    assert errors_of({"rollout": {"engine": "ray", "engine_kwargs": {"num_actors": "two"}}}).startswith(
        "rollout.engine_kwargs.num_actors: 'two' is not a valid int")


@pytest.mark.parametrize("actors", [0, -1])
def test_a_ray_engine_without_replicas_is_one_line(actors):
    """rollout.engine=ray with engine_kwargs.num_actors=0 passed validate, then train raised RayEngine's ValueError as
    a traceback after the model loaded."""
    assert errors_of({"rollout": {"engine": "ray", "engine_kwargs": {"num_actors": actors}}}) == (
        f"rollout.engine_kwargs.num_actors={actors!r}: the ray engine's replicas, an int >= 1")
