"""On a real GPU only (skipped without one): the GPU computes what the CPU computes, and what only a GPU has
(NCCL, FSDP2 on a CUDA mesh, bfloat16 autocast, ``torchrun``) runs.

tests/trainer/test_device_mixing.py runs every method's whole RL step on the GPU as well; this module compares
numbers with the CPU. Run it on a GPU machine with ``python -m pytest tests/trainer -k "cuda"``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from tests.distributed.helpers import PROMPTS, UPDATE, spawn_ranks
from tests.distributed.test_fsdp2 import FSDP, make_trainer, shards
from tests.distributed.test_fsdp2 import update_fixed_batch as update
from tests.trainer.helpers import tiny_config
from tether.engine.base import SamplingParams
from tether.engine.hf import HFEngine
from tether.models import forward, tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (CUDA)")

GPU = torch.device("cuda", 0)
REPO = Path(__file__).resolve().parents[2]


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """``||got - want|| / ||want||``, on the CPU in float64."""
    got, want = got.double().cpu(), want.double().cpu()
    return float((got - want).norm() / want.norm())


def test_the_update_on_the_gpu_equals_the_cpu_update_in_float64(tmp_path):
    # float64 weights, but HF's RMSNorm computes in float32 (tests/models/test_forward.py): agreement is to
    # float32 rounding, about 1e-7, not to float64's.
    cpu = update(make_trainer(tiny_config(tmp_path / "cpu", *UPDATE, "train.device=cpu"), dtype=torch.float64))
    gpu = update(make_trainer(tiny_config(tmp_path / "gpu", *UPDATE, "train.device=cuda"), dtype=torch.float64))
    assert rel_err(gpu["grads"], cpu["grads"]) < 1e-5
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):
        assert gpu["metrics"][key] == pytest.approx(cpu["metrics"][key], rel=1e-5, abs=1e-8), key


def test_greedy_decoding_on_the_gpu_gives_the_cpu_tokens():
    model, tok = tiny_model(seed=0)
    model = model.double()
    greedy = SamplingParams(max_new_tokens=8, greedy=True)
    cpu = HFEngine(model, tok).generate(PROMPTS, greedy, seed=0)
    gpu = HFEngine(model.to(GPU), tok).generate(PROMPTS, greedy, seed=0)
    assert torch.equal(gpu.response_ids.cpu(), cpu.response_ids)
    torch.testing.assert_close(gpu.sample_log_probs.cpu(), cpu.sample_log_probs, rtol=1e-5, atol=1e-6)


def test_bf16_autocast_and_recomputation_on_the_gpu_stay_near_float32(tmp_path):
    exact = update(make_trainer(tiny_config(tmp_path / "fp32", *UPDATE, "train.device=cuda")))
    fast = update(make_trainer(tiny_config(tmp_path / "bf16", *UPDATE, "train.device=cuda", "model.bf16_autocast=true",
                                           "train.gradient_checkpointing=true")))
    assert all(math.isfinite(fast["metrics"][k]) for k in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm"))
    # bfloat16 keeps 8 bits of mantissa: gradients within a few per cent, not bit for bit
    assert 0 < rel_err(fast["grads"], exact["grads"]) < 0.1


def _one_nccl_rank(rank: int, out: Path) -> dict[str, Any]:
    """FSDP2 on a one-GPU mesh over NCCL: the fixed-batch update, a sampled step, a sharded checkpoint and resume."""
    result = {"update": update(make_trainer(tiny_config(out / "update", *UPDATE, *FSDP, "train.device=cuda"),
                                            dtype=torch.float64))}
    run = (*FSDP, "train.device=cuda", "algorithm.kl.coef=0.1", "methods.armor={anchors: false, reset: every, tau: 2}")
    first = make_trainer(tiny_config(out / "fit", *run, "train.steps=2"))
    result["fit"] = first.fit()
    resumed = make_trainer(tiny_config(out / "fit", *run, "train.steps=3"))
    result.update(step=resumed.step, saved=shards(first), loaded=shards(resumed))
    result["resumed"] = resumed.fit()
    bf16 = make_trainer(tiny_config(out / "bf16", *UPDATE, *FSDP, "train.device=cuda",
                                    "distributed.param_dtype=bfloat16"))
    result["bf16"] = update(bf16)
    result["devices"] = {str(p.device) for p in first.policy.parameters()}
    return result


@pytest.fixture(scope="module")
def nccl_rank() -> Any:
    for results, _ in spawn_ranks(_one_nccl_rank, world=1, backend="nccl"):
        yield results[0]


def test_fsdp2_on_a_cuda_mesh_equals_the_unsharded_gpu_update(nccl_rank, tmp_path, monkeypatch):
    monkeypatch.setattr(forward, "_can_pack", lambda model: False)  # as sharded models run
    single = update(make_trainer(tiny_config(tmp_path, *UPDATE, "train.device=cuda"), dtype=torch.float64))
    assert rel_err(nccl_rank["update"]["grads"], single["grads"]) < 1e-7
    assert rel_err(nccl_rank["update"]["params"], single["params"]) < 1e-7


def test_fsdp2_on_a_cuda_mesh_trains_checkpoints_and_resumes(nccl_rank):
    assert nccl_rank["devices"] == {"cuda:0"} and nccl_rank["step"] == 2
    for saved, loaded in zip(nccl_rank["saved"]["params"], nccl_rank["loaded"]["params"], strict=True):
        assert torch.equal(saved, loaded)
    for i, state in nccl_rank["saved"]["optim"].items():
        for key, value in state.items():
            assert torch.equal(value, nccl_rank["loaded"]["optim"][i][key]), (i, key)
    for metrics in (nccl_rank["fit"], nccl_rank["resumed"], nccl_rank["bf16"]["metrics"]):
        assert all(math.isfinite(metrics[k]) for k in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm"))
    assert nccl_rank["resumed"]["armor/ref_age"] == 1.0  # the reset after step 2 came back with the checkpoint


def test_tether_train_under_torchrun_shards_on_one_gpu_and_resumes(tmp_path):
    """The launch a user types: ``torchrun ... -m tether.cli train`` joins NCCL, shards, checkpoints, resumes."""
    model, tok = tiny_model(seed=0)
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    config = {"run_dir": str(tmp_path / "run"), "model": {"name": str(tmp_path / "model")},
              "task": {"name": "parity", "kwargs": {}},
              "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 6},
              "distributed": {"strategy": "fsdp2"}, "train": {"steps": 2, "device": "cuda"}, "val": {"every": 0},
              "logging": {"tensorboard": False, "progress": False}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
              "-m", "tether.cli", "train", str(tmp_path / "run.yaml")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    for steps in (2, 3):
        done = subprocess.run([*launch, f"train.steps={steps}"], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    logged = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert logged == [1, 2, 3]  # the second launch resumed at step 2 and ran one step
    assert (tmp_path / "run" / "checkpoints" / "step_000003" / "sharded" / ".metadata").is_file()
