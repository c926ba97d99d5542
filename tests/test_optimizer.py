"""tether.optimizer.adamw: PyTorch's fused AdamW where it runs, pinned to the AdamW update in float64."""

from __future__ import annotations

import torch

from tests.trainer.helpers import tiny_config
from tether.models import tiny_model
from tether.optimizer import adamw
from tether.trainer import Trainer


def reference_adamw(p0, grads, lr, betas, wd, eps=1e-8):
    """Loshchilov & Hutter's decoupled AdamW with bias correction, written out in float64."""
    p, m, v = p0.double().clone(), torch.zeros_like(p0, dtype=torch.float64), torch.zeros_like(p0, dtype=torch.float64)
    for t, g in enumerate(grads, start=1):
        g = g.double()
        p = p * (1 - lr * wd)
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        m_hat, v_hat = m / (1 - betas[0] ** t), v / (1 - betas[1] ** t)
        p = p - lr * m_hat / (v_hat.sqrt() + eps)
    return p


def test_fused_on_cpu_and_equal_to_the_float64_update():
    gen = torch.Generator().manual_seed(0)
    p0 = torch.randn(64, 32, generator=gen)
    grads = [torch.randn(64, 32, generator=gen) for _ in range(4)]
    p = torch.nn.Parameter(p0.clone())
    opt = adamw([p], lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)
    assert opt.param_groups[0]["fused"] is True
    for g in grads:
        p.grad = g.clone()
        opt.step()
    want = reference_adamw(p0, grads, 1e-2, (0.9, 0.99), 0.1)
    torch.testing.assert_close(p.detach().double(), want, rtol=0, atol=1e-6)
    assert not torch.allclose(p.detach().double(), p0.double(), atol=1e-3)  # it moved


def test_not_fused_where_the_kernel_does_not_run():
    meta = torch.nn.Parameter(torch.empty(4, device="meta"))
    assert not adamw([meta], lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0).param_groups[0]["fused"]


def test_a_checkpoint_keeps_the_implementation_it_was_written_with():
    # a run begun before the fused default resumes on the multi-tensor path it began on (load_state_dict restores
    # the saved flags), so its resume stays exact
    p = torch.nn.Parameter(torch.ones(8))
    old = torch.optim.AdamW([p], lr=1e-3, foreach=True)
    p.grad = torch.ones(8)
    old.step()
    resumed = adamw([p], lr=1e-3, betas=(0.9, 0.999), weight_decay=0.01)
    resumed.load_state_dict(old.state_dict())
    assert resumed.param_groups[0]["fused"] is None and resumed.param_groups[0]["foreach"] is True


def test_the_rl_trainer_and_sft_step_with_it(tmp_path, monkeypatch):
    model, tok = tiny_model(seed=0)
    trainer = Trainer(tiny_config(tmp_path, "train.steps=1"), policy=model, tokenizer=tok)
    assert trainer.optimizer.param_groups[0]["fused"] is True
    import tether.optimizer
    from tether.config import SFTSettings
    from tether.recipes.sft import train_sft
    made = []
    real = tether.optimizer.adamw
    monkeypatch.setattr(tether.optimizer, "adamw", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    rows = [([5, 6, 7], [8, 9]), ([5, 7], [9, 8])]  # (prompt ids, response ids)
    train_sft(model, tok, rows, rows, SFTSettings(epochs=1, batch_size=2, micro_batch_size=2, warmup_ratio=0.0))
    assert len(made) == 1 and made[0].param_groups[0]["fused"] is True
