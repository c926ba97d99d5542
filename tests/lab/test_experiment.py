"""``tether experiment``: checks before any run, a real run of arms x seeds, resume, the report (tether/lab)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from scipy import stats as scipy_stats

from tether.config import ConfigError
from tether.lab import calibration, experiment, report, stats
from tether.lab.calibration import measure
from tether.lab.experiment import check_protocol, load_protocol, pool_experiments, run_experiment
from tether.lab.protocol import run_dir
from tether.tasks import TaskItem, register_task, unregister_task

CLEAN = {"commit": "c" * 40, "clean": True, "changed": []}


@pytest.fixture(autouse=True)
def char_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TETHER_CACHE", str(tmp_path / "cache"))  # subprocesses inherit it
    # the tests' own checkout may have uncommitted changes: the dirty-tree rule has its own tests
    monkeypatch.setattr(experiment, "code_state", lambda root=None: dict(CLEAN))


def write_config(tmp_path, name="arm.yaml", val=None, model=None, **task_kwargs):
    cfg = {"model": model or {"name": "char-64x1"},
           "task": {"name": "addition", "kwargs": {"digits": 1, "train_size": 8, "val_size": 6, "report_size": 6,
                                                   **task_kwargs}},
           "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
           "optim": {"lr": 1e-3, "micro_batch_size": 4}, "val": val or {"every": 1, "samples": 1},
           "train": {"steps": 2, "device": "cpu"}, "logging": {"tensorboard": False, "progress": False}}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def write_protocol(tmp_path, config, **changes):
    protocol = {"name": "smoke", "question": "does a higher lr change accuracy?", "seeds": [0, 1],
                "baseline": "low", "run_root": str(tmp_path / "study"), "parallel": 2,
                "test_size": {"delta": 0.1, "derivation": "a smoke test's number"},
                "calibration": {"kind": "positive_control", "arm": "high", "min_movement": 0.1,
                                "why": "the higher rate must move the endpoint at all"},
                "arms": {"low": {"config": str(config)},
                         "high": {"config": str(config), "overrides": ["optim.lr=1e-2"]}},
                "endpoint": {"metric": "val/avg@k", "split": "report", "at": "best"},
                "secondary": ["val/response_length", "val/mode/direct/share"], **changes}
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "protocol.yaml"
    path.write_text(yaml.safe_dump(protocol))
    return path


@pytest.fixture
def overlapping_task():
    @register_task("overlapping_test_task")
    class Overlapping:
        name, system_prompt = "overlapping", None

        def __init__(self) -> None:
            self.train = [TaskItem("1+1", "2"), TaskItem("2+2", "4")]
            self.val = [TaskItem("2+2", "4")]

        def score(self, item, text):  # pragma: no cover - never scored
            raise AssertionError

    yield
    unregister_task("overlapping_test_task")


@pytest.mark.parametrize(("change", "match"), [
    ({"seeds": [0, 1, 0]}, r"seed\(s\) \[0\] appear more than once"),
    ({"baseline": "nope"}, "baseline 'nope' is not an arm"),
    ({"endpoint": {"metric": "val/accuracy", "split": "report"}}, "no run logs the metric 'val/accuracy'"),
    ({"secondary": ["train/loss"]}, "no run logs the metric 'train/loss'"),
    ({"secondary": ["val/mode/other/share"]}, "no run logs the metric 'val/mode/other/share'"),
    ({"endpoint": {"split": "val", "at": "best"}}, "would report on the split that chose the checkpoint"),
    ({"endpoint": {"split": "test"}}, "has no split 'test'"),
    # a metric whose larger value is not better: a longer response would be labelled "better"
    ({"endpoint": {"metric": "val/response_length", "split": "report"}, "secondary": []},
     "endpoint.metric=val/response_length: a larger value is not better"),
    ({"arms": {"low": {"config": "ARM", "overrides": ["train.best_metric=val/response_length"]},
               "high": {"config": "ARM"}}},
     "arm 'low': train.best_metric=val/response_length is not higher-is-better"),
    # checkpoints/best chosen on the endpoint split, or the endpoint read on the selection split
    ({"arms": {"low": {"config": "ARM", "overrides": ["val.split=report"]}, "high": {"config": "ARM"}}},
     "arm 'low': val.split=report makes training validate, and choose checkpoints/best, on the endpoint split"),
    ({"endpoint": {"split": "report", "overrides": ["val.samples=2", "val.split=val"]}},
     "endpoint.overrides: 'val.split=val' sets the split the endpoint is read on; set endpoint.split instead"),
    # a section holding the split (the exact keys alone were compared), the model, a key eval refuses
    ({"endpoint": {"split": "report", "overrides": ["val={every: 1, samples: 1, split: val}"]}},
     "endpoint.overrides: 'val={every: 1, samples: 1, split: val}' sets the split the endpoint is read on"),
    ({"endpoint": {"split": "report", "overrides": ["model.name=tiny-64x2"]}},
     "endpoint.overrides: 'model.name=tiny-64x2' sets the model; the endpoint is read from each run's checkpoint"),
    ({"endpoint": {"split": "report", "overrides": ["val.samplez=8"]}},
     r"endpoint.overrides \(the evaluation of arm 'high'\): invalid configuration:\n  val.samplez: unknown key; "
     "did you mean samples"),
    ({"endpoint": {"split": "report", "overrides": ["val.samples"]}},
     "endpoint.overrides: override 'val.samples' is not of the form key.path=value"),
    # the endpoint on the prompts the arms trained on (train was never checked against itself)
    ({"endpoint": {"split": "train", "at": "final"}}, "endpoint.split=train would report on the prompts the arms "
     "trained on"),
    ({"arms": {"low": {"config": "missing.yaml"}, "high": {"config": "ARM"}}},
     "arm 'low' \\(missing.yaml\\): config file 'missing.yaml' does not exist \\(relative to the working directory /"),
    ({"arms": {"low": {"config": "ARM", "overrides": ["optim.lr=-1"]}, "high": {"config": "ARM"}}},
     r"arm 'low' \(.*\): invalid configuration:\n  optim.lr"),
    ({"calibration": {"kind": "positive_control", "min_movement": 0.1, "why": "w"}},
     "positive_control needs calibration.arm"),
    ({"calibration": {"kind": "positive_control", "arm": "nope", "min_movement": 0.1, "why": "w"}},
     "calibration.arm 'nope' is not an arm"),
    ({"calibration": {"kind": "positive_control", "arm": "high", "min_movement": 0.05, "why": "w"}},
     r"min_movement=0.05 is below test_size.delta \(0.1\)"),
    ({"calibration": {"kind": "fall", "min_movement": 0.15, "why": "w"}},
     r"below 2 x test_size.delta: the test size may be at most half the fall \(0.2\)"),
    ({"test_size": {"delta": 0.1, "derivation": "d", "paper_relative_gain": 0.16}}, "go together"),
    ({"test_size": {"delta": 0.1, "derivation": "d", "paper_relative_gain": 0.16, "paper_rows": "Table 2",
                    "setting_baseline": 0.3}}, r"paper_relative_gain x setting_baseline = 0.0480"),
    ({"test_size": {"delta": 0.1}}, "test_size.derivation: Field required"),
    ({"endpoint": {"split": "report", "at": "final"}},
     "calibrated at its last step, which val.every=3 does not validate"),
    # a rise is read at the last step whatever endpoint.at says (tether/lab/protocol.py, Calibration.end_at)
    ({"endpoint": {"split": "report", "at": "best", "start_selectable": True},
      "calibration": {"kind": "rise", "min_movement": 0.1, "why": "w"}},
     "calibrated at its last step, which val.every=3 does not validate"),
    ({"arms": {"low": {"config": "ARM", "seeds": [0]}, "high": {"config": "ARM"}}},
     r"arms.low.seeds: the baseline 'low' runs every seed \(its comparisons are paired\)"),
    ({"arms": {"low": {"config": "ARM"}, "high": {"config": "ARM", "seeds": [1]}}},
     "arms.high.seeds: the compared arm 'high' runs every seed"),
    ({"comparisons": ["high"], "arms": {"low": {"config": "ARM"}, "high": {"config": "ARM"},
                                        "extra": {"config": "ARM", "seeds": [1, 5]}}},
     r"arms.extra.seeds: \[1, 5\] must be distinct seeds of the protocol's \[0, 1\]"),
    ({"comparisons": ["high"], "arms": {"low": {"config": "ARM"}, "high": {"config": "ARM"},
                                        "extra": {"config": "ARM", "seeds": [1]}},
      "calibration": {"kind": "positive_control", "arm": "extra", "min_movement": 0.1, "why": "w"}},
     r"arms.extra.seeds leave out calibration seed\(s\) \[0\]"),
    # the baseline against itself, or an arm twice, still counted in Holm's family
    ({"comparisons": ["low", "high"]}, "comparisons name the baseline 'low', which every arm is compared with"),
    ({"comparisons": ["high", "high"]}, r"comparisons name arm\(s\) \['high'\] more than once"),
    # the advice was to widen arms.high.seeds, which a compared arm may not set
    ({"calibration": {"kind": "positive_control", "arm": "high", "min_movement": 0.1, "why": "w", "seeds": [7]}},
     r"calibration.seeds \[7\] are not among the protocol's seeds \[0, 1\]"),
])
def test_bad_protocols_stop_before_any_run(tmp_path, change, match):
    config = write_config(tmp_path)
    if change.get("endpoint", {}).get("at") == "final" or change.get("calibration", {}).get("kind") == "rise":
        config = write_config(tmp_path, val={"every": 3, "samples": 1})
    if "arms" in change:
        for arm in change["arms"].values():
            arm["config"] = arm["config"].replace("ARM", str(config))
    path = write_protocol(tmp_path, config, **change)
    with pytest.raises(ConfigError, match=match):
        check_protocol(load_protocol(path))
    assert not (tmp_path / "study").exists()


def nct_power(effect, sd, n):
    """The two-sided paired t test's power at 5% over ``n`` seeds, from scipy's noncentral t."""
    crit = scipy_stats.t.ppf(0.975, n - 1)
    noncentrality = effect * math.sqrt(n) / sd
    return scipy_stats.nct.sf(crit, n - 1, noncentrality) + scipy_stats.nct.cdf(-crit, n - 1, noncentrality)


def test_registration_refuses_seeds_whose_mde_at_a_pilot_spread_exceeds_delta(tmp_path):
    """Nothing compared the seeds with the test size: every committed 5-seed study's MDE is 1.5 to 8.5 times its
    delta (armor_smollm2: 0.254 against 0.03), registered without a word. With a spread measured before
    registration the check reads the MDE and names the seeds that reach delta; without one it says so."""
    config = write_config(tmp_path)
    size = {"delta": 0.1, "derivation": "a smoke test's number", "pilot_sd": 0.05, "pilot_source": "a pilot"}
    assert nct_power(0.1, 0.05, 5) >= 0.8 > nct_power(0.1, 0.05, 4)  # 5 seeds are the fewest that reach 0.1
    assert nct_power(0.5775, 0.05, 3) > 0.8 and nct_power(0.5775, 0.05, 2) == pytest.approx(0.8, abs=1e-4)
    with pytest.raises(ConfigError, match=r"over 2 seed\(s\) at test_size.pilot_sd=0.05 \(a pilot\) the minimum "
                       r"detectable effect is 0.5775, above delta=0.1: 5 seeds reach it \(MDE 0.0841\)"):
        check_protocol(load_protocol(write_protocol(tmp_path, config, test_size=size)))
    five = check_protocol(load_protocol(write_protocol(tmp_path, config, test_size=size, seeds=[0, 1, 2, 3, 4])))
    assert five == ("power at registration: over 5 seed(s) at test_size.pilot_sd=0.05 (a pilot) the minimum "
                    "detectable effect is 0.0841, at most delta=0.1")
    with pytest.raises(ConfigError, match=r"is not defined \(one seed\), above delta=0.1: 5 seeds reach it"):
        check_protocol(load_protocol(write_protocol(tmp_path, config, test_size=size, seeds=[0])))
    acknowledged = {**size, "underpowered": "a smoke test, not a study"}
    two = check_protocol(load_protocol(write_protocol(tmp_path, config, test_size=acknowledged)))
    assert two.endswith("is 0.5775, above delta=0.1 (5 seeds reach it); underpowered: a smoke test, not a study")
    assert check_protocol(load_protocol(write_protocol(tmp_path, config))).startswith(
        "power at registration: not computed (no test_size.pilot_sd")
    for bad, match in [({"pilot_sd": 0.05}, "pilot_sd and pilot_source go together"),
                       ({"underpowered": "why"}, "it needs pilot_sd")]:
        with pytest.raises(ConfigError, match=match):
            load_protocol(write_protocol(tmp_path, config, test_size={"delta": 0.1, "derivation": "d", **bad}))


def test_overlapping_splits_are_refused(tmp_path, overlapping_task):
    config = tmp_path / "overlap.yaml"
    config.write_text(yaml.safe_dump({"model": {"name": "char-64x1"}, "task": {"name": "overlapping_test_task"}}))
    path = write_protocol(tmp_path, config, endpoint={"split": "val", "at": "final"},
                          arms={"low": {"config": str(config)}}, secondary=["val/response_length"],
                          calibration={"kind": "rise", "min_movement": 0.1, "why": "training moves it"})
    with pytest.raises(ConfigError, match="splits 'train' and 'val' of task 'overlapping_test_task' share 1"):
        check_protocol(load_protocol(path))


def test_runs_arms_by_seeds_resumes_and_reports(tmp_path, monkeypatch):
    measured = []

    def calibration_passes(protocol, locate):
        # two steps of a 64-wide model cannot move accuracy, so the real calibration is measured here and then
        # passed by hand to reach the comparison; the calibration's rule has its own tests (test_calibration.py)
        result = measure(protocol, locate)
        measured.append(result)
        return {**result, "status": "passed"}

    monkeypatch.setattr(experiment, "measure", calibration_passes)
    path = write_protocol(tmp_path, write_config(tmp_path))
    killed = tmp_path / "study" / "low" / "seed0"  # a run killed before its first checkpoint: started afresh
    killed.mkdir(parents=True)
    (killed / "metrics.jsonl").write_text('{"step": 1, "train/loss": 0.5}\n')
    data = run_experiment(path)
    assert not data["failures"] and len(data["runs"]) == 4
    assert measured[0]["status"] in ("passed", "failed") and set(measured[0]["per_seed"]) == {0, 1}
    root = tmp_path / "study"
    for arm in ("low", "high"):
        for seed in (0, 1):
            record = json.loads((root / arm / f"seed{seed}" / "endpoint.json").read_text())
            assert record["split"] == "report" and record["checkpoint"].endswith("checkpoints/best")
            # step 0's validation never becomes the endpoint (ties at step 0 would otherwise keep it)
            assert record["step"] > 0 and "step=0" not in (root / arm / f"seed{seed}" / "best.txt").read_text()
            assert [c["what"] for c in experiment.code_records(root / arm / f"seed{seed}")] == ["train", "eval"]
            per_seed = data["summary"]["val/avg@k"]["arms"][arm]["per_seed"]
            assert per_seed[seed] == record["metrics"]["val/avg@k"]
            modes = record["metrics"]["val/mode/direct/share"] + record["metrics"]["val/mode/scratchpad/share"]
            assert modes == pytest.approx(1.0)  # the task's response features reach the endpoint
            config = yaml.safe_load((root / arm / f"seed{seed}" / "config.yaml").read_text())
            assert config["seed"] == seed and config["train"]["threads"] == 1
    high = yaml.safe_load((root / "high" / "seed0" / "config.yaml").read_text())
    assert high["optim"]["lr"] == 1e-2
    comparison = data["summary"]["val/avg@k"]["versus_baseline"]["high"]
    diffs = [data["summary"]["val/avg@k"]["arms"]["high"]["per_seed"][s]
             - data["summary"]["val/avg@k"]["arms"]["low"]["per_seed"][s] for s in (0, 1)]
    assert comparison["mean"] == pytest.approx(sum(diffs) / 2)
    # two steps rarely move 6 one-sample answers: equal differences on both seeds (0 and 0) have no spread
    assert comparison["label"] in ("better", "worse", "no effect of size delta", "inconclusive",
                                   "spread not estimable")
    assert comparison["p_holm"] == comparison["p"] or math.isnan(comparison["p"])  # a family of one
    assert data["answers_per_run"] == 6
    assert not data["registration"]["protocol_changed"] and not data["registration"]["arms_changed"]
    assert data["endpoint_steps"]["low"] == {str(data["runs"][0]["step"]): 2} or sum(
        data["endpoint_steps"]["low"].values()) == 2
    assert "0" not in data["endpoint_steps"]["low"] and "0" not in data["endpoint_steps"]["high"]
    report = (root / "report.md").read_text()
    assert "| high | 2 |" in report and "MDE" in report and (root / "curves.png").stat().st_size > 1000
    assert "## Endpoint steps" in report and "p (Holm)" in report
    assert (root / "per_seed.csv").read_text().count("\n") == 5

    # a second invocation skips finished runs; a changed protocol runs nothing and is reported as changed
    stamps = {p: p.stat().st_mtime_ns for p in root.glob("*/seed*/endpoint.json")}
    run_experiment(path)
    assert {p: p.stat().st_mtime_ns for p in root.glob("*/seed*/endpoint.json")} == stamps
    path.write_text(path.read_text().replace("does a higher lr", "does a larger lr"))
    with pytest.raises(ConfigError, match=r"since then the protocol .* changed"):
        run_experiment(path)
    again = run_experiment(path, report_only=True)
    assert again["registration"]["protocol_changed"] and not again["registration"]["arms_changed"]
    assert "protocol changed: **True**" in (root / "report.md").read_text()


def test_an_arm_with_its_own_seeds_runs_only_those(tmp_path):
    # a positive control needed on the calibration's seeds only: the comparison's other seeds skip it
    config = write_config(tmp_path)
    path = write_protocol(tmp_path, config, comparisons=["high"],
                          arms={"low": {"config": str(config)}, "high": {"config": str(config)},
                                "control": {"config": str(config), "seeds": [1]}},
                          calibration={"kind": "positive_control", "arm": "control", "min_movement": 0.1,
                                       "seeds": [1], "why": "w"})
    protocol = load_protocol(path)
    check_protocol(protocol)
    # (the protocol file's arms are in key order: control, high, low)
    assert experiment.comparison_jobs(protocol) == [("high", 0), ("low", 0), ("control", 1), ("high", 1),
                                                    ("low", 1)]
    assert protocol.arm_seeds("control") == [1] and protocol.arm_seeds("low") == [0, 1]
    assert report._limited_arms(protocol) == " (`control` on seeds [1] only)" and not report._limited_arms(
        load_protocol(write_protocol(tmp_path / "plain", config)))
    with pytest.raises(ConfigError, match=r"arm\(s\) \['control'\] run only some seeds"):
        experiment.pool_protocols([protocol, protocol.model_copy(update={"seeds": [2, 3]})])


def test_cli_reports_a_bad_protocol_in_one_line(tmp_path):
    path = write_protocol(tmp_path, write_config(tmp_path), seeds=[3, 3])
    done = subprocess.run([sys.executable, "-m", "tether.cli", "experiment", str(path)], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 2 and "appear more than once" in done.stderr and "Traceback" not in done.stderr


def experiment_file(path: Path) -> Path:
    """``path`` with the first line every shipped protocol has, which names the command that reads it."""
    path.write_text(f"# tether experiment {path}\n" + path.read_text())
    return path


def test_validate_checks_a_protocol_as_tether_experiment_does(tmp_path):
    """validate read a protocol as a train config: one "unknown key" line per protocol key, and nothing checked."""
    from typer.testing import CliRunner

    from tether.cli import app

    config = write_config(tmp_path)
    good = experiment_file(write_protocol(tmp_path / "good", config))
    result = CliRunner().invoke(app, ["validate", str(good)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"ok: {good} (tether experiment protocol: 2 arms x 2 seeds, endpoint val/avg@k "
                                    "at best on split report;")
    bad = experiment_file(write_protocol(tmp_path / "bad", config, arms={
        "low": {"config": str(config)}, "high": {"config": str(config), "overrides": ["optim.lrr=1e-2"]}}))
    result = CliRunner().invoke(app, ["validate", str(bad)])
    assert result.exit_code == 2, result.output
    assert f"arm 'high' ({config}): invalid configuration:\n  optim.lrr: unknown key; did you mean lr?" in result.output
    assert "unknown key; the top level allows" not in result.output  # not read as a train config
    result = CliRunner().invoke(app, ["validate", str(good), "seed=3"])
    assert result.exit_code == 2 and "takes no overrides (seed=3); an arm's go in arms.NAME.overrides" in result.output


def test_an_arm_whose_checkpoint_is_not_here_is_refused_before_any_run(tmp_path):
    """An arm whose override named a checkpoint no command had written passed validate, and `tether experiment`
    trained the other arms, failed that arm's runs, and locked a design that its checkpoint, once written, broke."""
    from typer.testing import CliRunner

    from tether.cli import app

    config, checkpoint = write_config(tmp_path), tmp_path / "rft" / "checkpoint"
    arms = {"low": {"config": str(config)},
            "high": {"config": str(config), "overrides": [f"model.name={checkpoint}"]}}
    unnamed = experiment_file(write_protocol(tmp_path / "unnamed", config, arms=arms))
    result = CliRunner().invoke(app, ["validate", str(unnamed)])
    assert result.exit_code == 2
    assert f"arm 'high' ({config}): model.name: '{checkpoint}' is not a directory here" in result.output
    # the protocol's `# written by:` lines name what writes the inputs its overrides set
    named = write_protocol(tmp_path / "named", config, arms=arms)
    named.write_text("# tether experiment protocol.yaml\n# written by: tether sft rft_sft.yaml\n" + named.read_text())
    expected = (f"arm 'high': model.name={checkpoint}: not here yet; the protocol's inputs are written by "
                "`tether sft rft_sft.yaml` (run that first)")
    result = CliRunner().invoke(app, ["validate", str(named)])
    assert result.exit_code == 2 and result.output.strip() == expected, result.output
    with pytest.raises(ConfigError) as refused:
        run_experiment(named)
    assert str(refused.value) == expected
    assert not (tmp_path / "named" / "study").exists()  # no run, no lock
    assert check_protocol(load_protocol(named), inputs=False)  # --report-only reads the runs, not their inputs
    # with the checkpoint written, the protocol validates
    checkpoint.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (checkpoint / name).write_text("{}")
    result = CliRunner().invoke(app, ["validate", str(named)])
    assert result.exit_code == 0 and result.output.startswith(f"ok: {named}"), result.output


def test_an_input_an_arm_config_names_is_refused_with_its_written_by_lines(tmp_path):
    config = write_config(tmp_path, model={"name": str(tmp_path / "base" / "checkpoint")})
    config.write_text("# written by: tether sft base_sft.yaml\n" + config.read_text())
    with pytest.raises(ConfigError) as refused:
        check_protocol(load_protocol(write_protocol(tmp_path, config)))
    assert str(refused.value) == (f"arm 'high': model.name={tmp_path}/base/checkpoint: not here yet; {config}'s "
                                  "inputs are written by `tether sft base_sft.yaml` (run that first)")


def test_validate_names_the_first_step_the_shipped_eapo3_protocol_needs(tmp_path, monkeypatch):
    """The README's miniature lab: on a checkout without runs/, validate names the base's SFT first."""
    from typer.testing import CliRunner

    from tether.cli import app

    (tmp_path / "configs").symlink_to(Path(__file__).resolve().parents[2] / "configs")
    monkeypatch.chdir(tmp_path)  # its arms name their configs from the repository root; no runs/ here
    result = CliRunner().invoke(app, ["validate", "configs/lab/eapo3/protocol.yaml"])
    assert result.exit_code == 2
    assert result.output.strip() == ("arm 'grpo': model.name=runs/lab/eapo3/base/checkpoint: not here yet; "
                                     "configs/lab/eapo3/grpo.yaml's inputs are written by `tether sft "
                                     "configs/lab/eapo3/base_sft.yaml` (run that first)")


def write_env_config(tmp_path, env_name, **kwargs):
    cfg = {"model": {"name": "char-64x1"}, "env": {"name": env_name, "kwargs": kwargs, "max_turns": 4},
           "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
           "optim": {"lr": 1e-3, "micro_batch_size": 4}, "val": {"every": 1, "samples": 1},
           "train": {"steps": 2, "device": "cpu", "best_metric": "val/success_rate"},
           "logging": {"tensorboard": False, "progress": False}}
    path = tmp_path / f"{env_name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_an_env_with_a_report_split_is_evaluated_there_and_others_are_refused(tmp_path):
    from tether.lab.protocol_checks import endpoint_split_overrides

    endpoint = {"metric": "val/success_rate", "split": "report", "at": "best"}
    thin = write_protocol(tmp_path, write_env_config(tmp_path, "thin_ice", size=5), endpoint=endpoint,
                          secondary=["val/hazard_death_frac", "val/fell_through_ice_frac"])
    protocol = load_protocol(thin)
    check_protocol(protocol)
    from tether.lab.experiment import arm_config

    assert endpoint_split_overrides(arm_config(protocol, "low", 0), "report") == ["env.kwargs.eval_split=report"]
    validating_on_report = write_env_config(tmp_path, "thin_ice", size=5, eval_split="report")
    with pytest.raises(ConfigError, match="validate on the endpoint split"):
        check_protocol(load_protocol(write_protocol(tmp_path, validating_on_report, endpoint=endpoint,
                                                    secondary=[])))
    scripted = write_protocol(tmp_path, write_env_config(tmp_path, "scripted"), endpoint=endpoint, secondary=[])
    with pytest.raises(ConfigError, match="one held-out split"):
        check_protocol(load_protocol(scripted))


def fake_run(protocol, arm, seed, *, start=0.0, end=0.0, value=None, step=1, commit="c" * 40, clean=True):
    """The files training and the endpoint evaluation leave in a run directory, without either: selection-split
    validations at step 0 (``start``) and ``step`` (``end``), the best checkpoint's step, ``trained.json``, the
    commit its process imported and, with a ``value``, ``endpoint.json``."""
    directory = run_dir(protocol, arm, seed)
    directory.mkdir(parents=True, exist_ok=True)
    metric = protocol.endpoint.metric
    rows = [{"step": 0, metric: start}, {"step": step, "train/loss": 0.5}, {"step": step, metric: end}]
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (directory / "best.txt").write_text(f"{metric}={end} step={step}\n")
    (directory / "checkpoints").mkdir(exist_ok=True)
    (directory / "checkpoints" / "latest").write_text(f"step_{step:06d}")
    (directory / "trained.json").write_text(json.dumps({"endpoint_step": step}))
    (directory / "code.jsonl").write_text(json.dumps({"what": "train", "commit": commit, "clean": clean}) + "\n")
    if value is not None:
        record = {"arm": arm, "seed": seed, "split": "report", "checkpoint": "best", "step": step,
                  "metrics": {metric: value, "val/response_length": 3.0, "val/mode/direct/share": 1.0}}
        (directory / "endpoint.json").write_text(json.dumps(record))


def fake_finished_runs(path, values, lift=0.2):
    """A protocol's lock (an earlier lab version's: the protocol's hash only) and finished runs with
    ``values[arm][seed]`` at the endpoint; the selection split sees the same values, the calibration's arm lifted
    by ``lift``."""
    protocol = load_protocol(path)
    Path(protocol.run_root).mkdir(parents=True)
    (Path(protocol.run_root) / "protocol.lock.json").write_text(json.dumps(
        {"sha256": "0" * 64, "commit": "c" * 40, "committed": True, "started": "2026-12-05T00:00:00+00:00"}))
    for arm, per_seed in values.items():
        for seed, value in per_seed.items():
            lifted = value + (lift if arm == protocol.calibration.arm else 0.0)
            fake_run(protocol, arm, seed, end=lifted, value=value)


def test_a_replication_on_other_seeds_pools_into_one_report(tmp_path):
    config = write_config(tmp_path)
    first = write_protocol(tmp_path, config)
    second = write_protocol(tmp_path / "rep", config, name="smoke-replication", seeds=[2, 3],
                            run_root=str(tmp_path / "study_rep"))
    fake_finished_runs(first, {"low": {0: 0.5, 1: 0.25}, "high": {0: 0.75, 1: 0.25}})
    fake_finished_runs(second, {"low": {2: 0.5, 3: 0.0}, "high": {2: 0.5}})  # high/seed3 never finished
    data = pool_experiments([first, second], tmp_path / "pooled")
    diff = data["summary"]["val/avg@k"]["versus_baseline"]["high"]
    assert diff["n"] == 3 and diff["mean"] == pytest.approx((0.25 + 0.0 + 0.0) / 3)  # paired over seeds 0, 1, 2
    assert data["summary"]["val/avg@k"]["arms"]["low"]["n"] == 4
    assert data["failures"] == ["high/seed3 of smoke-replication: no endpoint.json"]
    assert data["protocol"]["seeds"] == [0, 1, 2, 3] and len(data["registration"]["pooled"]) == 2
    assert data["calibration"]["status"] == "incomplete" and data["calibration"]["missing"] == ["high/seed3"]
    assert data["registration"]["legacy"]  # an earlier lab version's lock, which the report says covers less
    report = (tmp_path / "pooled" / "report.md").read_text()
    assert "smoke + smoke-replication" in report and "hashes the protocol file only" in report

    other_arms = write_protocol(tmp_path / "x", config, seeds=[4], run_root=str(tmp_path / "x_study"),
                                test_size={"delta": 0.05, "derivation": "another"})
    with pytest.raises(ConfigError, match="their test_size differ"):
        pool_experiments([first, other_arms], tmp_path / "never")
    same_seed = write_protocol(tmp_path / "y", config, seeds=[1, 5], run_root=str(tmp_path / "y_study"))
    with pytest.raises(ConfigError, match=r"seed\(s\) \[1\] are in more than one protocol"):
        pool_experiments([first, same_seed], tmp_path / "never")
    not_run = write_protocol(tmp_path / "z", config, seeds=[6], run_root=str(tmp_path / "z_study"))
    with pytest.raises(ConfigError, match="has not run"):
        pool_experiments([first, not_run], tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_a_published_report_is_rebuilt_from_its_report_json_alone(tmp_path):
    """The committed reports predate rules the lab has since changed, and ``--report-only`` needs the run folders,
    which are not committed: ``--from-published`` rewrites a published folder from its ``report.json`` by the
    normal path, with the protocol as recorded there. Seeds 2 and 10: JSON's string keys sort 10 before 2."""
    from typer.testing import CliRunner

    from tether.cli import app

    path = write_protocol(tmp_path, write_config(tmp_path), seeds=[2, 3, 10])
    fake_finished_runs(path, {"low": {2: 0.5, 3: 0.4, 10: 0.25}, "high": {2: 0.75, 3: 0.5, 10: 0.3}})
    original = run_experiment(path, report_only=True)
    assert original["calibration"]["status"] == "passed"
    published = report.publish_report(original, tmp_path / "published")
    lock = (published / "protocol.lock.json").read_text()
    before = {name: (published / name).read_text() for name in ("report.md", "per_seed.csv")}
    shutil.rmtree(original["protocol"]["run_root"])  # no run folder, and a protocol that has moved on
    write_protocol(tmp_path, write_config(tmp_path), seeds=[2, 3, 10], test_size={"delta": 0.5, "derivation": "x"})

    result = CliRunner().invoke(app, ["experiment", "--from-published", str(published)])
    assert result.exit_code == 0, result.output
    rebuilt = json.loads((published / "report.json").read_text())
    assert json.dumps(rebuilt["summary"]) == json.dumps(original["summary"])  # NaN included (the secondary metrics)
    assert rebuilt["protocol"] == original["protocol"] and rebuilt["runs"] == original["runs"]
    assert rebuilt["rebuilt"] == {"from": str(published / "report.json"), "commit": "c" * 40, "clean": True}
    md = (published / "report.md").read_text()
    rebuilt_line = next(line for line in md.splitlines() if line.startswith("**Rebuilt**"))
    assert md.replace(rebuilt_line + "\n\n", "") == before["report.md"]
    assert f"`{published / 'report.json'}`" in rebuilt_line and "commit `cccccccccc` (tree clean: True)" in rebuilt_line
    assert "(per seed: 2: +0.450, 3: +0.300, 10: +0.250)" in md
    assert (published / "per_seed.csv").read_text() == before["per_seed.csv"]
    assert (published / "protocol.lock.json").read_text() == lock

    refused = CliRunner().invoke(app, ["experiment", "--from-published", str(published), "--publish", "x"])
    assert refused.exit_code == 2 and "takes no --publish (nor any of --report-only, --pool" in refused.output
    with pytest.raises(ConfigError, match=r"no report\.json, so nothing to rebuild"):
        report.rebuild_published(tmp_path, CLEAN)
    # a folder that is not there was told it lacked report.json, "a study published before the lab wrote one"
    with pytest.raises(ConfigError, match=rf"^{published}x: no such folder \(a published study's: docs/results/\.\.\.\)"
                                          rf"; did you mean {published}\b"):
        report.rebuild_published(Path(f"{published}x"), CLEAN)


def test_a_recorded_calibration_gets_its_seeds_back_as_numbers():
    """report.json keeps the calibration's per-seed movements under string keys: read back as they are, the report
    listed seed 10 before seed 2."""
    per_seed = {2: 0.5, 10: 0.25, 3: 0.375}
    measured = {"kind": "rise", "arm": "a", "metric": "m", "min_movement": 0.1, "seeds": [2, 3, 10], "why": "",
                "added_after_registration": None, "per_seed": per_seed,
                **calibration.judged(per_seed, dict.fromkeys(per_seed, 0.0), 0.1)}
    recorded = json.loads(json.dumps(measured))
    assert list(recorded["per_seed"]) == ["2", "10", "3"]
    assert report.recorded_calibration(recorded) == measured
    assert "(per seed: 2: +0.500, 3: +0.375, 10: +0.250)" in \
        report.calibration_lines(report.recorded_calibration(recorded))[-2]


def test_a_recorded_calibration_is_judged_again_by_todays_rules():
    """A report rebuilt from report.json labels its comparisons by the calibration's status: the status recorded
    under older rules (one seed's movement "failed", which labelled every comparison not testable) is judged again,
    here spread not estimable; its mean and interval are the recorded movements' own."""
    recorded = {"kind": "rise", "arm": "a", "metric": "m", "min_movement": 0.1, "seeds": [4], "why": "",
                "added_after_registration": None, "status": "failed", "per_seed": {"4": 0.3}, "mean": 0.3,
                "ci_low": -math.inf, "ci_high": math.inf}
    again = report.recorded_calibration(recorded)
    assert again["status"] == stats.SPREAD_NOT_ESTIMABLE and again["per_seed"] == {4: 0.3}
    assert again["mean"] == pytest.approx(0.3)
    many = {**recorded, "seeds": [0, 1, 2], "status": "failed", "per_seed": {"0": 0.3, "1": 0.4, "2": 0.35}}
    assert report.recorded_calibration(many)["status"] == calibration.PASSED  # mean 0.35, interval [0.23, 0.47]
    incomplete = {**recorded, "status": calibration.INCOMPLETE, "per_seed": {}, "mean": None}
    assert report.recorded_calibration(incomplete) == incomplete


def test_a_protocol_that_requires_another_runs_only_after_that_result(tmp_path):
    # a design's comparison after its calibration: the other protocol finished, calibrated, and its arm moved enough
    config = write_config(tmp_path)
    first = load_protocol(write_protocol(tmp_path / "first", config))
    requirement = {"protocol": str(tmp_path / "first" / "protocol.yaml"), "arm": "high", "min_difference": 0.1,
                   "why": "a control that cannot move the endpoint calibrates nothing"}
    path = write_protocol(tmp_path / "second", config, requires=[requirement])
    protocol = load_protocol(path)
    check_protocol(protocol)
    with pytest.raises(ConfigError, match=r"requires .*first/protocol.yaml, which has not reported yet"):
        run_experiment(path)
    assert not (tmp_path / "second" / "study").exists()  # refused before any run or lock

    def report(mean, status="passed", runs=4):
        data = {"protocol": first.model_dump(), "calibration": {"status": status, "missing": []}, "failures": [],
                "runs": [{"arm": a, "seed": s} for a in ("low", "high") for s in (0, 1)][:runs],
                "summary": {"val/avg@k": {"versus_baseline": {"high": {"mean": mean, "ci_low": mean - 0.1,
                                                                       "ci_high": mean + 0.1}}}}}
        root = Path(first.run_root)
        root.mkdir(parents=True, exist_ok=True)
        (root / "report.json").write_text(json.dumps(data))

    report(0.15, runs=3)
    with pytest.raises(ConfigError, match=r"which has not finished \(high/seed1\)"):
        experiment.check_requirements(protocol)
    for status in ("failed", "spread not estimable"):  # neither ran the comparison the requirement reads
        report(0.15, status=status)
        with pytest.raises(ConfigError, match=rf"whose calibration did not pass \({status}\): nothing of 'smoke' runs"):
            experiment.check_requirements(protocol)
    report(0.05)
    with pytest.raises(ConfigError, match=r"high - low, val/avg@k on split report, \+0.050 \[-0.050, \+0.150\], "
                                          r"below 0.1: nothing of 'smoke' runs \(a control that cannot"):
        experiment.check_requirements(protocol)
    report(0.15)
    assert experiment.check_requirements(protocol)[0].endswith("+0.150 [+0.050, +0.250] >= 0.1: met")
    requirement["arm"] = "low"
    with pytest.raises(ConfigError, match=r"requires\[0\].arm='low' is not an arm .*first/protocol.yaml compares "
                                          r"with its baseline; allowed: high"):
        check_protocol(load_protocol(write_protocol(tmp_path / "third", config, requires=[requirement])))
    requirement.update(protocol=str(tmp_path / "missing.yaml"), arm="high")
    with pytest.raises(ConfigError, match=r"requires\[0\].protocol='.*missing.yaml': protocol file .* does not exist"):
        check_protocol(load_protocol(write_protocol(tmp_path / "fourth", config, requires=[requirement])))


def test_a_kill_while_the_runner_writes_leaves_no_torn_record_that_stops_the_next_run(tmp_path, monkeypatch):
    """A torn endpoint.json (trained.json, protocol.lock.json) ended every later invocation with a JSONDecodeError
    traceback, and a torn code.jsonl line every report: the records are written whole or not at all, and a torn
    code line (a process killed as it started) is passed over."""
    protocol = load_protocol(write_protocol(tmp_path, write_config(tmp_path)))
    directory = run_dir(protocol, "high", 1)
    (directory / "checkpoints" / "best").mkdir(parents=True)
    (directory / "trained.json").write_text('{"endpoint_step": 2}')
    (directory / "best.txt").write_text("val/avg@k=0.5 step=2\n")
    (directory / "config.yaml").write_text("seed: 1\n")
    evaluated = subprocess.CompletedProcess([], 0, stdout='{"val/avg@k": 0.5}', stderr="")
    monkeypatch.setattr(experiment.subprocess, "run", lambda *a, **k: evaluated)
    real_open = Path.open

    def killed_halfway(self, mode="r", *args, **kwargs):  # the process dies half-way through the file's text
        f = real_open(self, mode, *args, **kwargs)
        if "w" in mode and "endpoint.json" in self.name:  # the file, or the temporary beside it
            write = f.write

            def half_then_die(text: str) -> None:
                write(text[: len(text) // 2])
                f.flush()
                raise SystemExit(137)

            f.write = half_then_die
        return f

    monkeypatch.setattr(Path, "open", killed_halfway)
    with pytest.raises(SystemExit):
        experiment.evaluate_one(protocol, "high", 1)
    monkeypatch.setattr(Path, "open", real_open)
    assert not (directory / "endpoint.json").exists()  # old code: half a JSON object
    assert experiment.evaluate_one(protocol, "high", 1)["metrics"] == {"val/avg@k": 0.5}  # the next run redoes it

    (directory / "code.jsonl").write_text('{"what": "train", "commit": "c", "clean": true}\n{"what": "ev')
    experiment.record_code(directory, "eval")
    assert [row["what"] for row in experiment.code_records(directory)] == ["train", "eval"]
