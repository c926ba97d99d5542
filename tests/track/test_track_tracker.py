"""Sinks and the Tracker: JSONL round-trip, TensorBoard events, tensor conversion, optional trackers."""

import json
import math
import sys
from types import SimpleNamespace

import pytest
import torch

from tether.track import JsonlSink, Tracker, build_tracker, mlflow_key, to_floats, write_json_atomic

CODE = {"tether": "9.9", "commit": None}  # the code a run records beside its settings (tether/provenance.py)


@pytest.fixture(autouse=True)
def fixed_code(monkeypatch):
    monkeypatch.setattr("tether.track.tracker.code_provenance", lambda: dict(CODE))


class ListSink:
    def __init__(self):
        self.calls, self.closed = [], False

    def log(self, metrics, step):
        self.calls.append((step, dict(metrics)))

    def close(self):
        self.closed = True


def test_jsonl_sink_round_trip(tmp_path):
    sink = JsonlSink(tmp_path / "run" / "metrics.jsonl")
    sink.log({"train/reward_mean": 0.5, "val/pass@k": 1.0}, step=0)
    sink.log({"actor/pg_loss": float("nan")}, step=1)
    # flushed per call: readable before close
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    sink.close()
    rows = [json.loads(line) for line in lines]
    assert rows[0] == {"step": 0, "train/reward_mean": 0.5, "val/pass@k": 1.0}
    assert rows[1]["step"] == 1 and math.isnan(rows[1]["actor/pg_loss"])


def test_to_floats_converts_every_kind():
    out = to_floats({
        "a": torch.tensor(1.5, requires_grad=True) * 2,
        "b": torch.tensor([3], dtype=torch.int64),
        "c": torch.tensor(True),
        "d": 2,
        "e": None,
        "f": torch.tensor(0.25, dtype=torch.bfloat16),
    })
    assert out == {"a": 3.0, "b": 3.0, "c": 1.0, "d": 2.0, "f": 0.25}
    assert list(out) == ["a", "b", "c", "d", "f"]  # the caller's order
    assert all(type(v) is float for v in out.values())


def test_to_floats_rejects_non_scalars():
    with pytest.raises(ValueError, match="'loss' is a tensor of shape \\(2,\\)"):
        to_floats({"loss": torch.zeros(2)})
    with pytest.raises(ValueError, match="'name' is not a number"):
        to_floats({"name": "x"})


def test_tracker_fans_out_floats_and_closes_all(tmp_path):
    first, second = ListSink(), ListSink()
    with Tracker(tmp_path, [first, second]) as tracker:
        logged = tracker.log({"x": torch.tensor(2.0), "y": 1}, step=3)
        tracker.log({"z": None}, step=4)  # nothing left: no empty rows in the sinks
    assert logged == {"x": 2.0, "y": 1.0}
    assert first.calls == second.calls == [(3, {"x": 2.0, "y": 1.0})]
    assert first.closed and second.closed


def test_summary_file_and_no_config_file(tmp_path):
    tracker = Tracker(tmp_path, [ListSink()])
    tracker.log_config({"task": {"name": "reasoning_gym", "kwargs": {"ops": ("+", "-")}}, "lr": 1e-6})
    tracker.write_summary({"val/avg@k": torch.tensor(0.5), "steps": 10})
    assert json.loads((tmp_path / "summary.json").read_text()) == {"val/avg@k": 0.5, "steps": 10}
    write_json_atomic(tmp_path / "summary.json", {"steps": 11})  # replaced, no temp file left
    # config.yaml is the command's to write (dump_config keeps the config's mapping keys), never the tracker's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_build_tracker_writes_jsonl_and_tensorboard(tmp_path):
    run = tmp_path / "run"
    with build_tracker(run) as tracker:
        tracker.log({"train/reward_mean": torch.tensor(0.25)}, step=0)
        tracker.log({"train/reward_mean": 0.75, "val/avg@k": 0.5}, step=1)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": 0, "train/reward_mean": 0.25},
                    {"step": 1, "train/reward_mean": 0.75, "val/avg@k": 0.5}]
    events = list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0


def test_the_config_and_its_provenance_reach_tensorboard_as_yaml(tmp_path):
    """torch's version is a TorchVersion, a str subclass yaml.safe_dump cannot represent: with the provenance in the
    config, every run whose TensorBoard sink was on (the default) stopped at its start."""
    import enum

    import yaml

    from tether.track.sinks import to_yaml

    class Mode(enum.IntEnum):
        ON = 1

    with build_tracker(tmp_path / "run") as tracker:
        tracker.log_config({"seed": 0, "model": {"name": "tiny"}})
    config = {"torch": torch.__version__, "mode": Mode.ON, "seed": 0}
    assert yaml.safe_load(to_yaml(config)) == {"torch": str(torch.__version__), "mode": 1, "seed": 0}
    events = list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and b"provenance" in events[0].read_bytes()


def test_a_resumed_run_hides_the_steps_an_earlier_process_logged_past_its_checkpoint(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    with build_tracker(run) as first:  # killed after step 5; its last checkpoint was step 3
        for step in range(1, 6):
            first.log({"train/loss": float(step)}, step=step)
    with build_tracker(run, resumed_at=3) as resumed:  # steps 4 and 5 again, with other values
        for step in (4, 5):
            resumed.log({"train/loss": 10.0 * step}, step=step)
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0),
                                                                        (5, 50.0)]


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_configured_but_missing_tracker_is_explained(tmp_path, monkeypatch, name):
    monkeypatch.setitem(sys.modules, name, None)  # makes `import name` raise ImportError
    with pytest.raises(ImportError, match=f"{name} is configured but not installed: pip install {name}"):
        build_tracker(tmp_path / "run", tensorboard=False, **{name: {}})
    assert not (tmp_path / "run").exists()  # failed before creating anything


def test_mlflow_key():
    assert mlflow_key("val/pass@8") == "val/pass_at_8"
    assert mlflow_key("armor/anchor frac%") == "armor/anchor frac_"


def test_wandb_and_mlflow_sinks_call_their_apis(tmp_path, monkeypatch):
    calls = []

    class Run:
        config = SimpleNamespace(update=lambda cfg, allow_val_change: calls.append(("wandb.config", cfg)))

        def log(self, metrics, step):
            calls.append(("wandb.log", step, metrics))

        def finish(self):
            calls.append(("wandb.finish",))

    Run.id = "w1"
    fake_wandb = SimpleNamespace(init=lambda **kw: calls.append(("wandb.init", kw)) or Run())
    fake_mlflow = SimpleNamespace(
        set_tracking_uri=lambda uri: calls.append(("mlflow.uri", uri)),
        set_experiment=lambda name: calls.append(("mlflow.experiment", name)),
        start_run=lambda run_name, tags: calls.append(("mlflow.start", run_name)) or mlflow_run("m1"),
        log_metrics=lambda metrics, step: calls.append(("mlflow.log", step, metrics)),
        log_params=lambda params: calls.append(("mlflow.params", params)),
        end_run=lambda: calls.append(("mlflow.end",)),
    )
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb)
    monkeypatch.setitem(sys.modules, "mlflow", fake_mlflow)
    with build_tracker(tmp_path, tensorboard=False, wandb={"project": "p", "mode": "offline"},
                       mlflow={"tracking_uri": "file:/tmp/x", "experiment": "e", "run_name": "r"}) as tracker:
        tracker.log({"val/pass@k": torch.tensor(0.5)}, step=7)
        tracker.log_config({"optim": {"lr": 1e-6}})
    assert ("wandb.init", {"dir": str(tmp_path), "project": "p", "mode": "offline"}) in calls
    assert ("wandb.log", 7, {"val/pass@k": 0.5}) in calls
    assert ("mlflow.log", 7, {"val/pass_at_k": 0.5}) in calls
    assert ("mlflow.params", {"optim.lr": 1e-6, "provenance.tether": "9.9", "provenance.commit": None}) in calls
    assert ("wandb.config", {"optim": {"lr": 1e-6}, "provenance": CODE}) in calls
    assert calls[-2:] == [("wandb.finish",), ("mlflow.end",)]
    with pytest.raises(ValueError, match="unknown mlflow settings"):
        build_tracker(tmp_path / "b", tensorboard=False, mlflow={"experimant": "e"})
    assert not (tmp_path / "b").exists()


def mlflow_run(run_id: str, params: dict[str, str] | None = None) -> SimpleNamespace:
    """What ``mlflow.start_run`` returns, as far as the sink reads it: the run's id and the params it holds."""
    return SimpleNamespace(info=SimpleNamespace(run_id=run_id), data=SimpleNamespace(params=dict(params or {})))


class FakeTrackers:
    """wandb and mlflow as far as the sinks use them; each new run gets the next id, ``start_run(run_id=...)``
    reopens a known one (an unknown one raises, as MLflow does)."""

    def __init__(self) -> None:
        self.inits: list[dict] = []
        self.mlflow_runs: list[str] = []
        self.reopened: list[str] = []
        self.wandb = SimpleNamespace(init=self.wandb_init)
        self.params: dict[str, dict[str, str]] = {}  # run id -> its params, as strings
        self.active: str | None = None
        self.mlflow = SimpleNamespace(set_tracking_uri=lambda uri: None, set_experiment=lambda name: None,
                                      start_run=self.start_run, log_metrics=lambda metrics, step: None,
                                      log_params=self.log_params, end_run=lambda: None)

    def wandb_init(self, **settings):
        self.inits.append(settings)
        run_id = settings.get("id", f"w{len(self.inits)}")
        return SimpleNamespace(id=run_id, log=lambda metrics, step: None, finish=lambda: None)

    def start_run(self, run_id=None, run_name=None, tags=None):
        if run_id is not None:
            if run_id not in self.mlflow_runs:
                raise RuntimeError(f"Run '{run_id}' not found")
            self.reopened.append(run_id)
            self.active = run_id
            return mlflow_run(run_id, self.params[run_id])
        self.mlflow_runs.append(f"m{len(self.mlflow_runs) + 1}")
        self.active = self.mlflow_runs[-1]
        self.params[self.active] = {}
        return mlflow_run(self.active)

    def log_params(self, params):
        """MLflow's rule (its stores' ``Changing param values is not allowed``): a param is logged once; the same
        value again is accepted, another one is refused and nothing of the call is logged."""
        run = self.params[self.active]
        changed = [k for k, v in params.items() if k in run and run[k] != str(v)]
        if changed:
            raise RuntimeError(f"Changing param values is not allowed: {changed}")
        run.update({k: str(v) for k, v in params.items()})


@pytest.fixture
def trackers(monkeypatch) -> FakeTrackers:
    fake = FakeTrackers()
    monkeypatch.setitem(sys.modules, "wandb", fake.wandb)
    monkeypatch.setitem(sys.modules, "mlflow", fake.mlflow)
    return fake


def test_a_resumed_run_continues_its_wandb_and_mlflow_runs(tmp_path, trackers):
    settings = {"wandb": {"project": "p"}, "mlflow": {"experiment": "e"}}
    build_tracker(tmp_path, tensorboard=False, **settings).close()  # the first process
    assert json.loads((tmp_path / "trackers.json").read_text()) == {"wandb": "w1", "mlflow": "m1"}
    build_tracker(tmp_path, tensorboard=False, resumed_at=3, **settings).close()  # killed, resumed from step 3
    assert trackers.inits[1] == {"dir": str(tmp_path), "project": "p", "id": "w1", "resume": "allow"}
    assert trackers.reopened == ["m1"] and trackers.mlflow_runs == ["m1"]  # no second MLflow run
    build_tracker(tmp_path, tensorboard=False, **settings).close()  # train.overwrite: a run of its own
    assert "id" not in trackers.inits[2] and trackers.mlflow_runs == ["m1", "m2"]
    assert json.loads((tmp_path / "trackers.json").read_text()) == {"wandb": "w3", "mlflow": "m2"}


def test_a_resumed_mlflow_run_keeps_the_params_a_resume_changed_instead_of_failing(tmp_path, trackers):
    with build_tracker(tmp_path, tensorboard=False, mlflow={}) as tracker:
        tracker.log_config({"seed": 0, "train": {"steps": 10}})
    # the resume runs longer (train.steps is not a setting that changes what the run means) and logs more
    with (build_tracker(tmp_path, tensorboard=False, mlflow={}, resumed_at=5) as tracker,
          pytest.warns(UserWarning, match=r"train\.steps changed on resume")):
        tracker.log_config({"seed": 0, "train": {"steps": 20}, "logging": {"tensorboard": True}})
    assert trackers.reopened == ["m1"]
    assert trackers.params["m1"] == {"seed": "0", "train.steps": "10", "logging.tensorboard": "True",
                                     "provenance.tether": "9.9", "provenance.commit": "None"}


def test_a_wandb_id_or_resume_the_user_set_is_kept(tmp_path, trackers):
    build_tracker(tmp_path, tensorboard=False, wandb={}).close()
    build_tracker(tmp_path, tensorboard=False, wandb={"id": "mine"}, resumed_at=2).close()
    build_tracker(tmp_path, tensorboard=False, wandb={"resume": "never"}, resumed_at=2).close()
    assert trackers.inits[1:] == [{"dir": str(tmp_path), "id": "mine"}, {"dir": str(tmp_path), "resume": "never"}]


def test_an_mlflow_run_the_server_no_longer_has_starts_a_new_one_with_a_warning(tmp_path, trackers):
    (tmp_path / "trackers.json").write_text(json.dumps({"mlflow": "gone"}))
    with pytest.warns(UserWarning, match=r"MLflow could not continue run gone \(Run 'gone' not found\)"):
        build_tracker(tmp_path, tensorboard=False, mlflow={}, resumed_at=5).close()
    assert trackers.mlflow_runs == ["m1"]
    assert json.loads((tmp_path / "trackers.json").read_text()) == {"mlflow": "m1"}


def test_an_unreadable_trackers_file_starts_new_runs(tmp_path, trackers):
    (tmp_path / "trackers.json").write_text("{torn")
    build_tracker(tmp_path, tensorboard=False, wandb={}, resumed_at=5).close()
    assert trackers.inits == [{"dir": str(tmp_path)}]
