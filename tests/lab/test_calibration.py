"""The calibration runs before any comparison, and a failed one stops the study (tether/lab/calibration.py)."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from scipy import integrate
from scipy.stats import norm

from tests.lab.test_experiment import CLEAN, fake_run, write_config, write_protocol
from tether.lab import calibration as calibration_module
from tether.lab import experiment, stats
from tether.lab.calibration import endpoint_step, measure, selection_values
from tether.lab.experiment import load_protocol, run_experiment
from tether.lab.protocol import run_dir
from tether.lab.report import unfinished
from tether.track import read_metrics


@pytest.fixture(autouse=True)
def clean_code(monkeypatch):
    monkeypatch.setattr(experiment, "code_state", lambda root=None: dict(CLEAN))


def locate(protocol):
    return lambda arm, seed: run_dir(protocol, arm, seed)


def test_a_positive_control_is_its_lift_over_the_baseline_at_the_endpoint_step(tmp_path):
    protocol = load_protocol(write_protocol(tmp_path, write_config(tmp_path)))  # control: high; needs 0.1
    for seed, (low, high) in {0: (0.30, 0.45), 1: (0.32, 0.46)}.items():
        fake_run(protocol, "low", seed, start=0.2, end=low, step=2)
        fake_run(protocol, "high", seed, start=0.2, end=high, step=1)  # read at its own endpoint step
    result = measure(protocol, locate(protocol))
    assert result["per_seed"] == pytest.approx({0: 0.15, 1: 0.14})
    assert result["mean"] == pytest.approx(0.145) and result["status"] == "passed"
    fake_run(protocol, "high", 1, start=0.2, end=0.33)  # lift 0.01: mean 0.08 < 0.1
    assert measure(protocol, locate(protocol))["status"] == "failed"


def test_a_mean_that_reaches_min_movement_fails_while_its_interval_holds_no_movement(tmp_path):
    protocol = load_protocol(write_protocol(tmp_path, write_config(tmp_path)))  # control: high; needs 0.1
    for seed, lift in {0: 0.25, 1: -0.01}.items():  # mean 0.12 >= 0.1, but one seed did not move at all
        fake_run(protocol, "low", seed, start=0.2, end=0.3, step=2)
        fake_run(protocol, "high", seed, start=0.2, end=0.3 + lift, step=1)
    result = measure(protocol, locate(protocol))
    half = 12.706204736174707 * math.sqrt((0.13 ** 2 + 0.13 ** 2) / 1) / math.sqrt(2)  # t(0.975, 1) x sd / sqrt(2)
    assert result["mean"] == pytest.approx(0.12) and result["ci_low"] == pytest.approx(0.12 - half)
    assert result["ci_low"] < 0 and result["status"] == "failed"


def test_a_calibration_whose_movements_are_all_equal_is_not_passed(tmp_path):
    """Equal movements on every seed have a spread of 0: the t interval has zero width and "lay above 0", so the
    calibration passed on its mean alone. As for a comparison, the spread is not estimable, so the interval cannot
    be shown above 0; a mean below ``min_movement`` still fails, since the spread does not enter that rule."""
    protocol = load_protocol(write_protocol(tmp_path, write_config(tmp_path)))  # control: high; needs 0.1
    # lifts of 0.45 - 0.30 and 0.42 - 0.27: equal but for float rounding (5.6e-17 apart)
    ends = {0: (0.30, 0.45), 1: (0.27, 0.42)}
    lifts = [high - low for low, high in ends.values()]
    assert 0 < abs(lifts[0] - lifts[1]) < 1e-16
    for seed, (low, high) in ends.items():
        fake_run(protocol, "low", seed, start=0.2, end=low, step=2)
        fake_run(protocol, "high", seed, start=0.2, end=high, step=1)
    result = measure(protocol, locate(protocol))
    assert result["per_seed"] == {0: lifts[0], 1: lifts[1]} and result["mean"] == pytest.approx(sum(lifts) / 2)
    assert result["status"] == "spread not estimable" and math.isnan(result["ci_low"]) and math.isnan(result["ci_high"])
    fake_run(protocol, "high", 1, start=0.2, end=0.27 + 0.05, step=1)  # lifts 0.15 and 0.05: a spread
    result = measure(protocol, locate(protocol))
    assert result["ci_low"] == pytest.approx(0.1 - 12.706204736174707 * 0.05)  # t(0.975, 1) x sd / sqrt(2)
    assert result["status"] == "failed"
    for seed, (low, _) in ends.items():  # lifts of 0.05 on both seeds: below 0.1 on the mean alone
        fake_run(protocol, "high", seed, start=0.2, end=low + 0.05, step=1)
    assert measure(protocol, locate(protocol))["status"] == "failed"


def test_a_collapse_study_needs_a_fall_of_twice_the_test_size(tmp_path):
    # ARMOR's numbers: a peak of 0.617 falling to 0.549 is a fall of 0.068, under twice a test size of 0.10
    calibration = {"kind": "fall", "min_movement": 0.2, "why": "the fall is the premise"}
    protocol = load_protocol(write_protocol(tmp_path, write_config(tmp_path), calibration=calibration))
    for seed in (0, 1):
        fake_run(protocol, "low", seed, start=0.617, end=0.549)
    result = measure(protocol, locate(protocol))
    assert result["arm"] == "low" and result["mean"] == pytest.approx(0.068) and result["status"] == "failed"
    rise = {"kind": "rise", "arm": "high", "min_movement": 0.1, "why": "training moves it"}
    protocol = load_protocol(write_protocol(tmp_path, write_config(tmp_path), calibration=rise))
    fake_run(protocol, "high", 0, start=0.1, end=0.35)
    fake_run(protocol, "high", 1, start=0.1, end=0.25)
    assert measure(protocol, locate(protocol))["mean"] == pytest.approx(0.2)


@pytest.mark.parametrize("kind", ["fall", "rise"])
def test_a_fall_or_rise_reads_each_runs_metrics_once(tmp_path, monkeypatch, kind):
    calibration = {"kind": kind, "arm": "low", "min_movement": 0.2, "why": "the movement is the premise"}
    protocol = load_protocol(write_protocol(tmp_path, write_config(tmp_path), calibration=calibration))
    for seed in (0, 1):
        fake_run(protocol, "low", seed, start=0.6, end=0.3 + 0.1 * seed)
    read = []
    monkeypatch.setattr(calibration_module, "read_metrics", lambda path: read.append(path) or read_metrics(path))
    result = measure(protocol, locate(protocol))
    assert result["per_seed"] == pytest.approx({0: 0.3, 1: 0.2} if kind == "fall" else {0: -0.3, 1: -0.2})
    assert sorted(read) == [run_dir(protocol, "low", seed) / "metrics.jsonl" for seed in (0, 1)]


def test_a_run_not_yet_trained_leaves_the_calibration_incomplete(tmp_path):
    protocol = load_protocol(write_protocol(tmp_path, write_config(tmp_path)))
    fake_run(protocol, "low", 0)
    result = measure(protocol, locate(protocol))
    assert result["status"] == "incomplete"
    assert result["missing"] == ["high/seed0", "high/seed1", "low/seed1"]
    for arm, seed in [("high", 0), ("high", 1), ("low", 1)]:
        fake_run(protocol, arm, seed)
    (run_dir(protocol, "high", 1) / "best.txt").unlink()  # trained, but no validation became the best
    result = measure(protocol, locate(protocol))
    assert result["status"] == "incomplete" and "no best.txt" in result["missing"][0]
    # a NaN validation would compare below any minimum: a failed calibration ends the study as not testable
    fake_run(protocol, "high", 1, start=0.2, end=float("nan"))
    result = measure(protocol, locate(protocol))
    assert result["status"] == "incomplete" and result["missing"][0].endswith(
        "'val/avg@k' on the selection split at step 1 is nan")


class FakeRunner:
    """Stands in for ``tether train`` and ``tether eval``: writes what they would, from a table of selection
    values (per arm: (start, end), the end a value or a function of the seed) and endpoint values (per arm: a
    value, plus 0.01 x seed, or a function of the seed), and records every call."""

    def __init__(self, selection, endpoint):
        self.selection, self.endpoint, self.trained, self.evaluated = selection, endpoint, [], []

    def train_one(self, protocol, arm, seed):
        self.trained.append((arm, seed))
        fake_run(protocol, arm, seed, start=self.selection[arm][0], end=self.selection_end(arm, seed))

    def selection_end(self, arm, seed):
        end = self.selection[arm][1]
        return end(seed) if callable(end) else end

    def run_one(self, protocol, arm, seed):
        if (arm, seed) not in self.trained:
            self.train_one(protocol, arm, seed)
        self.evaluated.append((arm, seed))
        endpoint = self.endpoint[arm]
        fake_run(protocol, arm, seed, start=self.selection[arm][0], end=self.selection_end(arm, seed),
                 value=endpoint(seed) if callable(endpoint) else endpoint + 0.01 * seed)


def three_arms(tmp_path, **changes):
    config = write_config(tmp_path)
    arms = {"low": {"config": str(config)}, "high": {"config": str(config), "overrides": ["optim.lr=1e-2"]},
            "mid": {"config": str(config), "overrides": ["optim.lr=3e-3"]}}
    return write_protocol(tmp_path, config, arms=arms, **changes)


def test_a_failed_calibration_runs_no_comparison(tmp_path, monkeypatch):
    runner = FakeRunner(selection={"low": (0.2, 0.30), "high": (0.2, 0.33), "mid": (0.2, 0.3)},
                        endpoint={"low": 0.3, "high": 0.5, "mid": 0.3})
    monkeypatch.setattr(experiment, "train_one", runner.train_one)
    monkeypatch.setattr(experiment, "run_one", runner.run_one)
    data = run_experiment(three_arms(tmp_path))
    assert sorted(runner.trained) == [("high", 0), ("high", 1), ("low", 0), ("low", 1)]  # the control's runs only
    assert runner.evaluated == [] and not list((tmp_path / "study").glob("*/seed*/endpoint.json"))
    assert data["calibration"]["status"] == "failed" and data["calibration"]["mean"] == pytest.approx(0.03)
    primary = data["summary"]["val/avg@k"]["versus_baseline"]
    assert {arm: c["label"] for arm, c in primary.items()} == {"high": stats.NOT_TESTABLE, "mid": stats.NOT_TESTABLE}
    report = (tmp_path / "study" / "report.md").read_text()
    assert "Measured movement +0.030" in report and "**failed**; no comparison was run" in report
    assert report.count("**not testable in this setting**") == 2


def test_a_calibration_with_equal_movements_runs_no_comparison_and_labels_none(tmp_path, monkeypatch):
    """Lifts of 0.45 - 0.30 on every seed: not passed, yet not shown to fail either, so nothing more runs (the
    same seeds would give the same movements), every comparison is inconclusive, and the study is finished."""
    runner = FakeRunner(selection={"low": (0.2, 0.30), "high": (0.2, 0.45), "mid": (0.2, 0.3)},
                        endpoint={"low": 0.3, "high": 0.5, "mid": 0.3})
    monkeypatch.setattr(experiment, "train_one", runner.train_one)
    monkeypatch.setattr(experiment, "run_one", runner.run_one)
    data = run_experiment(three_arms(tmp_path))
    assert runner.evaluated == [] and sorted(runner.trained) == [("high", 0), ("high", 1), ("low", 0), ("low", 1)]
    assert data["calibration"]["status"] == stats.SPREAD_NOT_ESTIMABLE
    assert data["calibration"]["mean"] == 0.45 - 0.30 and math.isnan(data["calibration"]["ci_low"])
    primary = data["summary"]["val/avg@k"]["versus_baseline"]
    assert {arm: c["label"] for arm, c in primary.items()} == {"high": stats.INCONCLUSIVE, "mid": stats.INCONCLUSIVE}
    report_md = (tmp_path / "study" / "report.md").read_text()
    assert "Measured movement +0.150 [n/a, n/a]" in report_md
    assert "**spread not estimable**; no comparison was run" in report_md
    assert unfinished(data) == []  # finished: publishable, and a requirement on it is refused


def test_a_calibration_on_one_seed_is_not_failed_for_want_of_a_spread(tmp_path, monkeypatch):
    """One seed's lift of 0.15 reaches 0.1, but one movement has no spread, so no interval: it failed, and every
    comparison read *not testable in this setting*. It is the state of equal movements: spread not estimable,
    nothing else runs, every comparison inconclusive; a lift below 0.1 still fails on the mean alone."""
    runner = FakeRunner(selection={"low": (0.2, 0.30), "high": (0.2, 0.45), "mid": (0.2, 0.3)},
                        endpoint={"low": 0.3, "high": 0.5, "mid": 0.3})
    monkeypatch.setattr(experiment, "train_one", runner.train_one)
    monkeypatch.setattr(experiment, "run_one", runner.run_one)
    one_seed = {"kind": "positive_control", "arm": "high", "min_movement": 0.1, "seeds": [1], "why": "w"}
    data = run_experiment(three_arms(tmp_path, calibration=one_seed))
    assert runner.evaluated == [] and sorted(runner.trained) == [("high", 1), ("low", 1)]
    c = data["calibration"]
    assert c["status"] == stats.SPREAD_NOT_ESTIMABLE and c["per_seed"] == {1: 0.45 - 0.30}
    assert c["mean"] == 0.45 - 0.30 and (c["ci_low"], c["ci_high"]) == (-math.inf, math.inf)
    primary = data["summary"]["val/avg@k"]["versus_baseline"]
    assert {arm: c["label"] for arm, c in primary.items()} == {"high": stats.INCONCLUSIVE, "mid": stats.INCONCLUSIVE}
    assert "Measured movement +0.150 [n/a, n/a] (per seed: 1: +0.150): **spread not estimable**" in (
        tmp_path / "study" / "report.md").read_text()
    assert unfinished(data) == []
    protocol = load_protocol(tmp_path / "protocol.yaml")
    fake_run(protocol, "high", 1, start=0.2, end=0.35, step=1)  # a lift of 0.05: short of 0.1 whatever the spread
    assert measure(protocol, locate(protocol))["status"] == "failed"


def control_end(seed):
    """The positive control's selection value: a lift of 0.15 or 0.16 over the baseline's 0.30, so the
    calibration's interval has a spread (it lies above 0: +0.155 +- 12.7 x 0.005)."""
    return 0.45 + 0.01 * seed


def test_a_passed_calibration_runs_every_arm_and_labels_them(tmp_path, monkeypatch):
    runner = FakeRunner(selection={"low": (0.2, 0.30), "high": (0.2, control_end), "mid": (0.2, 0.3)},
                        endpoint={"low": 0.3, "high": 0.5, "mid": 0.3})
    monkeypatch.setattr(experiment, "train_one", runner.train_one)
    monkeypatch.setattr(experiment, "run_one", runner.run_one)
    data = run_experiment(three_arms(tmp_path))
    assert sorted(runner.evaluated) == sorted((arm, seed) for arm in ("low", "high", "mid") for seed in (0, 1))
    assert data["calibration"]["status"] == "passed"
    json.loads((tmp_path / "study" / "report.json").read_text())  # all of it serialisable
    labels = {arm: c["label"] for arm, c in data["summary"]["val/avg@k"]["versus_baseline"].items()}
    # +0.2 on every seed, 0 on every seed: no spread, so neither a test nor an interval (p was 0 and 1)
    assert labels == {"high": stats.SPREAD_NOT_ESTIMABLE, "mid": stats.SPREAD_NOT_ESTIMABLE}
    assert "**spread not estimable**" in (tmp_path / "study" / "report.md").read_text()


def test_a_passed_calibration_labels_comparisons_with_a_spread(tmp_path, monkeypatch):
    runner = FakeRunner(selection={"low": (0.2, 0.30), "high": (0.2, control_end), "mid": (0.2, 0.3)},
                        endpoint={"low": 0.3, "high": lambda seed: 0.5 + 0.01 * seed + 0.005 * (seed % 2),
                                  "mid": lambda seed: 0.3 + 0.01 * seed + 0.001 * (seed % 2)})
    monkeypatch.setattr(experiment, "train_one", runner.train_one)
    monkeypatch.setattr(experiment, "run_one", runner.run_one)
    data = run_experiment(three_arms(tmp_path))
    labels = {arm: c["label"] for arm, c in data["summary"]["val/avg@k"]["versus_baseline"].items()}
    assert labels == {"high": stats.BETTER, "mid": stats.NO_EFFECT}  # +0.2 or +0.205 a seed; 0 or +0.001


def write_curve(protocol, arm, seed, rows, best_step, latest_step):
    """A trained run whose selection-split validations are ``rows`` (step, value), in the order logged."""
    directory = run_dir(protocol, arm, seed)
    (directory / "checkpoints").mkdir(parents=True, exist_ok=True)
    metric = protocol.endpoint.metric
    lines = [json.dumps({"step": step, metric: value}) for step, value in rows]
    (directory / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 9, "val/av')  # a line cut by a kill
    (directory / "best.txt").write_text(f"{metric}=0.75 step={best_step}\n")
    (directory / "checkpoints" / "latest").write_text(f"step_{latest_step:06d}")
    (directory / "trained.json").write_text("{}")


def test_a_movement_equal_to_min_movement_passes(tmp_path):
    rise = {"kind": "rise", "min_movement": 0.25, "why": "training moves it"}
    protocol = load_protocol(write_protocol(tmp_path, write_config(tmp_path), calibration=rise))
    for seed, off in ((0, -2**-10), (1, 2**-10)):  # rises of 0.25 -+ 2^-10: a mean of exactly 0.25 in binary
        write_curve(protocol, "low", seed, [(0, 0.25), (1, 0.5 + off)], best_step=1, latest_step=1)
    result = measure(protocol, locate(protocol))
    assert result["mean"] == 0.25 and result["ci_low"] == pytest.approx(0.25 - 12.706204736174707 * 2**-10)
    assert result["status"] == "passed"
    write_curve(protocol, "low", 1, [(0, 0.25), (1, 0.5 - 2**-20)], best_step=1, latest_step=1)
    assert measure(protocol, locate(protocol))["status"] == "failed"


def test_the_endpoint_step_is_the_best_validation_or_the_last_step_as_the_protocol_says(tmp_path):
    """``at: best`` reads the step best.txt names, ``at: final`` the step checkpoints/latest names; a step logged
    twice (a resumed run) counts at its later row. A rise reads the last step under either."""
    rows = [(0, 0.25), (1, 0.5), (2, 0.375), (1, 0.75), (2, 0.5)]  # resumed after step 2: steps 1 and 2 again
    results = {}
    for kind, at in itertools.product(("fall", "rise"), ("best", "final")):
        calibration = {"kind": kind, "min_movement": 0.2, "why": "training moves it"}
        protocol = load_protocol(write_protocol(tmp_path / kind / at, write_config(tmp_path), calibration=calibration,
                                                endpoint={"metric": "val/avg@k", "split": "report", "at": at}))
        for seed in (0, 1):
            write_curve(protocol, "low", seed, rows, best_step=1, latest_step=2)
        assert selection_values(run_dir(protocol, "low", 0), "val/avg@k") == {0: 0.25, 1: 0.75, 2: 0.5}
        assert endpoint_step(run_dir(protocol, "low", 0), at) == {"best": 1, "final": 2}[at]
        results[kind, at] = measure(protocol, locate(protocol))["per_seed"]
    assert results["fall", "best"] == {0: -0.5, 1: -0.5} and results["fall", "final"] == {0: -0.25, 1: -0.25}
    assert results["rise", "best"] == results["rise", "final"] == {0: 0.25, 1: 0.25}


def noise_curves(protocol, rng, validations, se):
    """Selection-split validations of pure noise around a flat 0.3 (step 0 and ``validations`` steps after it),
    each run's best step chosen as the trainer does (the largest after step 0, ties the earliest). Returns the
    values per seed, in step order."""
    curves = {}
    for seed in protocol.seeds:
        values = (0.3 + se * rng.standard_normal(validations + 1)).tolist()
        best = 1 + int(np.argmax(values[1:]))
        write_curve(protocol, "low", seed, list(enumerate(values)), best_step=best, latest_step=validations)
        curves[seed] = values
    return curves


def test_a_rise_of_pure_noise_reads_no_rise_even_at_the_best_checkpoint(tmp_path):
    """With ``at: best`` a rise read at the best step is the largest of the noisy validations that chose it: flat
    runs "rose" by the expected maximum of k standard normals times the standard error, +0.085 for k = 8 and
    s = 0.06, and passed a min_movement of 0.05. Read at the last step, it is unbiased."""
    k, se, seeds = 8, 0.06, 200
    rise = {"kind": "rise", "min_movement": 0.05, "why": "training moves it"}
    protocol = load_protocol(write_protocol(tmp_path, write_config(tmp_path), calibration=rise,
                                            test_size={"delta": 0.05, "derivation": "d"}, seeds=list(range(seeds))))
    curves = noise_curves(protocol, np.random.default_rng(0), k, se)
    result = measure(protocol, locate(protocol))
    assert result["per_seed"] == {seed: values[-1] - values[0] for seed, values in curves.items()}
    # the winner's curse the best step would add: E[max of k N(0, 1)], by quadrature in float64
    curse = se * integrate.quad(lambda x: x * k * norm.pdf(x) * norm.cdf(x) ** (k - 1), -np.inf, np.inf)[0]
    assert curse == pytest.approx(0.0854, abs=1e-4)
    at_best = np.mean([max(values[1:]) - values[0] for values in curves.values()])
    spread = se * math.sqrt(2 / seeds)  # the mean over seeds of a difference of two validations
    assert at_best == pytest.approx(curse, abs=3 * spread)  # what the best step read, and passed on
    assert abs(result["mean"]) < 3 * spread and result["status"] == "failed"


def test_a_real_rise_passes_read_at_the_last_step(tmp_path):
    rise = {"kind": "rise", "min_movement": 0.1, "why": "training moves it"}
    protocol = load_protocol(write_protocol(tmp_path, write_config(tmp_path), calibration=rise,
                                            seeds=list(range(20))))
    rng = np.random.default_rng(1)
    curves = {}
    for seed in protocol.seeds:  # 0.3 rising by 0.025 a validation to +0.2 at step 8, with noise of 0.06
        values = (0.3 + 0.025 * np.arange(9) + 0.06 * rng.standard_normal(9)).tolist()
        write_curve(protocol, "low", seed, list(enumerate(values)), best_step=1 + int(np.argmax(values[1:])),
                    latest_step=8)
        curves[seed] = values
    result = measure(protocol, locate(protocol))
    assert result["mean"] == pytest.approx(np.mean([v[-1] - v[0] for v in curves.values()]), abs=1e-12)
    assert result["mean"] == pytest.approx(0.2, abs=3 * 0.06 * math.sqrt(2 / 20)) and result["status"] == "passed"


def test_selection_values_skip_a_torn_line_and_a_line_that_is_no_row(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "val/avg@k": 0.25}\n3\n{"step": 4, "val/avg@k": 0.5}\n'
                                            '{"step": 8, "val/av')
    assert selection_values(tmp_path, "val/avg@k") == {0: 0.25, 4: 0.5}
