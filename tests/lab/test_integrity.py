"""What makes a lab report checkable: the lock over protocol, arm configs and code; the dirty-tree rule; runs
on another commit flagged; signed labels with Holm; unpaired seeds named; endpoint steps counted; step 0 kept
out of ``at: best``; publishing into the repository (tether/lab)."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys

import pytest
import yaml
from scipy import stats as scipy_stats

from tests.lab.test_calibration import FakeRunner, control_end, three_arms
from tests.lab.test_experiment import CLEAN, fake_run, write_config, write_protocol
from tether.config import ConfigError
from tether.lab import experiment, report, stats
from tether.lab.experiment import code_state, load_protocol, run_experiment
from tether.lab.protocol import resolved_arm_config, run_overrides
from tether.lab.report import publish_report

DIRTY = {"commit": "d" * 40, "clean": False, "changed": ["tether/lab/stats.py"]}


@pytest.fixture
def fake_runner(monkeypatch):
    runner = FakeRunner(selection={"low": (0.2, 0.30), "high": (0.2, control_end), "mid": (0.2, 0.3)},
                        endpoint={"low": 0.3, "high": 0.5, "mid": 0.3})
    monkeypatch.setattr(experiment, "train_one", runner.train_one)
    monkeypatch.setattr(experiment, "run_one", runner.run_one)
    return runner


def git(root, *args):
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def test_code_state_reads_the_commit_and_whether_the_tree_is_clean(tmp_path):
    git(tmp_path, "init", "-q")
    (tmp_path / "module.py").write_text("x = 1\n")
    git(tmp_path, "add", "module.py")
    git(tmp_path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "one")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert code_state(tmp_path) == {"commit": head, "clean": True, "changed": []}
    (tmp_path / "module.py").write_text("x = 2\n")
    assert code_state(tmp_path) == {"commit": head, "clean": False, "changed": ["module.py"]}
    git(tmp_path, "checkout", "module.py")
    (tmp_path / "new.py").write_text("")  # an untracked module a run could import
    assert code_state(tmp_path)["changed"] == ["new.py"]
    assert code_state(tmp_path / "not_a_repo_below") == {"commit": "unknown", "clean": False,
                                                          "changed": ["(not a git checkout)"]}


def test_a_report_of_a_study_that_never_ran_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(experiment, "code_state", lambda root=None: dict(CLEAN))
    with pytest.raises(ConfigError, match="has not run"):
        run_experiment(three_arms(tmp_path), report_only=True)
    assert not (tmp_path / "study").exists()


def test_a_dirty_tree_is_refused_before_anything_is_written(tmp_path, monkeypatch, fake_runner):
    monkeypatch.setattr(experiment, "code_state", lambda root=None: dict(DIRTY))
    path = three_arms(tmp_path)
    with pytest.raises(ConfigError, match=r"not clean: tether/lab/stats.py; .* --allow-dirty"):
        run_experiment(path)
    assert not (tmp_path / "study").exists() and fake_runner.trained == []
    data = run_experiment(path, allow_dirty=True)
    lock = json.loads((tmp_path / "study" / "protocol.lock.json").read_text())
    assert lock["allow_dirty"] and lock["code"] == {"commit": "d" * 40, "clean": False}
    report = (tmp_path / "study" / "report.md").read_text()
    assert "registered with --allow-dirty" in report and "ran with --allow-dirty" in report
    assert data["calibration"]["status"] == "passed"


def test_the_lock_covers_every_arms_resolved_config_and_the_code(tmp_path, monkeypatch, fake_runner):
    monkeypatch.setattr(experiment, "code_state", lambda root=None: dict(CLEAN))
    path = three_arms(tmp_path)
    run_experiment(path)
    lock = json.loads((tmp_path / "study" / "protocol.lock.json").read_text())
    protocol = load_protocol(path)
    assert lock["code"] == {"commit": CLEAN["commit"], "clean": True}
    assert lock["arms"]["high"]["config"] == resolved_arm_config(protocol, "high")
    assert lock["arms"]["high"]["config"]["optim"]["lr"] == 1e-2 and "seed" not in lock["arms"]["high"]["config"]
    assert lock["arms"]["high"]["config"]["train"]["best_from_step"] == 1  # the runner's own overrides too

    # an arm's config file changes under the same protocol: the report names the arms it touches
    config = tmp_path / "arm.yaml"
    config.write_text(config.read_text().replace("micro_batch_size: 4", "micro_batch_size: 2"))
    data = run_experiment(path, report_only=True)
    assert not data["registration"]["protocol_changed"]
    assert data["registration"]["arms_changed"] == ["high", "low", "mid"]
    # one arm's override changes in the protocol: the protocol and that arm only
    config.write_text(config.read_text().replace("micro_batch_size: 2", "micro_batch_size: 4"))
    path.write_text(path.read_text().replace("optim.lr=3e-3", "optim.lr=4e-3"))
    data = run_experiment(path, report_only=True)
    assert data["registration"]["protocol_changed"] and data["registration"]["arms_changed"] == ["mid"]
    assert "arm configs changed: **mid**" in (tmp_path / "study" / "report.md").read_text()


def test_a_study_whose_design_changed_after_locking_starts_no_run(tmp_path, monkeypatch, fake_runner):
    """A resumed study whose protocol or arm config changed since the lock would run its remaining seeds on another
    design than the finished ones: it is refused before any run, naming the changed keys; ``parallel`` may change."""
    monkeypatch.setattr(experiment, "code_state", lambda root=None: dict(CLEAN))
    path = three_arms(tmp_path)
    run_experiment(path)
    fake_runner.trained.clear()
    config = tmp_path / "arm.yaml"
    config.write_text(config.read_text().replace("micro_batch_size: 4", "micro_batch_size: 2"))
    with pytest.raises(ConfigError, match=r"since then arm 'high': optim.micro_batch_size: 4 -> 2; arm 'low': "
                                          r"optim.micro_batch_size: 4 -> 2; arm 'mid'.*another run_root"):
        run_experiment(path)
    assert fake_runner.trained == [] and run_experiment(path, report_only=True)["registration"]["arms_changed"]
    config.write_text(config.read_text().replace("micro_batch_size: 2", "micro_batch_size: 4"))
    path.write_text(path.read_text().replace("optim.lr=3e-3", "optim.lr=4e-3"))
    with pytest.raises(ConfigError, match=r"the protocol .* changed; arm 'mid': optim.lr: 0.003 -> 0.004\. Runs "):
        run_experiment(path)
    assert fake_runner.trained == []
    path.write_text(path.read_text().replace("optim.lr=4e-3", "optim.lr=3e-3").replace("parallel: 2", "parallel: 1"))
    data = run_experiment(path)  # how many run at once is no part of the design
    assert data["registration"]["protocol_changed"] and not data["registration"]["design_changed"]
    assert fake_runner.trained


def test_a_file_an_arm_names_is_locked_by_its_content(tmp_path, monkeypatch, fake_runner):
    """A module in ``imports`` (or a data file, a chat template) outside the checkout is covered by no commit, and
    the config holds only its path: its content is in the lock, and an edit is a changed arm."""
    monkeypatch.setattr(experiment, "code_state", lambda root=None: dict(CLEAN))
    plugin = tmp_path / "plugin.py"
    plugin.write_text("SCALE = 1\n")
    path = three_arms(tmp_path)
    config = tmp_path / "arm.yaml"
    config.write_text(config.read_text() + f"imports: [{plugin}]\n")
    run_experiment(path)
    lock = json.loads((tmp_path / "study" / "protocol.lock.json").read_text())
    assert lock["arms"]["low"]["files"] == {str(plugin): hashlib.sha256(b"SCALE = 1\n").hexdigest()}
    fake_runner.trained.clear()
    plugin.write_text("SCALE = 2\n")
    with pytest.raises(ConfigError, match=f"since then arm 'high': file {plugin} changed; arm 'low'"):
        run_experiment(path)
    assert fake_runner.trained == []
    assert run_experiment(path, report_only=True)["registration"]["arms_changed"] == ["high", "low", "mid"]


def test_a_checkpoint_directory_an_arm_names_is_locked_by_its_files(tmp_path, monkeypatch, fake_runner):
    """``model.name`` (or an EAPO prior) naming a checkpoint directory put only its path in the lock: new weights
    under the same path were run as the registered arm. Its files are hashed, and one changed file is refused."""
    monkeypatch.setattr(experiment, "code_state", lambda root=None: dict(CLEAN))
    checkpoint = tmp_path / "warm" / "checkpoint"
    (checkpoint / "tokenizer").mkdir(parents=True)
    (checkpoint / "config.json").write_text('{"hidden_size": 64}')
    (checkpoint / "model.safetensors").write_bytes(b"weights one")
    (checkpoint / "tokenizer" / "vocab.json").write_text("{}")
    (checkpoint / "tokenizer.json").write_text("{}")  # a directory without one is refused before any run
    path = three_arms(tmp_path)
    path.write_text(path.read_text().replace("optim.lr=1e-2", f"optim.lr=1e-2\n    - model.name={checkpoint}"))
    run_experiment(path)
    lock = json.loads((tmp_path / "study" / "protocol.lock.json").read_text())

    def sha(data):
        return hashlib.sha256(data).hexdigest()

    files = [("config.json", b'{"hidden_size": 64}'), ("model.safetensors", b"weights one"),
             ("tokenizer/vocab.json", b"{}"), ("tokenizer.json", b"{}")]  # sorted by path, part by part
    listing = "".join(f"{name}\0{sha(data)}\n" for name, data in files)
    assert lock["arms"]["high"]["directories"] == {str(checkpoint): sha(listing.encode())}
    assert lock["arms"]["low"]["directories"] == {}
    fake_runner.trained.clear()
    (checkpoint / "model.safetensors").write_bytes(b"weights two")
    with pytest.raises(ConfigError, match=f"since then arm 'high': directory {checkpoint} changed\\. Runs"):
        run_experiment(path)
    assert fake_runner.trained == []
    assert run_experiment(path, report_only=True)["registration"]["arms_changed"] == ["high"]
    (checkpoint / "model.safetensors").write_bytes(b"weights one")
    reads, read = [], experiment.directory_sha256
    monkeypatch.setattr(experiment, "directory_sha256", lambda directory: reads.append(directory) or read(directory))
    assert run_experiment(path, report_only=True)["registration"]["arms_changed"] == []
    assert reads == [checkpoint]  # once: the comparison with the lock reuses the hashes the lock's content made


def test_a_checkpoint_named_without_a_slash_is_locked_too(tmp_path, monkeypatch, fake_runner):
    """``model.name: ckpt`` loads the folder ``ckpt`` of the working directory, but only names with a ``/`` were
    hashed: new weights there ran as the registered arm."""
    monkeypatch.setattr(experiment, "code_state", lambda root=None: dict(CLEAN))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text('{"hidden_size": 64}')
    (tmp_path / "ckpt" / "tokenizer.json").write_text("{}")
    (tmp_path / "ckpt" / "model.safetensors").write_bytes(b"weights one")
    (tmp_path / "report").mkdir()  # a folder called like a split, which a config names as a word, is not read
    path = three_arms(tmp_path)
    path.write_text(path.read_text().replace("optim.lr=1e-2", "optim.lr=1e-2\n    - model.name=ckpt"))
    run_experiment(path)
    lock = json.loads((tmp_path / "study" / "protocol.lock.json").read_text())
    assert list(lock["arms"]["high"]["directories"]) == ["ckpt"] and lock["arms"]["low"]["directories"] == {}
    (tmp_path / "ckpt" / "model.safetensors").write_bytes(b"weights two")
    with pytest.raises(ConfigError, match="since then arm 'high': directory ckpt changed\\. Runs"):
        run_experiment(path)


def test_user_modules_an_arm_imports_by_name_or_from_its_files_are_locked(tmp_path, monkeypatch, fake_runner):
    """Only ``.py`` paths were hashed: a module in ``imports`` by name, a ``module:Name`` reference's module, and a
    module an imported file imports in turn ran edited as the registered arm."""
    monkeypatch.setattr(experiment, "code_state", lambda root=None: dict(CLEAN))
    (tmp_path / "mods").mkdir()
    (tmp_path / "ext").mkdir()
    by_name = tmp_path / "mods" / "lock_test_by_name.py"
    by_name.write_text("import json\nimport tether\nSCALE = 1\n")  # the standard library and tether: not hashed
    target = tmp_path / "mods" / "lock_test_target.py"
    target.write_text("def weight(prompts, completions, **columns):\n    return [0.0] * len(completions)\n")
    entry, helper = tmp_path / "ext" / "lock_test_entry.py", tmp_path / "ext" / "lock_test_helper.py"
    entry.write_text("from lock_test_helper import VALUE\n")
    helper.write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    for name in ("lock_test_by_name", "lock_test_target", "lock_test_entry", "lock_test_helper"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    path = three_arms(tmp_path)
    config = tmp_path / "arm.yaml"
    config.write_text(config.read_text() + f"imports: [lock_test_by_name, {entry}]\n")
    path.write_text(path.read_text().replace(
        "optim.lr=1e-2", "optim.lr=1e-2\n    - 'task.rewards=[{fn: \"lock_test_target:weight\", weight: 0.0}]'"))
    assert experiment.user_code_files(resolved_arm_config(load_protocol(path), "high")) == {
        str(p.resolve()): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted([by_name, target, helper])}
    run_experiment(path)
    for changed in (by_name, helper, target):
        changed.write_text(changed.read_text() + "# edited\n")
        fake_runner.trained.clear()
        with pytest.raises(ConfigError, match=f"arm 'high': module {changed.resolve()} changed"):
            run_experiment(path)
        assert fake_runner.trained == []
        changed.write_text(changed.read_text().removesuffix("# edited\n"))
    assert run_experiment(path, report_only=True)["registration"]["arms_changed"] == []


def test_a_run_on_another_commit_or_an_unclean_tree_is_flagged(tmp_path, monkeypatch, fake_runner):
    monkeypatch.setattr(experiment, "code_state", lambda root=None: dict(CLEAN))
    path = three_arms(tmp_path)
    run_experiment(path)
    protocol = load_protocol(path)
    fake_run(protocol, "mid", 1, value=0.3, commit="e" * 40)
    fake_run(protocol, "low", 0, value=0.3, clean=False)
    data = run_experiment(path, report_only=True)
    assert data["code_flags"] == ["low/seed0: imported a tree with uncommitted changes",
                                  f"mid/seed1: imported commit {'e' * 10}, not the registered {'c' * 10}"]
    report = (tmp_path / "study" / "report.md").read_text()
    assert "## Runs not on the registered code" in report and "imported commit eeeeeeeeee" in report


def report_of(tmp_path, monkeypatch, endpoint_values, **changes):
    """The report of finished fake runs with ``endpoint_values[arm][seed]`` (calibration passing: lifts of 0.2
    plus 0.01 x seed, a spread)."""
    monkeypatch.setattr(experiment, "code_state", lambda root=None: dict(CLEAN))
    path = three_arms(tmp_path, **changes)
    protocol = load_protocol(path)
    experiment.registration(protocol, path, dict(CLEAN))  # the lock a first run would have written
    for arm, per_seed in endpoint_values.items():
        for seed, value in per_seed.items():
            fake_run(protocol, arm, seed, start=0.2, end=0.5 + 0.01 * seed if arm == "high" else 0.3, value=value,
                     step=2 if seed == 1 else 1)
    return run_experiment(path, report_only=True)


SEEDS = [0, 1, 2, 3, 4]
BASE = [0.50, 0.52, 0.48, 0.51, 0.49]
Z = [(k - 2) / math.sqrt(2.5) for k in range(5)]  # mean 0, sample sd 1


def shifted(mean, sd):
    """Per-seed values whose differences from BASE have exactly this mean and sample sd."""
    return {seed: b + mean + sd * z for seed, b, z in zip(SEEDS, BASE, Z, strict=True)}


def with_p(p, sd=0.02):
    """Values whose paired t test against BASE has two-sided p-value ``p``."""
    return shifted(scipy_stats.t.isf(p / 2, 4) * sd / math.sqrt(5), sd)


def test_a_detected_harm_is_labelled_worse(tmp_path, monkeypatch):
    values = {"low": dict(zip(SEEDS, BASE, strict=True)), "high": shifted(-0.2, 0.015), "mid": shifted(0.01, 0.1)}
    data = report_of(tmp_path, monkeypatch, values, seeds=SEEDS)
    primary = data["summary"]["val/avg@k"]["versus_baseline"]
    assert primary["high"]["mean"] == pytest.approx(-0.2) and primary["high"]["label"] == stats.WORSE
    assert primary["mid"]["label"] == stats.INCONCLUSIVE  # interval [-0.114, +0.134]: neither
    assert "**worse**" in (tmp_path / "study" / "report.md").read_text()


def test_holm_over_the_comparisons_decides_the_labels(tmp_path, monkeypatch):
    values = {"low": dict(zip(SEEDS, BASE, strict=True)), "high": with_p(0.03), "mid": with_p(0.04)}
    data = report_of(tmp_path, monkeypatch, values, seeds=SEEDS)
    primary = data["summary"]["val/avg@k"]["versus_baseline"]
    raw = [primary["high"]["p"], primary["mid"]["p"]]
    assert raw == pytest.approx([0.03, 0.04])
    # Holm over two: 0.03 x 2 = 0.06, then max(0.06, 0.04 x 1) = 0.06; neither is detected after correction,
    # although each interval excludes 0 on its own; both intervals lie inside +-0.1
    assert [primary["high"]["p_holm"], primary["mid"]["p_holm"]] == pytest.approx([0.06, 0.06])
    assert primary["high"]["ci_low"] > 0 and primary["high"]["label"] == stats.NO_EFFECT
    report = (tmp_path / "study" / "report.md").read_text()
    assert "| 0.0300 | 0.0600 | **no effect of size delta** |" in report


def test_no_effect_is_read_on_the_interval_adjusted_for_the_family(tmp_path, monkeypatch):
    """Two comparisons: "no effect" needs the 97.5% interval (Bonferroni over 2) inside +-delta, as Holm adjusts
    the tests; 0 +- 0.040 over 5 seeds lies inside +-0.055 at 95% (+-0.050) but not at 97.5% (+-0.063)."""
    values = {"low": dict(zip(SEEDS, BASE, strict=True)), "high": shifted(0.0, 0.04), "mid": shifted(0.0, 0.01)}
    data = report_of(tmp_path, monkeypatch, values, seeds=SEEDS, test_size={"delta": 0.055, "derivation": "d"})
    primary = data["summary"]["val/avg@k"]["versus_baseline"]
    high = primary["high"]
    want = scipy_stats.t.interval(1 - 0.05 / 2, 4, loc=0.0, scale=0.04 / math.sqrt(5))
    assert (high["equivalence_low"], high["equivalence_high"]) == pytest.approx(want, abs=1e-12)
    assert high["ci_low"] > -0.055 and high["ci_high"] < 0.055  # the unadjusted reading said no effect
    assert high["label"] == stats.INCONCLUSIVE and primary["mid"]["label"] == stats.NO_EFFECT
    assert "97.5% CI (equivalence)" in (tmp_path / "study" / "report.md").read_text()


def test_a_nan_endpoint_is_a_failed_run_not_a_nan_arm(tmp_path, monkeypatch):
    """One NaN endpoint made its arm's mean, interval and comparison NaN (labelled inconclusive), and the study
    counted as finished; it is a failed run, left out of the statistics, and the study cannot be published."""
    high = shifted(0.05, 0.01)
    values = {"low": dict(zip(SEEDS, BASE, strict=True)), "high": {**high, 3: math.nan}, "mid": shifted(0.0, 0.01)}
    data = report_of(tmp_path, monkeypatch, values, seeds=SEEDS)
    summary = data["summary"]["val/avg@k"]
    kept = [high[s] for s in SEEDS if s != 3]
    assert summary["arms"]["high"]["n"] == 4 and summary["arms"]["high"]["mean"] == pytest.approx(sum(kept) / 4)
    c = summary["versus_baseline"]["high"]
    paired = scipy_stats.ttest_rel(kept, [BASE[s] for s in SEEDS if s != 3])
    assert c["n"] == 4 and c["p"] == pytest.approx(paired.pvalue, rel=1e-9) and c["unpaired"]["baseline_only"] == [3]
    assert data["failures"] == ["high/seed3: endpoint val/avg@k is nan"]
    assert "- high/seed3: endpoint val/avg@k is nan" in (tmp_path / "study" / "report.md").read_text()
    with pytest.raises(ConfigError, match="has not finished"):
        publish_report(data, tmp_path / "published")


def test_unpaired_seeds_are_named_not_dropped(tmp_path, monkeypatch):
    values = {"low": {0: 0.3, 1: 0.3, 2: 0.3}, "high": {0: 0.4, 1: 0.4, 3: 0.5}, "mid": {0: 0.3, 1: 0.31, 2: 0.3}}
    data = report_of(tmp_path, monkeypatch, values, seeds=[0, 1, 2, 3])
    high = data["summary"]["val/avg@k"]["versus_baseline"]["high"]
    assert high["n"] == 2 and high["unpaired"] == {"arm_only": [3], "baseline_only": [2]}
    assert "| arm only: [3]; low only: [2] |" in (tmp_path / "study" / "report.md").read_text()


def test_the_report_counts_the_endpoint_steps(tmp_path, monkeypatch):
    values = {arm: {0: 0.3, 1: 0.3} for arm in ("low", "high", "mid")}
    data = report_of(tmp_path, monkeypatch, values)
    assert data["endpoint_steps"] == {arm: {"1": 1, "2": 1} for arm in ("high", "low", "mid")}
    assert "| low | 1: 1, 2: 1 |" in (tmp_path / "study" / "report.md").read_text()


def test_step_0_is_kept_out_of_at_best_unless_the_protocol_allows_it(tmp_path):
    config = write_config(tmp_path)
    kept_out = load_protocol(write_protocol(tmp_path, config))
    assert "train.best_from_step=1" in run_overrides(kept_out, "low", 0)
    allowed = load_protocol(write_protocol(tmp_path, config, endpoint={"split": "report", "at": "best",
                                                                        "start_selectable": True}))
    assert not any(o.startswith("train.best_from_step") for o in run_overrides(allowed, "low", 0))
    final = load_protocol(write_protocol(tmp_path, config, endpoint={"split": "report", "at": "final"}))
    assert not any(o.startswith("train.best_from_step") for o in run_overrides(final, "low", 0))
    lone = write_config(tmp_path, name="lone.yaml", val={"every": 5, "samples": 1})  # validates step 0 only
    with pytest.raises(ConfigError, match="validates only the starting policy"):
        experiment.check_protocol(load_protocol(write_protocol(tmp_path, lone)))


def test_the_trainer_never_makes_step_0_the_best_checkpoint_when_told(tmp_path):
    from tether.trainer.trainer import Trainer

    class Fake:  # just what Trainer.validate reads and writes
        def __init__(self, best_from_step):
            self.cfg = type("C", (), {"train": type("T", (), {"best_metric": "val/avg@k",
                                                              "best_from_step": best_from_step}),
                                      "val": type("W", (), {"split": "val", "max_prompts": None, "greedy": True,
                                                            "samples": 1})})
            self.step, self.best_value, self.val_history, self.saved = 0, float("-inf"), [], []
            self.collector = type("V", (), {"validate": staticmethod(lambda engine, seed: {"val/avg@k": 0.5})})
            self.sampling_engine = None
            self.health = type("H", (), {"on_validation": staticmethod(lambda step, m: {}),
                                         "stop_if_unhealthy": staticmethod(lambda: None)})
            self.tracker = type("K", (), {"log": staticmethod(lambda m, step: None)})
            self.checkpoints = type("P", (), {"save_best": lambda _, write: self.saved.append(self.step)})()
            self.dp = type("D", (), {"is_main": False})
            self.run_dir = tmp_path

        def _best_writer(self, state):
            return None

        _said = Trainer._said  # the save's status lines around it

        def status(self, message):
            pass

        def seed_for(self, purpose, k=0):
            return 0

    for best_from_step, chosen in ((0, [0]), (1, [1])):
        fake = Fake(best_from_step)
        for step in (0, 1, 2):  # the same value at every validation: a tie keeps the earliest allowed
            fake.step = step
            Trainer.validate(fake)
        assert fake.saved == chosen


def test_publishing_copies_a_finished_study_and_refuses_an_unfinished_one(tmp_path, monkeypatch, fake_runner):
    monkeypatch.setattr(experiment, "code_state", lambda root=None: dict(CLEAN))
    path = three_arms(tmp_path)
    data = run_experiment(path)
    dest = publish_report(data, tmp_path / "docs" / "results" / "smoke")
    assert sorted(p.name for p in dest.iterdir()) == ["per_seed.csv", "protocol.lock.json", "report.json",
                                                     "report.md"]
    assert (dest / "report.md").read_text() == (tmp_path / "study" / "report.md").read_text()
    (tmp_path / "study" / "mid" / "seed1" / "endpoint.json").unlink()
    unfinished = run_experiment(path, report_only=True)
    with pytest.raises(ConfigError, match=r"has not finished \(mid/seed1\)"):
        publish_report(unfinished, tmp_path / "elsewhere")
    assert not (tmp_path / "elsewhere").exists()
    assert yaml.safe_load((dest / "per_seed.csv").read_text().splitlines()[0].replace(",", " ")) is not None


def test_the_cli_refuses_a_dirty_tree_unless_allowed_and_publishes(tmp_path, monkeypatch, fake_runner):
    from typer.testing import CliRunner

    from tether import cli

    monkeypatch.setattr(experiment, "code_state", lambda root=None: dict(DIRTY))
    path = three_arms(tmp_path)
    refused = CliRunner().invoke(cli.app, ["experiment", str(path)])
    assert refused.exit_code == 2 and "--allow-dirty" in refused.output
    dest = tmp_path / "docs" / "results" / "smoke"
    done = CliRunner().invoke(cli.app, ["experiment", str(path), "--allow-dirty", "--publish", str(dest)])
    assert done.exit_code == 0, done.output
    assert "ran with --allow-dirty" in done.output and (dest / "protocol.lock.json").is_file()


def test_the_reports_intervals_p_values_and_mde_match_scipy(tmp_path, monkeypatch):
    """Every number of the primary endpoint's tables against scipy: each arm's 95% t interval over its seeds, and
    each paired comparison's interval, raw p (the paired t test) and MDE (80% power, df n - 1: the difference at
    which scipy's noncentral t gives the test power 0.8)."""
    values = {"low": dict(zip(SEEDS, BASE, strict=True)), "high": shifted(0.03, 0.02), "mid": shifted(0.004, 0.01)}
    data = report_of(tmp_path, monkeypatch, values, seeds=SEEDS)
    summary = data["summary"]["val/avg@k"]
    n = len(SEEDS)
    t975 = scipy_stats.t.ppf(0.975, n - 1)
    for arm, per_seed in values.items():
        x = [per_seed[s] for s in SEEDS]
        low, high = scipy_stats.t.interval(0.95, n - 1, loc=sum(x) / n, scale=scipy_stats.sem(x))
        got = summary["arms"][arm]
        assert got["n"] == n
        assert (got["ci_low"], got["ci_high"]) == (pytest.approx(low, rel=1e-9), pytest.approx(high, rel=1e-9))
    for arm in ("high", "mid"):
        d = [values[arm][s] - values["low"][s] for s in SEEDS]
        low, high = scipy_stats.t.interval(0.95, n - 1, loc=sum(d) / n, scale=scipy_stats.sem(d))
        c = summary["versus_baseline"][arm]
        assert (c["ci_low"], c["ci_high"]) == (pytest.approx(low, rel=1e-9), pytest.approx(high, rel=1e-9))
        paired = scipy_stats.ttest_rel([values[arm][s] for s in SEEDS], [values["low"][s] for s in SEEDS])
        assert c["p"] == pytest.approx(paired.pvalue, rel=1e-6)
        noncentrality = c["mde"] / scipy_stats.sem(d)
        power = scipy_stats.nct.sf(t975, n - 1, noncentrality) + scipy_stats.nct.cdf(-t975, n - 1, noncentrality)
        assert power == pytest.approx(0.8, abs=1e-7)
    # sd of the differences 0.02 and 0.01: MDE = 3.7611 x sd / sqrt(5) (the shortcut t_0.975 + t_0.8 gives 3.717)
    assert summary["versus_baseline"]["high"]["mde"] == pytest.approx(3.76106 * 0.02 / math.sqrt(5), rel=1e-4)


def test_a_compared_arm_without_data_still_counts_in_holms_family(tmp_path, monkeypatch):
    """``mid`` has no finished run: its comparison has no p-value, which counts as 1 in the family, so ``high``'s
    p of 0.03 is doubled by Holm (0.06) and ``high`` is not labelled better."""
    values = {"low": dict(zip(SEEDS, BASE, strict=True)), "high": with_p(0.03)}
    data = report_of(tmp_path, monkeypatch, values, seeds=SEEDS)
    primary = data["summary"]["val/avg@k"]["versus_baseline"]
    assert primary["mid"]["n"] == 0 and primary["mid"]["p_holm"] == 1.0
    assert primary["mid"]["label"] == stats.INCONCLUSIVE
    assert primary["high"]["p"] == pytest.approx(0.03) and primary["high"]["p_holm"] == pytest.approx(0.06)
    assert primary["high"]["ci_low"] > 0 and primary["high"]["label"] == stats.NO_EFFECT


def test_no_comparison_is_labelled_on_its_data_before_the_calibration_passed():
    """A clear gain (p ~ 1e-4) is labelled better after a passed calibration only: inconclusive while the calibration
    is incomplete or its spread is not estimable (neither passed nor failed), not testable after it failed."""
    base = dict(zip(SEEDS, BASE, strict=True))
    arm = shifted(0.2, 0.02)
    labels = {}
    for status in ("passed", "incomplete", "spread not estimable", "failed"):
        comparisons = {"high": report.compare(arm, base)}
        report.label_family(comparisons, 0.1, {"status": status})
        labels[status] = comparisons["high"]["label"]
    assert labels == {"passed": stats.BETTER, "incomplete": stats.INCONCLUSIVE,
                      "spread not estimable": stats.INCONCLUSIVE, "failed": stats.NOT_TESTABLE}


def test_a_study_locked_by_an_older_tether_resumes_and_reports(tmp_path, monkeypatch, fake_runner):
    """A lock written before ``design_sha256`` and the arms' ``files`` existed, by a tether whose schema lacked a
    setting added since (each arm's resolved config now holds its default): the study resumes its missing run and
    reports. The added key read as a changed arm ("algorithm.loss_kwargs: '(absent)' -> {}"), which stopped every
    resumed study after an upgrade. A real change to an arm is still refused."""
    import shutil

    monkeypatch.setattr(experiment, "code_state", lambda root=None: dict(CLEAN))
    path = three_arms(tmp_path)
    run_experiment(path)
    lock_path = tmp_path / "study" / "protocol.lock.json"
    lock = json.loads(lock_path.read_text())
    del lock["protocol"]["design_sha256"]
    for entry in lock["arms"].values():
        del entry["files"], entry["config"]["algorithm"]["loss_kwargs"], entry["config"]["rollout"]["top_k"]
    lock_path.write_text(json.dumps(lock, indent=2))
    shutil.rmtree(tmp_path / "study" / "mid" / "seed1")  # the run the upgrade interrupted
    fake_runner.trained.clear()
    data = run_experiment(path)
    assert ("mid", 1) in fake_runner.trained and (tmp_path / "study" / "mid" / "seed1" / "endpoint.json").is_file()
    assert data["registration"]["arms_changed"] == [] and not data["registration"]["design_changed"]
    assert data["summary"]["val/avg@k"]["arms"]["mid"]["n"] == 2
    assert "arm configs changed: **none**" in (tmp_path / "study" / "report.md").read_text()
    path.write_text(path.read_text().replace("optim.lr=3e-3", "optim.lr=4e-3"))
    with pytest.raises(ConfigError, match=r"arm 'mid': optim.lr: 0.003 -> 0.004\. Runs "):
        run_experiment(path)
