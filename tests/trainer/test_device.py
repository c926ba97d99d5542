"""``train.device``: resolved against the machine before any model loads, and where the strategy puts models.

There is no GPU here: a GPU machine is faked by monkeypatching ``torch.cuda``, and placement is checked on the
``meta`` device, a second device every machine has. Device mixing through whole RL steps is checked in
test_device_mixing.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.rollout.helpers import seed_sft_config
from tests.trainer.helpers import tiny_config
from tether.config import ConfigError
from tether.distributed import DataParallel, Replicate, resolve_device
from tether.recipes.seed_sft import run_skill_sft
from tether.trainer import Trainer, evaluate


@pytest.fixture
def gpus(monkeypatch):
    """``gpus(n)``: this machine shows ``n`` CUDA GPUs (0: no CUDA); torchrun's variables are cleared."""
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)

    def fake(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)

    return fake


@pytest.mark.parametrize(("spec", "n_gpus", "env", "expected"), [
    ("auto", 0, {}, "cpu"),
    ("cpu", 2, {}, "cpu"),
    ("auto", 2, {}, "cuda:0"),
    ("auto", 2, {"LOCAL_RANK": "1", "WORLD_SIZE": "2"}, "cuda:1"),  # torchrun: each rank its own GPU
    ("cuda", 2, {"LOCAL_RANK": "1", "WORLD_SIZE": "2"}, "cuda:1"),
    ("cuda", 1, {}, "cuda:0"),
    ("cuda:1", 2, {}, "cuda:1"),
])
def test_device_resolution(gpus, monkeypatch, spec, n_gpus, env, expected):
    gpus(n_gpus)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert resolve_device(spec) == torch.device(expected)


@pytest.mark.parametrize(("spec", "n_gpus", "env", "message"), [
    ("cuda", 0, {}, r"train\.device=cuda: (this torch build has no CUDA|.* sees no GPU).*; allowed here: auto or cpu"),
    ("cuda:0", 0, {}, r"train\.device=cuda:0: (this torch build has no CUDA|.* sees no GPU).*; allowed here: auto or "
                      "cpu"),
    ("cuda:2", 2, {}, r"train\.device=cuda:2: GPU 2 but this machine shows 2 GPU\(s\) \(cuda:0\.\.cuda:1\)"),
    ("auto", 2, {"LOCAL_RANK": "3", "WORLD_SIZE": "4"}, r"LOCAL_RANK=3 but this machine shows 2 GPU"),
    ("cuda:1", 2, {"LOCAL_RANK": "0", "WORLD_SIZE": "2"}, r"cuda:1 would put all 2 torchrun ranks on one GPU"),
])
def test_device_errors_name_the_key_the_value_and_the_way_out(gpus, monkeypatch, spec, n_gpus, env, message):
    gpus(n_gpus)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError, match=message):
        resolve_device(spec)


def test_a_cuda_build_without_a_visible_gpu_says_what_it_sees(gpus, monkeypatch):
    gpus(0)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ConfigError, match=r"train\.device=cuda: torch .* \(CUDA 12\.8\) sees no GPU "
                                          r"\(CUDA_VISIBLE_DEVICES=\); allowed here: auto or cpu"):
        resolve_device("cuda")


def no_model_loads(*args, **kwargs):
    raise AssertionError("a model was loaded before the device was checked")


def test_cuda_without_a_gpu_stops_the_trainer_before_any_work(tmp_path, gpus, monkeypatch):
    gpus(0)
    monkeypatch.setattr("tether.trainer.build.load_policy", no_model_loads)
    cfg = tiny_config(tmp_path, "train.device=cuda")
    with pytest.raises(ConfigError, match=r"train\.device=cuda: .*allowed here: auto or cpu"):
        Trainer(cfg)
    assert not Path(cfg.run_dir).exists()  # not even the run directory


def test_cuda_without_a_gpu_stops_eval_and_seed_sft_before_any_model_loads(tmp_path, gpus, monkeypatch):
    gpus(0)
    monkeypatch.setattr("tether.trainer.evaluation.load_policy", no_model_loads)
    monkeypatch.setattr("tether.models.load_policy", no_model_loads)
    with pytest.raises(ConfigError, match=r"train\.device=cuda:0"):
        evaluate(tiny_config(tmp_path / "eval", "train.device=cuda:0"))
    sft = seed_sft_config(tmp_path / "sft", "train.device=cuda", methods={"seed": {}})
    with pytest.raises(ConfigError, match=r"train\.device=cuda"):
        run_skill_sft(sft)
    assert not Path(sft.run_dir).exists()


def test_the_replicated_layout_moves_the_whole_model_to_its_device(tiny_policy):
    model, _ = tiny_policy
    meta = torch.device("meta")  # a device that is not the CPU, on any machine
    out = Replicate(DataParallel(), meta).prepare(model)
    assert out is model
    assert {t.device for t in [*model.parameters(), *model.buffers()]} == {meta}


def test_the_process_group_backend_and_the_current_gpu_follow_the_device(gpus, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", device)))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend: calls.append(("init", backend)))
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    gpus(2)
    DataParallel.from_env(torch.device("cuda", 1))  # one process on GPU 1: no group, but GPU 1 is current
    assert calls == [("set_device", torch.device("cuda", 1))]
    monkeypatch.setenv("WORLD_SIZE", "2")
    calls.clear()
    dp = DataParallel.from_env(torch.device("cuda", 1))
    assert calls == [("set_device", torch.device("cuda", 1)), ("init", "nccl")] and (dp.rank, dp.world_size) == (1, 2)
    calls.clear()
    DataParallel.from_env(torch.device("cpu"))  # train.device=cpu on a GPU machine: gloo, no GPU touched
    assert calls == [("init", "gloo")]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error a machine without CUDA gives")
@pytest.mark.parametrize("command", [["train", "quickstart.yaml"], ["seed-sft", "seed/sft.yaml"]])
def test_cli_reports_a_missing_gpu_in_one_line(command, tmp_path):
    from typer.testing import CliRunner

    from tether.cli import app

    config = Path(__file__).parents[2] / "configs" / command[1]
    out = CliRunner().invoke(app, [command[0], str(config), "train.device=cuda", f"run_dir={tmp_path / 'run'}"])
    assert out.exit_code == 2 and "train.device=cuda" in out.output and "Traceback" not in out.output
    assert not (tmp_path / "run").exists()  # refused before the run directory
