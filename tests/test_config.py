"""Bad configuration stops before any work with one message: key path, value, what is allowed (tether.config reads
the schema; tether.checks checks the rest)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tether.checks import load_checked_config
from tether.config import ConfigError, config_command

ROOT = Path(__file__).resolve().parents[1]
BASE = {"task": {"name": "reasoning_gym", "kwargs": {"dataset": "chain_sum"}}}


def error_of(overrides=(), data=None) -> str:
    with pytest.raises(ConfigError) as info:
        load_checked_config(data={**BASE, **(data or {})}, overrides=list(overrides))
    return str(info.value)


def test_unknown_key_names_its_path():
    msg = error_of(["optim.learning_rate=1e-5"])
    assert "optim.learning_rate: unknown key; did you mean lr?" in msg


def test_an_unknown_key_of_a_list_item_names_its_index_and_the_keys_an_item_allows():
    """``task.rewards: [{fn: ..., wieght: 1}]`` was "task.rewards.0.wieght: unknown key; task.rewards.0 allows: " with
    nothing after it: the list index was looked up as a field, so no section was found."""
    msg = error_of(data={"task": {**BASE["task"], "rewards": [{"fn": "my.rewards:fmt", "wieght": 1}]}})
    assert ("task.rewards[0].wieght: unknown key; did you mean weight? task.rewards[0] allows: fn, kwargs, name, "
            "timeout_s, weight") in msg


def test_wrong_type_names_path_and_value():
    msg = error_of(["rollout.group_size=many"])
    assert "rollout.group_size" in msg and "'many'" in msg


def test_out_of_range_value():
    msg = error_of(["optim.lr=-1"])
    assert "optim.lr" in msg and "greater than 0" in msg


@pytest.mark.parametrize("override, key", [
    ("algorithm.entropy_coef=nan", "algorithm.entropy_coef"), ("algorithm.entropy_coef=.inf", "algorithm.entropy_coef"),
    ("methods.armor.tau=.nan", "methods.armor.tau"),
    ('task.rewards=[{fn: "my.rewards:fmt", weight: .nan}]', "task.rewards[0].weight"),
])
def test_a_number_that_is_not_finite_is_refused_naming_its_key(override, key):
    """NaN and infinity passed every check: a NaN reward weight faulted every row, a NaN entropy coefficient stopped
    the run later on non-finite losses ("check the rewards or lower optim.lr")."""
    assert f"{key}: Input should be a finite number" in error_of([override])


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_a_task_reward_that_is_not_finite_is_refused_naming_it(value):
    from tether.checks import check_config

    cfg = load_checked_config(data=BASE, overrides=[f"task.kwargs.reward_wrong={value}"])
    with pytest.raises(ConfigError, match=r"^task.kwargs: reward_wrong=-?(nan|inf) is not a finite number$"):
        check_config(cfg)


@pytest.mark.parametrize("value", ["gpu", "cuda:x", "cuda:1.5", "cuda:-1", "CUDA", "mps", "cuda0"])
def test_train_device_names_the_allowed_forms(value):
    msg = error_of([f"train.device={value}"])
    assert "train.device" in msg and "auto, cpu, cuda or cuda:N" in msg and repr(value) in msg


@pytest.mark.parametrize("value", ["auto", "cpu", "cuda", "cuda:0", "cuda:12"])
def test_train_device_takes_every_form_without_looking_at_the_machine(value):
    assert load_checked_config(data={**BASE}, overrides=[f"train.device={value}"]).train.device == value
    assert load_checked_config(data={**BASE}).train.device == "auto"


def test_literal_choices_are_listed():
    msg = error_of(["algorithm.loss_agg=token-sum"])
    assert "algorithm.loss_agg" in msg and "seq-mean-token-mean" in msg


def test_unknown_registered_names_list_the_known_ones():
    assert "grpo" in error_of(["algorithm.advantage=gae"])
    assert "ppo" in error_of(["algorithm.policy_loss=vanilla"])


def test_unknown_loss_setting_lists_allowed_settings():
    msg = error_of(["algorithm.loss_kwargs={clip: 0.2}"])
    assert "algorithm.loss_kwargs.clip" in msg and "clip_low" in msg
    # a misspelt setting gets the guess a misspelt config key gets
    assert error_of(["algorithm.loss_kwargs={clip_hgh: 0.3}"]) == ("algorithm.loss_kwargs.clip_hgh: unknown setting; "
                                                                   "did you mean clip_high or clip_low? allowed: "
                                                                   "clip_low, clip_high, dual_clip")


def test_unknown_method_and_workload_rules():
    assert "methods.nosuch" in error_of(data={"methods": {"nosuch": {}}})
    assert "exactly one of 'task'" in error_of(data={"env": {"name": "sokoban"}})


def test_override_syntax_errors():
    for bad in ("optim.lr", "optim..lr=1", "=3"):
        with pytest.raises(ConfigError):
            load_checked_config(data=dict(BASE), overrides=[bad])


REWARDS = [{"fn": "my.rewards:fmt", "weight": 0.1}, {"fn": "tether.rewards:Judge", "kwargs": {"model": "m"}}]


@pytest.mark.parametrize("override, whole", [
    # the config's own list, with the change made in it: what to paste
    ("task.rewards[0].weight=0.5", """task.rewards="[{fn: 'my.rewards:fmt', weight: 0.5}, {fn: """
                                   """'tether.rewards:Judge', kwargs: {model: m}}]\""""),
    ("task.rewards.1.kwargs.timeout_s=5", """task.rewards="[{fn: 'my.rewards:fmt', weight: 0.1}, {fn: """
                                          """'tether.rewards:Judge', kwargs: {model: m, timeout_s: 5}}]\""""),
    # no such item in the config: the form
    ("task.rewards[2].weight=0.5", "task.rewards='[{weight: 0.5, ...}, ...]'"),
    ("imports[0]=x.py", "imports='[x.py, ...]'"),
])
def test_a_list_item_override_says_to_give_the_whole_list(override, whole):
    """``task.rewards[0].weight=0.5`` was "unknown key; did you mean rewards?": the dotted syntax has no index."""
    data = {"task": {**BASE["task"], "rewards": REWARDS}}
    msg = error_of([override], data=data)
    assert msg == (f"override {override!r}: {whole.split('=')[0]} is a list, and the command line cannot set one item "
                   f"of it: give the whole list, e.g. {whole}")
    assert REWARDS[0]["weight"] == 0.1  # the example is a copy


def test_the_whole_list_the_message_gives_loads():
    from tether.config import load_config

    data = {"task": {**BASE["task"], "rewards": REWARDS[:1]}}
    whole = error_of(["task.rewards[0].weight=0.5"], data=data).split("e.g. ", 1)[1]
    key, quoted = whole.split("=", 1)
    cfg = load_config(data=data, overrides=[f"{key}={quoted[1:-1]}"])  # as the shell passes it, unquoted
    assert [(r.fn, r.weight) for r in cfg.task.rewards] == [("my.rewards:fmt", 0.5)]


@pytest.mark.parametrize("verl, tether", [("low_var_kl", "k3"), ("kl", "k1"), ("mse", "k2")])
def test_verls_kl_estimator_names_get_tethers(verl, tether):
    msg = error_of([f"algorithm.kl.estimator={verl}"])
    assert (f"algorithm.kl.estimator: Input should be 'k1', 'k2' or 'k3' (got '{verl}'); {verl} is verl's name for "
            f"{tether}: write algorithm.kl.estimator={tether} (verl's kl_loss_type and kl_penalty: kl = k1, mse = k2, "
            "low_var_kl = k3)") in msg
    assert "tether does not have" in error_of(["algorithm.kl.estimator=abs"])
    assert "verl" not in error_of(["algorithm.kl.estimator=k5"])


def test_overrides_parse_yaml_values():
    cfg = load_checked_config(data=dict(BASE), overrides=["optim.lr=3e-4", 'rollout.stop=["\\n\\n"]',
                                                  "task.kwargs.dataset=chain_sum"])
    assert cfg.optim.lr == 3e-4 and cfg.rollout.stop == ["\n\n"] and cfg.task.kwargs["dataset"] == "chain_sum"



@pytest.mark.parametrize("value,read", [("true", True), ("false", False), ("auto", "auto"), ("True", True)])
def test_gradient_checkpointing_keeps_its_booleans_and_adds_auto(value, read):
    assert load_checked_config(data=dict(BASE)).train.gradient_checkpointing == "auto"
    cfg = load_checked_config(data=dict(BASE), overrides=[f"train.gradient_checkpointing={value}"])
    got = cfg.train.gradient_checkpointing
    assert got == read and type(got) is type(read)
    assert "train.gradient_checkpointing" in error_of(["train.gradient_checkpointing=sometimes"])


SHIPPED = sorted((ROOT / "configs").rglob("*.yaml"))


@pytest.mark.parametrize("path", [p for p in SHIPPED if p.stem != "protocol"], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_config_validates(path):
    """Each against the schema of its command: the one its first line names (`# tether sft ...`)."""
    load_checked_config(path, command=config_command(path))


@pytest.mark.parametrize("name", ["quickstart.yaml", "armor/stage1_dapo.yaml", "agents/frozenlake_grpo.yaml"])
def test_shipped_configs_validate_with_overlong_filtering(name):
    """algorithm.mask_truncated on a single-turn run, beside DAPO's soft punishment, and on an agent run (per turn)."""
    path = ROOT / "configs" / name
    assert not load_checked_config(path, command=config_command(path)).algorithm.mask_truncated  # off as shipped
    cfg = load_checked_config(path, overrides=["algorithm.mask_truncated=true"], command=config_command(path))
    assert cfg.algorithm.mask_truncated


def test_no_two_shipped_configs_share_a_run_dir():
    """Run one after the other as shipped, two configs writing one run_dir would have the second refuse to resume
    the first's run (different settings): found by scripts/run_all_configs.sh (issue #43)."""
    import yaml

    owners: dict[str, list[str]] = {}
    for path in SHIPPED:
        run_dir = (yaml.safe_load(path.read_text()) or {}).get("run_dir") if path.stem != "protocol" else None
        if run_dir:
            owners.setdefault(run_dir, []).append(str(path.relative_to(ROOT)))
    assert len(owners) > 20
    assert {d: paths for d, paths in owners.items() if len(paths) > 1} == {}


@pytest.mark.parametrize("path", [p for p in SHIPPED if p.stem == "protocol"], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_protocol_passes_the_checks_made_before_any_run(path, monkeypatch):
    from tether.lab.experiment import check_protocol, load_protocol

    monkeypatch.chdir(ROOT)  # arm configs are named relative to the repository root
    check_protocol(load_protocol(path), inputs=False)  # the checkpoints they read are runs/, not in a checkout


def test_fsdp2_precision_settings_need_the_fsdp2_strategy():
    msg = error_of(["distributed.param_dtype=bfloat16"])
    assert "distributed.param_dtype needs distributed.strategy=fsdp2" in msg
    assert "distributed.strategy" in error_of(["distributed.strategy=fsdp"])
    cfg = load_checked_config(data=dict(BASE),
                              overrides=["distributed.strategy=fsdp2", "distributed.param_dtype=bfloat16"])
    assert cfg.distributed.param_dtype == "bfloat16" and cfg.distributed.reduce_dtype is None


GPU_PRESETS = sorted((ROOT / "configs" / "gpu").glob("*.yaml"))


def test_gpu_presets_cover_the_papers_settings():
    assert {p.stem for p in GPU_PRESETS} == {
        "grpo_qwen2.5-math-7b", "eapo_qwen2.5-math-7b", "seed_sft_qwen2.5-3b_alfworld", "seed_qwen2.5-3b_alfworld",
        "seed_sft_qwen2.5-7b_alfworld", "seed_qwen2.5-7b_alfworld", "grpo_qwen2.5-vl-3b_sokoban",
        "seed_sft_qwen2.5-vl-3b_sokoban",
        "grpo_qwen2.5-vl-3b_ezpoints", "seed_qwen2.5-vl-3b_sokoban", "seed_qwen2.5-vl-3b_ezpoints"}


@pytest.mark.parametrize("path", GPU_PRESETS, ids=lambda p: p.stem)
def test_gpu_preset_uses_vllm_unless_its_method_intervenes(path):
    command = "tether seed-sft" if path.stem.startswith("seed_sft") else "tether train"
    cfg = load_checked_config(path, command=command.split()[1])
    assert path.read_text().startswith(f"# {command} configs/gpu/{path.name}\n")
    if path.stem.startswith("eapo"):
        assert cfg.rollout.engine == "hf"  # EAPO's prior intervenes at every step
    elif not path.stem.startswith("seed_sft"):  # stage 1 rolls out with the in-process engine
        assert cfg.rollout.engine == "vllm"
    if "math" in path.stem:  # group 16, responses up to 8k
        assert (cfg.rollout.group_size, cfg.rollout.max_new_tokens) == (16, 8192)


def test_overrides_leave_the_callers_dict_unchanged():
    data = {"task": {"name": "reasoning_gym", "kwargs": {"dataset": "chain_sum"}}}
    cfg = load_checked_config(data=data, overrides=["task.kwargs.dataset=basic_arithmetic", "optim.lr=0.5"])
    assert cfg.task.kwargs["dataset"] == "basic_arithmetic" and cfg.optim.lr == 0.5
    assert data == {"task": {"name": "reasoning_gym", "kwargs": {"dataset": "chain_sum"}}}


@pytest.mark.parametrize("data, message", [
    ({"task": {"name": "nope"}}, r"^task\.name: unknown task 'nope'; known: .*reasoning_gym"),
    ({"task": {"name": "reasoning_gym", "kwargs": {"dataset": "chain_sum", "bogus": 1}}},
     r"^task\.kwargs: task 'reasoning_gym' got unknown argument\(s\) bogus; allowed: .*dataset"),
    ({"task": {"name": "reasoning_gym"}}, r"^task\.kwargs: task 'reasoning_gym' is missing required .*dataset"),
    ({"task": None, "env": {"name": "nope"}},
     r"^env\.name: unknown env 'nope'; known: .*scripted.*, or module:Class of your own$"),
    ({"task": None, "env": {"name": "scripted", "kwargs": {"bogus": 1}}},
     r"^env\.kwargs: env 'scripted' got unknown keyword\(s\) bogus; allowed: "),
    ({"rollout": {"group_size": 1}}, r"^rollout\.group_size: 1 gives every row an advantage of 0 under "
                                     r"algorithm\.advantage=grpo"),
    ({"rollout": {"group_size": 1}, "algorithm": {"advantage": "rloo"}}, r"algorithm\.advantage=rloo"),
    ({"train": {"best_metric": "train/reward_mean"}}, r"^train\.best_metric: 'train/reward_mean' is not a "
                                                      r"validation metric"),
])
def test_workload_names_and_combinations_that_cannot_learn_stop_before_work(data, message):
    with pytest.raises(ConfigError, match=message):
        load_checked_config(data={**BASE, **data})


def test_a_group_of_one_is_fine_where_the_advantage_does_not_need_a_group():
    load_checked_config(data={**BASE, "rollout": {"group_size": 1}, "algorithm": {"advantage": "episode"}})


def test_a_yaml_syntax_error_names_file_line_and_column(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("task:\n  name: parity\nrollout: {group_size: 4\n")
    with pytest.raises(ConfigError, match=rf"^{path}:4:1: YAML syntax error: expected ',' or '}}'"):
        load_checked_config(path)


AGENT = {"task": None, "env": {"name": "scripted"}, "algorithm": {"advantage": "episode"}}
EAPO = {"methods": {"eapo": {"prior": "p"}}}


@pytest.mark.parametrize("data, message", [
    ({"algorithm": {"advantage": "gigpo"}}, r"^algorithm\.advantage=gigpo needs the per-row obs_keys and "
     r"step_returns, which nothing in this config produces \(obs_keys comes from env; step_returns comes from env\); "
     r"allowed here: dr_grpo, episode, grpo, qae, rloo$"),
    ({"algorithm": {"advantage": "clean_baseline"}}, r"^algorithm\.advantage=clean_baseline needs the per-row "
     r"injected, .*\(injected comes from methods\.eapo\); allowed here: dr_grpo, episode, grpo, qae, rloo$"),
    ({**AGENT, "algorithm": {"advantage": "clean_baseline"}}, r"allowed here: dr_grpo, episode, gigpo, grpo, qae, "
     r"rloo$"),
])
def test_an_estimator_needing_a_tag_nothing_produces_is_refused(data, message):
    with pytest.raises(ConfigError, match=message):
        load_checked_config(data={**BASE, **data})


def test_estimators_with_their_tags_producers_are_accepted():
    gigpo = load_checked_config(data={**BASE, **AGENT, "algorithm": {"advantage": "gigpo"}})
    assert gigpo.algorithm.advantage == "gigpo"
    eapo = {"advantage": "clean_baseline", "policy_loss": "eapo"}
    cfg = load_checked_config(data={**BASE, **EAPO, "algorithm": eapo})
    assert cfg.algorithm.advantage == "clean_baseline"


@pytest.mark.parametrize("old, new", [
    ({**AGENT, "env": {"name": "scripted", "step_grouping": True, "step_advantage_w": 0.5},
      "algorithm": {"advantage": "episode", "advantage_kwargs": {"mode": "mean_norm"}}},
     {"advantage": "gigpo", "advantage_kwargs": {"mode": "mean_norm", "step_weight": 0.5}}),
    ({**AGENT, "env": {"name": "scripted", "step_grouping": False, "step_advantage_w": 0.5}},
     {"advantage": "episode", "advantage_kwargs": {}}),
    ({"methods": {"eapo": {"prior": "p", "advantage_grouping": "non_injected"}},
      "algorithm": {"advantage": "grpo", "advantage_kwargs": {"eps": 0.01}}},
     {"advantage": "clean_baseline", "advantage_kwargs": {"eps": 0.01}}),
    ({"methods": {"eapo": {"prior": "p", "advantage_grouping": "non_injected"}}, "algorithm": {"advantage": "dr_grpo"}},
     {"advantage": "clean_baseline", "advantage_kwargs": {"scale": False}}),
    ({"methods": {"eapo": {"prior": "p", "advantage_grouping": "all"}}}, {"advantage": "grpo", "advantage_kwargs": {}}),
])
def test_the_old_advantage_keys_are_read_as_the_estimator_with_a_warning(old, new):
    with pytest.warns(FutureWarning, match="removed in tether 0.2.0"):
        cfg = load_checked_config(data={**BASE, **old})
    assert {"advantage": cfg.algorithm.advantage, "advantage_kwargs": cfg.algorithm.advantage_kwargs} == new


@pytest.mark.parametrize("data, message", [
    ({**AGENT, "env": {"name": "scripted", "step_grouping": True}, "algorithm": {"advantage": "grpo"}},
     r"^env\.step_grouping=true goes with algorithm\.advantage episode, got grpo; it now means "
     r"algorithm\.advantage=gigpo"),
    # EAPO's clean baseline used to overwrite the advantages after GiGPO's step term, dropping it
    ({**AGENT, "env": {"name": "scripted", "step_grouping": True},
      "methods": {"eapo": {"prior": "p", "advantage_grouping": "non_injected"}}},
     r"^methods\.eapo\.advantage_grouping=non_injected goes with algorithm\.advantage grpo or dr_grpo, got gigpo"),
])
def test_old_advantage_keys_that_never_worked_together_are_refused(data, message):
    with pytest.raises(ConfigError, match=message):
        load_checked_config(data={**BASE, **data})


def test_a_dumped_config_loads_back_with_its_integer_keys(tmp_path):
    """A run's config.yaml is read again by `tether eval --config` and on resume: a task argument keyed by ints (the
    addition task's carry weights) must come back as ints, or the task's typed arguments refuse it."""
    from tether.checks.kwargs import check_kwarg_types
    from tether.config import dump_config, load_config
    from tether.tasks.addition import AdditionTask

    cfg = load_config("configs/lab/eapo3/grpo.yaml")
    saved = tmp_path / "config.yaml"
    saved.write_text(dump_config(cfg))
    again = load_config(saved)
    assert again.task.kwargs["overflow"] == {0: 0.5, 1: 0.5}
    assert again.model_dump() == cfg.model_dump()
    check_kwarg_types(AdditionTask, again.task.kwargs, "task.kwargs")  # raises on {'0': 0.5}


@pytest.mark.parametrize("written,value", [("1e-6", 1e-6), ("1E-6", 1e-6), ("5e+1", 50.0), ("2.5e3", 2500.0)])
def test_a_float_in_exponent_notation_is_a_float_in_a_free_form_mapping(tmp_path, written, value):
    """PyYAML reads YAML 1.1, where `1e-6` (no dot) and `1.0e5` (unsigned exponent) are strings: docs/config.md's own
    example algorithm.advantage_kwargs={eps: 1e-6} was refused ('1e-6' is not a valid float), from a file too."""
    cfg = load_checked_config(data=dict(BASE), overrides=[f"algorithm.advantage_kwargs={{eps: {written}}}"])
    assert cfg.algorithm.advantage_kwargs == {"eps": value}
    path = tmp_path / "config.yaml"
    path.write_text(f"task: {{name: reasoning_gym, kwargs: {{dataset: chain_sum}}}}\nalgorithm:\n  "
                    f"advantage_kwargs: {{eps: {written}}}\n")
    assert load_checked_config(path).algorithm.advantage_kwargs == {"eps": value}


def test_a_string_that_reads_as_an_exponent_float_stays_a_string_through_config_yaml(tmp_path):
    """config.yaml (tether eval --config, resume) quotes a string the loader would read as a float."""
    from tether.config import dump_config, load_config

    cfg = load_config(data={**BASE, "run_dir": "runs/x", "task": {"name": "reasoning_gym", "kwargs": {
        "dataset": "chain_sum", "tag": "1e-3"}}})
    saved = tmp_path / "config.yaml"
    saved.write_text(dump_config(cfg))
    assert load_config(saved).task.kwargs["tag"] == "1e-3"


# YAML 1.2's core schema, where PyYAML's YAML 1.1 read 83 (octal), 750 (base 60), booleans, None only in lower case
# and a date; the value each reads as in a free-form mapping, and its type
CORE_SCHEMA_VALUES = [("0123", 123), ("0o17", 15), ("0x1F", 31), ("-0042", -42), ("1_000", 1000), ("12:30", "12:30"),
                      ("yes", "yes"), ("no", "no"), ("on", "on"), ("off", "off"), ("TRUE", True), ("False", False),
                      ("y", "y"), ("NULL", None), ("~", None), ("+.5", 0.5), ("1e-6", 1e-6),
                      ("2024-01-05", "2024-01-05")]


@pytest.mark.parametrize("written,value", CORE_SCHEMA_VALUES, ids=[w for w, _ in CORE_SCHEMA_VALUES])
def test_a_free_form_mapping_reads_yaml_1_2_core_schema_values_from_a_file_and_an_override(tmp_path, written, value):
    """env.kwargs {start: 0123} gave the env 83, {at: 12:30} 750 and {verbose: yes} True (PyYAML reads YAML 1.1)."""
    from tether.config import load_config

    path = tmp_path / "config.yaml"
    path.write_text(f"task: {{name: reasoning_gym, kwargs: {{dataset: chain_sum, x: {written}}}}}\n")
    for cfg in (load_config(path), load_config(data=BASE, overrides=[f"task.kwargs.x={written}"])):
        got = cfg.task.kwargs["x"]
        assert got == value and type(got) is type(value), (written, got)


def test_strings_that_look_like_numbers_or_booleans_stay_strings_through_config_yaml(tmp_path):
    """config.yaml is read again on resume and by `tether eval --config`: a string the loader would read as another
    type is quoted (0o17 and +.5 are strings in YAML 1.1, numbers here), the values of either schema come back."""
    import yaml

    from tether.config import dump_config, load_config
    from tether.trainer.rundir import check_resume_settings

    strings = {f"s{i}": written for i, (written, _) in enumerate(CORE_SCHEMA_VALUES)}
    values = {f"v{i}": value for i, (_, value) in enumerate(CORE_SCHEMA_VALUES)}
    cfg = load_config(data={**BASE, "run_dir": "runs/x", "task": {"name": "reasoning_gym", "kwargs": {
        "dataset": "chain_sum", **strings, **values}}})
    saved = tmp_path / "config.yaml"
    saved.write_text(dump_config(cfg))
    again = load_config(saved)
    assert again.task.kwargs == {"dataset": "chain_sum", **strings, **values}
    assert {k: type(v) for k, v in again.task.kwargs.items()} == {k: type(v) for k, v in cfg.task.kwargs.items()}
    assert yaml.safe_load(saved.read_text())["task"]["kwargs"] == again.task.kwargs  # YAML 1.1 reads it alike
    check_resume_settings(again, saved)


def test_a_config_yaml_written_before_the_core_schema_reads_as_it_did(tmp_path):
    """A run directory's config.yaml from a tether that read YAML 1.1 (its dumper: yaml.safe_dump, which quotes the
    strings YAML 1.1 reads as something else) resumes with the same settings; a config file whose free-form value
    now reads otherwise is refused on resume, naming the key (the run would be another experiment)."""
    import yaml

    from tether.config import load_config
    from tether.start import RunDirError
    from tether.trainer.rundir import check_resume_settings

    def old_run(**kwargs: object) -> Path:
        saved = tmp_path / "config.yaml"
        saved.write_text(yaml.safe_dump(load_config(data={**BASE, "run_dir": "runs/x", "task": {
            "name": "reasoning_gym", "kwargs": {"dataset": "chain_sum", **kwargs}}}).model_dump(mode="json")))
        return saved

    kwargs = {"octal": 83, "base60": 750, "flag": True, "strings": ["yes", "0123", "12:30", "~", "0x1F"],
              "when": "2024-01-05", "none": None, "eps": 1e-6}
    old = load_config(old_run(**kwargs))
    assert old.task.kwargs == {"dataset": "chain_sum", **kwargs}
    check_resume_settings(old, old_run(**kwargs))
    config = tmp_path / "user.yaml"  # the file the old run read `0123` from, as 83
    config.write_text("run_dir: runs/x\ntask: {name: reasoning_gym, kwargs: {dataset: chain_sum, octal: 0123}}\n")
    with pytest.raises(RunDirError, match=r"^task\.kwargs\.octal: 123 differs from 83 in the run being resumed"):
        check_resume_settings(load_config(config), old_run(octal=83))


def test_an_older_tethers_config_yaml_resumes_with_missing_keys_at_their_defaults_and_moved_keys_moved(tmp_path):
    """A run's config.yaml from a tether older than a setting lacks its key. It read as None, so every resume after
    an upgrade was refused ("algorithm.loss_kwargs: {} differs from None"); it now stands for the schema's default
    (a method's setting for the method's), which is what the older tether ran with, and only another value is
    refused. A key that moved since (env.step_grouping: algorithm.advantage=gigpo) is read at its new place,
    without the deprecation warning meant for the user's own config."""
    import warnings

    import yaml

    from tether.config import dump_config, load_config
    from tether.start import RunDirError
    from tether.trainer.rundir import check_resume_settings

    saved = tmp_path / "config.yaml"
    data = {**BASE, "run_dir": "runs/x", "methods": {"armor": {"ref_n": 4}}}
    old = yaml.safe_load(dump_config(load_config(data=data)))
    del old["algorithm"]["loss_kwargs"], old["algorithm"]["kl"], old["rollout"]["top_k"]
    old["methods"]["armor"] = {}  # written before ref_n was a setting
    saved.write_text(yaml.safe_dump(old))
    check_resume_settings(load_config(data=data), saved)
    for override, refusal in [("algorithm.kl.coef=0.1", r"algorithm\.kl\.coef: 0\.1 differs from 0\.0 "),
                              ("rollout.top_k=5", r"rollout\.top_k: 5 differs from 0 "),
                              ("methods.armor.ref_n=8", r"methods\.armor\.ref_n: 8 differs from 4 "),
                              ("algorithm.loss_kwargs={clip_ratio: 0.3}",
                               r"algorithm\.loss_kwargs\.clip_ratio: 0\.3 differs from None ")]:
        with pytest.raises(RunDirError, match="^" + refusal + "in the run being resumed"):
            check_resume_settings(load_config(data=data, overrides=[override]), saved)

    gigpo = {"run_dir": "runs/x", "env": {"name": "frozenlake"},
             "algorithm": {"advantage": "gigpo", "advantage_kwargs": {"step_weight": 0.5}}}
    old = yaml.safe_load(dump_config(load_config(data=gigpo)))
    old["algorithm"].update(advantage="episode", advantage_kwargs={})
    old["env"].update(step_grouping=True, step_advantage_w=0.5)  # the keys before one estimator per run
    saved.write_text(yaml.safe_dump(old))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_resume_settings(load_config(data=gigpo), saved)
    assert yaml.safe_load(saved.read_text()) == old  # read, not rewritten
    with pytest.raises(RunDirError, match=r"^algorithm\.advantage_kwargs\.step_weight: 0\.25 differs from 0\.5 "):
        check_resume_settings(load_config(data=gigpo, overrides=["algorithm.advantage_kwargs.step_weight=0.25"]),
                              saved)
