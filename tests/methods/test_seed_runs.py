"""SEED in the real trainer with a tiny random model: teacher log-probs, masks, loss composition, micro-batch
normalisation, validation without skills, skills on disk, the OPSD baseline, both stages end to end.

Actions come from the rollout tests' :class:`ScriptedEngine` (scripted env: per task group one win, one win after
an invalid action, one loss), so rows are known exactly. A random model cannot write JSON, so analysis prompts are
answered by :class:`CannedAnalyzer`: a skill for trajectories labelled success, prose (a parse failure) for failures.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from tests.rollout.helpers import ScriptedEngine, agent_config, seed_sft_config
from tether import algos
from tether.algos import LossInputs
from tether.config import ConfigError, config_command, load_command_config
from tether.engine.base import Generation
from tether.methods import MiniBatch
from tether.methods.seed.plugin import teacher_prompts
from tether.methods.seed.prompting import augment_with_skill
from tether.models import encode_chat, load_policy, response_log_probs
from tether.recipes.seed_sft import run_skill_sft
from tether.trainer import Trainer
from tether.trainer.step import add_micro_metrics, step_values

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "seed"
SKILL = "Say the secret word from the task at once."
SEED = {"analysis_max_new_tokens": 32, "analysis_context_length": 2048}


class CannedAnalyzer:
    """Answers analyzer prompts (success: a JSON skill; failure: prose); passes other prompts to ``inner``."""

    def __init__(self, inner, tokenizer, fail_all: bool = False) -> None:
        self.inner, self.tokenizer, self.fail_all = inner, tokenizer, fail_all
        self.prompts: list[str] = []

    def generate(self, prompt_ids, params, *, seed=None, intervention=None):
        texts = [self.tokenizer.decode(p) for p in prompt_ids]
        self.prompts += texts
        if "Analyze the following agent episode" not in texts[0]:
            return self.inner.generate(prompt_ids, params, seed=seed, intervention=intervention)
        answers = ["I cannot tell." if self.fail_all or "episode_success: success" not in t
                   else json.dumps({"episode_summary": "It said the word.", "episode_skill": SKILL}) for t in texts]
        n = len(answers)
        return Generation(response_ids=torch.zeros(n, 1, dtype=torch.long), response_mask=torch.ones(n, 1),
                          sample_log_probs=torch.zeros(n, 1), texts=answers, truncated=torch.zeros(n, dtype=torch.bool))

    def load_weights(self, state_dict):
        self.inner.load_weights(state_dict)


def seed_trainer(tiny_policy, tmp_path, *overrides, fail_all=False, seed_settings=None, **sections) -> Trainer:
    sections.setdefault("algorithm", {"advantage": "episode", "kl": {"coef": 0.01}, "entropy_coef": 0.001,
                                      "loss_kwargs": {"dual_clip": 3.0}})
    cfg = agent_config(tmp_path, *overrides, methods={"seed": {**SEED, **(seed_settings or {})}}, **sections)
    model, tok = tiny_policy
    trainer = Trainer(cfg, policy=model, tokenizer=tok)
    trainer.use_engine(CannedAnalyzer(ScriptedEngine(tok), tok, fail_all=fail_all))
    return trainer


def whole(batch) -> MiniBatch:
    """``batch`` as one mini-batch (``optim.mini_batches=1``), as the trainer hands it to the loss."""
    return MiniBatch(rows=torch.arange(len(batch)), num_tokens=float(batch.response_mask.sum()), num_seqs=len(batch),
                     batch=batch)


def scored_batch(trainer: Trainer):
    batch, metrics = trainer.collect()
    metrics.update(trainer.score(batch))
    trainer.compute_advantages(batch)
    return batch, metrics


def test_teacher_log_probs_are_pre_update_scores_of_the_sampled_tokens(tiny_policy, tmp_path):
    trainer = seed_trainer(tiny_policy, tmp_path)
    before = copy.deepcopy(trainer.policy)
    batch, metrics = scored_batch(trainer)
    skills = batch.info["seed_skill"]
    analysed = [i for i, ep in enumerate(batch.info["episode"]) if ep.ret >= 1.0]
    assert [i for i, s in enumerate(skills) if s] == analysed and 0 < len(analysed) < len(batch)
    assert metrics["seed/analysis_success_rate"] == pytest.approx(4 / 6)  # 2 of 3 trajectories per group won
    mask, teacher = batch.token["seed_mask"], batch.token["teacher_log_probs"].clone()
    torch.testing.assert_close(mask.sum(1) > 0, torch.tensor([s is not None for s in skills]))
    torch.testing.assert_close(mask, (mask.sum(1, keepdim=True) > 0) * batch.response_mask)
    assert (teacher[mask.sum(1) == 0] == 0).all()

    rows, prompts, lost = teacher_prompts(batch, trainer.tokenizer, skills, augment_with_skill)
    assert rows == analysed and lost == 0
    tok = trainer.tokenizer
    for i, ids in zip(rows, prompts, strict=True):
        original = tok.decode(batch.prompt_ids[i])
        task_line = original.split("\n")[3]  # system, its text, "<|im_start|>user", then the task line
        assert task_line.startswith("Your task is to: ")
        block = ("**Episode-Level Skill**\nRefer to this episode-level skill when deciding what action to take in "
                 f"the current episode:\n[{SKILL}]")
        assert tok.decode(ids) == original.replace(f"{task_line}\n\n", f"{task_line}\n\n{block}\n\n", 1)
        direct, _ = response_log_probs(before, [ids], batch.response_ids[i:i + 1], batch.response_mask[i:i + 1])
        torch.testing.assert_close(teacher[i:i + 1], direct * batch.response_mask[i:i + 1])

    trainer.update(batch)  # the weights move; the teacher of this update stays the pre-update one
    after, _ = response_log_probs(trainer.policy, [prompts[0]], batch.response_ids[rows[0]:rows[0] + 1],
                                  batch.response_mask[rows[0]:rows[0] + 1])
    assert not torch.allclose(after, teacher[rows[0]:rows[0] + 1], atol=1e-4)
    torch.testing.assert_close(batch.token["teacher_log_probs"], teacher)


def test_zero_mask_gives_zero_loss_and_gradient(tiny_policy, tmp_path):
    trainer = seed_trainer(tiny_policy, tmp_path, fail_all=True)
    batch, metrics = scored_batch(trainer)
    assert metrics["seed/analysis_success_rate"] == 0.0 and metrics["seed/teacher_rows_frac"] == 0.0
    assert (batch.token["seed_mask"] == 0).all() and (batch.token["teacher_log_probs"] == 0).all()
    log_probs = torch.randn(batch.response_mask.shape, requires_grad=True)
    inputs = LossInputs(log_probs=log_probs, old_log_probs=log_probs.detach(),
                        advantages=batch.token["advantages"], response_mask=batch.response_mask,
                        tokens={"teacher_log_probs": batch.token["teacher_log_probs"]})
    out = trainer.methods[0].extra_loss(inputs, batch, trainer.hook_context(whole(batch)))
    out.loss.backward()
    assert out.loss.item() == 0.0 and (log_probs.grad == 0).all()


def test_total_loss_is_ppo_entropy_opd_kl(tiny_policy, tmp_path):
    trainer = seed_trainer(tiny_policy, tmp_path, seed_settings={"opd_coef": 0.5})
    with torch.no_grad():  # a reference that differs from the policy, so the KL term is not 0
        for p in trainer.ref_policy.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    batch, _ = scored_batch(trainer)
    num_tokens = float(batch.response_mask.sum())
    micro = batch.select(range(5))
    loss = trainer._micro_batch_loss(micro, whole(batch)).loss

    lp, ent = response_log_probs(trainer.policy, micro.prompt_ids, micro.response_ids, micro.response_mask,
                                 with_entropy=True)
    ref, _ = response_log_probs(trainer.ref_policy, micro.prompt_ids, micro.response_ids, micro.response_mask)
    m = micro.response_mask
    inputs = LossInputs(log_probs=lp, old_log_probs=lp.detach(), advantages=micro.token["advantages"],
                        response_mask=m, num_tokens=num_tokens, num_seqs=len(batch))
    pg = algos.ppo(inputs, clip_low=0.2, clip_high=0.2, dual_clip=3.0).loss
    entropy = algos.aggregate(ent, m, "token-mean", num_tokens=num_tokens)
    kl = algos.aggregate(algos.kl_estimate(lp, ref.detach(), "k3"), m, "token-mean", num_tokens=num_tokens)
    seed_mask = micro.token["seed_mask"]
    opd = algos.seed_opd_loss(lp, micro.token["teacher_log_probs"], seed_mask, beta=5.0,
                              num_active_tokens=batch.token["seed_mask"].sum()).loss
    assert seed_mask.sum() > 0 and opd.abs() > 1e-6 and kl > 0
    torch.testing.assert_close(loss, pg - 0.001 * entropy + 0.5 * opd + 0.01 * kl)


def test_micro_batch_losses_sum_to_each_mini_batch_loss(tiny_policy, tmp_path):
    trainer = seed_trainer(tiny_policy, tmp_path, "optim.mini_batches=2", "optim.micro_batch_size=2")
    seed = trainer.methods[0]
    calls = []
    original = seed.extra_loss

    def recording(inputs, micro, ctx):
        out = original(inputs, micro, ctx)
        calls.append((tuple(ctx.mini_batch.rows.tolist()), inputs.log_probs.detach(), micro.token["seed_mask"],
                      inputs.tokens["teacher_log_probs"], out.loss.detach() / seed.settings.opd_coef))
        return out

    seed.extra_loss = recording
    batch, _ = scored_batch(trainer)
    trainer.update(batch)

    def rows(tensors):  # each micro-batch is cut to its own longest response: zero columns (masked) to join them
        width = max(t.shape[1] for t in tensors)
        return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in tensors])

    for mini in dict.fromkeys(c[0] for c in calls):  # the trainer's mini-batches, by their rows
        parts = [c for c in calls if c[0] == mini]
        whole = algos.seed_opd_loss(rows([c[1] for c in parts]), rows([c[3] for c in parts]),
                                    rows([c[2] for c in parts])).loss
        torch.testing.assert_close(sum(c[4] for c in parts), whole)
    assert len(calls) == 6 and len({c[0] for c in calls}) == 2


def test_step_writes_skills_and_validation_never_sees_them(tiny_policy, tmp_path):
    trainer = seed_trainer(tiny_policy, tmp_path, "val.every=1")
    metrics = trainer.train_step()
    for key in ("seed/analysis_success_rate", "seed/skill_words", "seed/opd_loss", "seed/opd_delta_mean",
                "seed/opd_gate_mean", "seed/opd_raised_frac", "seed/return_success", "seed/return_failure",
                "seed/row_reward_success", "seed/row_reward_failure"):
        assert key in metrics, key
    assert metrics["seed/skill_words"] == len(SKILL.split()) and metrics["seed/opd_active_token_frac"] > 0
    records = [json.loads(line) for line in (tmp_path / "run" / "skills.jsonl").read_text().splitlines()]
    assert len(records) == 6 and {r["skill"] for r in records if r["ok"]} == {SKILL}
    assert all(r["outcome"] == ("success" if r["ok"] else "failure") for r in records)
    from tether.rollout.transcripts import show_transcripts

    assert f"skill: {SKILL}" in show_transcripts(tmp_path / "run", limit=10)

    seen = len(trainer.engine.prompts)
    trainer.validate()
    val_prompts = trainer.engine.prompts[seen:]
    assert val_prompts and not any("Analyze the following" in p or "Episode-Level Skill" in p for p in val_prompts)
    assert len((tmp_path / "run" / "skills.jsonl").read_text().splitlines()) == 6


def test_with_lora_the_skill_teacher_is_the_policy_and_the_kl_reference_its_base(tiny_policy, tmp_path):
    pytest.importorskip("peft", reason="peft is not installed (pip install -e '.[lora]')")
    from tether.models.lora import BaseModelView

    trainer = seed_trainer(tiny_policy, tmp_path, "model.lora.rank=4")
    assert isinstance(trainer.ref_policy, BaseModelView)
    with torch.no_grad():  # trained adapters: teacher (policy) and reference (base) differ
        for name, p in trainer.policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
    batch, _ = scored_batch(trainer)
    rows, prompts, _ = teacher_prompts(batch, trainer.tokenizer, batch.info["seed_skill"], augment_with_skill)
    assert rows
    teacher = trainer.log_probs(trainer.policy, batch.select(rows), prompt_ids=prompts)
    torch.testing.assert_close(batch.token["teacher_log_probs"][rows], teacher, atol=1e-5, rtol=0)
    metrics = trainer.train_step()
    assert metrics["seed/opd_loss"] != 0.0 and metrics["actor/kl_loss"] > 0.0


def test_opd_schedule_off_masks_everything(tiny_policy, tmp_path):
    trainer = seed_trainer(tiny_policy, tmp_path, seed_settings={"opd_start_after_steps": 1})
    batch, metrics = scored_batch(trainer)
    assert metrics["seed/opd_enabled"] == 0.0 and metrics["seed/analysis_success_rate"] > 0  # analysis still runs
    assert (batch.token["seed_mask"] == 0).all()


def test_seed_needs_an_env(tmp_path):
    from tests.trainer.helpers import tiny_config
    from tether.models import tiny_model

    cfg = tiny_config(tmp_path)
    cfg.methods = {"seed": {}}  # after tiny_config's checks, so the trainer's own are what refuses it
    model, tok = tiny_model()
    with pytest.raises(ConfigError, match="needs an env"):
        Trainer(cfg, policy=model, tokenizer=tok)
    assert not (tmp_path / "run").exists()  # a class-level check: before the run directory, unlike setup


def test_opsd_baseline_scores_under_the_solution_hint(tiny_policy, tmp_path):
    cfg = agent_config(tmp_path, "env.name=frozenlake", "env.kwargs={size: 3}", "env.max_turns=2",
                       "rollout.max_new_tokens=6", methods={"opsd": {"coef": 0.1}})
    model, tok = tiny_policy
    trainer = Trainer(cfg, policy=model, tokenizer=tok)
    batch, metrics = scored_batch(trainer)
    assert metrics["seed/opsd_hint_rows_frac"] == 1.0  # every frozenlake observation shows the whole map
    _, prompts, _ = teacher_prompts(batch, tok, ["H"] * len(batch), lambda m, c: m)
    assert prompts == [list(p) for p in batch.prompt_ids]  # identity insertion reproduces the rollout prompts
    out = trainer.update(batch)
    assert torch.isfinite(torch.tensor(out["actor/grad_norm"]))
    assert "seed/opsd_delta_mean" in out


@pytest.mark.parametrize("mode", ["reverse_kl", "gated"])
def test_opsd_adds_coef_times_its_distillation_term_to_the_loss(tiny_policy, tmp_path, mode):
    cfg = agent_config(tmp_path, "env.name=frozenlake", "env.kwargs={size: 3}", "env.max_turns=2",
                       "rollout.max_new_tokens=6",
                       methods={"opsd": {"coef": 0.3, "loss": mode, "gate_beta": 2.0}})
    model, tok = tiny_policy
    trainer = Trainer(cfg, policy=model, tokenizer=tok)
    batch, _ = scored_batch(trainer)
    batch.token["opsd_mask"][1] = 0.0  # a row without a hint: it must not count anywhere
    n = len(batch)
    assert n >= 5 and batch.token["opsd_mask"].sum(1)[2:].gt(0).all()
    g = torch.Generator().manual_seed(0)  # student log-probs on both sides of the teacher's
    student = batch.token["teacher_log_probs"] + 0.5 * torch.randn(batch.response_mask.shape, generator=g)

    def reference(rows):
        """coef x the term on ``rows`` (float64, written out), normalised by the whole batch's hinted tokens."""
        m, lt = batch.token["opsd_mask"][rows].double(), batch.token["teacher_log_probs"][rows].double()
        lp, total = student[rows].double(), batch.token["opsd_mask"].double().sum()
        if mode == "gated":  # sum m sigmoid(beta (l_T - l)) (l_T - l) / N; gradient -m g / N
            gate = torch.sigmoid(2.0 * (lt - lp))
            return 0.3 * (m * gate * (lt - lp)).sum() / total, -0.3 * m * gate / total
        return 0.3 * (m * (lp - lt)).sum() / total, 0.3 * m * (lp - lt) / total  # reverse KL: sum m (l - l_T) / N

    incoming = torch.tensor(0.7, dtype=torch.float64)
    parts = [list(range(3)), list(range(3, n))]
    folded: dict[str, torch.Tensor] = {}
    for rows in parts:
        micro = batch.select(rows)
        lp = student[rows].clone().requires_grad_()
        inputs = LossInputs(log_probs=lp, old_log_probs=lp.detach(), advantages=micro.token["advantages"],
                            response_mask=micro.response_mask, tokens=trainer.methods.loss_token_inputs(micro))
        out = trainer.methods.extra_loss(incoming, inputs, micro, trainer.hook_context(whole(batch)))
        add_micro_metrics(folded, out, tokens=micro.response_mask.sum())  # as the trainer folds them
        loss = out.loss
        loss.backward()
        term, grad = reference(rows)
        assert term.abs() > 1e-3
        torch.testing.assert_close(loss.double(), incoming + term, rtol=1e-6, atol=0)
        torch.testing.assert_close(lp.grad.double(), grad, rtol=1e-5, atol=1e-9)
    # the logged means over the update (both micro-batches): the term itself, l_T - l and the hinted fraction
    m = batch.token["opsd_mask"].double()
    gap = (batch.token["teacher_log_probs"].double() - student.double()) * m
    metrics = step_values({k: float(v) for k, v in folded.items()}, dict.fromkeys(folded, 1))
    assert metrics["seed/opsd_loss"] == pytest.approx(reference(list(range(n)))[0].item() / 0.3, rel=1e-6)
    assert metrics["seed/opsd_delta_mean"] == pytest.approx((gap.sum() / m.sum()).item(), rel=1e-6)
    assert metrics["seed/opsd_active_token_frac"] == pytest.approx((m.sum() / batch.response_mask.sum()).item())


def test_opsd_refuses_envs_it_cannot_hint_before_and_during_a_run(tiny_policy, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"methods.opsd with env.name=textworld: no solver reads its observations"):
        agent_config(tmp_path, "env.name=textworld", methods={"opsd": {}})
    # a supported env whose observations (here: a view) hold no state it can solve: stopped at the first batch
    monkeypatch.setattr("tether.methods.seed.opsd.solve_from_observation", lambda *args: None)
    cfg = agent_config(tmp_path, "env.name=frozenlake", "env.kwargs={size: 3}", "env.max_turns=2",
                       "rollout.max_new_tokens=6", methods={"opsd": {"coef": 0.1}})
    trainer = Trainer(cfg, policy=tiny_policy[0], tokenizer=tiny_policy[1])
    with pytest.raises(RuntimeError, match=r"methods\.opsd: no row of step 0 got a hint"):
        scored_batch(trainer)



@pytest.mark.parametrize("older", [False, True], ids=["this_tethers_checkpoint", "an_older_tethers"])
def test_a_resumed_opsd_run_keeps_going_on_a_batch_without_hints_as_the_uninterrupted_run_does(
        tiny_policy, tmp_path, monkeypatch, older):
    """The no-hint stop is for a run none of whose rows ever had a hint. Whether one had was not checkpointed, so a
    resumed run stopped at its first batch without a hint, where the same run uninterrupted went on. A checkpoint
    written before it was (``older``: no ``hinted``) did the same after the fix: its step passed the check, so the run
    had had a hint."""
    def trainer(*overrides: str) -> Trainer:
        cfg = agent_config(tmp_path, "env.name=frozenlake", "env.kwargs={size: 3}", "env.max_turns=2",
                           "rollout.max_new_tokens=6", "train.steps=3", *overrides, methods={"opsd": {"coef": 0.1}})
        return Trainer(cfg, policy=copy.deepcopy(tiny_policy[0]), tokenizer=tiny_policy[1])

    straight = trainer()
    assert straight.train_step()["seed/opsd_hint_rows_frac"] > 0
    path = straight.save()
    if older:
        state = torch.load(path / "trainer_state.pt", weights_only=False)
        del state["methods"]["opsd"]["hinted"]
        torch.save(state, path / "trainer_state.pt")
        (path / "manifest.json").unlink()
    resumed = trainer("train.resume=true")
    assert resumed.step == 1
    monkeypatch.setattr("tether.methods.seed.opsd.solve_from_observation", lambda *args: None)  # no state solvable
    for run in (straight, resumed):
        assert run.train_step()["seed/opsd_hint_rows_frac"] == 0

def test_both_stages_end_to_end(tiny_policy, tmp_path):
    model, tok = tiny_policy
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    sft = seed_sft_config(tmp_path, "env.name=frozenlake", "env.kwargs={size: 3}", "env.max_turns=2",
                          "rollout.max_new_tokens=6", f"run_dir={tmp_path / 'sft'}",
                          methods={"seed": {"analysis_max_new_tokens": 8, "analysis_context_length": 512}},
                          sft={"tasks": 2, "rollouts_per_task": 2, "epochs": 2, "batch_size": 2,
                               "micro_batch_size": 2, "lr": 1e-3, "eval_examples": 1, "val_fraction": 0.25})
    summary = run_skill_sft(sft, policy=model, tokenizer=tok)
    assert summary["trajectories"] == 4 and summary["kept"] == 4  # rule analyses always parse
    assert summary["train_examples"] == 3 and summary["val_examples"] == 1 and summary["steps"] == 4
    losses = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in losses if "sft/loss" in r] == [1, 2, 3, 4] and "sft/val_loss" in losses[-1]
    train = [json.loads(line) for line in (tmp_path / "sft" / "data" / "train.jsonl").read_text().splitlines()]
    assert json.loads(train[0]["response"]).keys() == {"episode_summary", "episode_skill"}

    loaded, _ = load_policy(summary["checkpoint"])
    assert any(not torch.equal(initial[k], v) for k, v in loaded.state_dict().items())

    rl = agent_config(tmp_path, f"model.name={summary['checkpoint']}", f"run_dir={tmp_path / 'rl'}",
                      algorithm={"advantage": "episode", "kl": {"coef": 0.01}, "entropy_coef": 0.001},
                      methods={"seed": SEED})
    trainer = Trainer(rl)  # loads the SFT checkpoint; the KL reference is a frozen copy of it
    trainer.use_engine(CannedAnalyzer(ScriptedEngine(trainer.tokenizer), trainer.tokenizer))
    start = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    metrics = trainer.train_step()
    assert metrics["seed/analysis_success_rate"] > 0 and torch.isfinite(torch.tensor(metrics["seed/opd_loss"]))
    assert any(not torch.equal(start[k], v) for k, v in trainer.policy.state_dict().items())


def test_stage_one_trains_and_saves_with_model_chat_template(tiny_policy, tmp_path):
    """Stage 1 ignored ``model.chat_template``: it trained on the tokenizer's own template and saved it, while
    stage 2 (``tether train``) renders its prompts with the file."""
    model, tok = tiny_policy[0], copy.deepcopy(tiny_policy[1])  # the fixture's tokenizer is shared
    template = "{% for m in messages %}Q:{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}A:{% endif %}"
    (tmp_path / "t.jinja").write_text(template)
    sft = seed_sft_config(tmp_path, "env.name=frozenlake", "env.kwargs={size: 3}", "env.max_turns=2",
                          "rollout.max_new_tokens=6", f"run_dir={tmp_path / 'sft'}",
                          f"model.chat_template={tmp_path / 't.jinja'}",
                          methods={"seed": {"analysis_max_new_tokens": 8, "analysis_context_length": 512}},
                          sft={"tasks": 1, "rollouts_per_task": 1, "epochs": 1, "batch_size": 1,
                               "micro_batch_size": 1, "eval_examples": 0, "val_fraction": 0.0})
    summary = run_skill_sft(sft, policy=model, tokenizer=tok)
    assert load_policy(summary["checkpoint"])[1].chat_template == template


def test_stage_one_with_an_external_analyzer(tiny_policy, tmp_path, monkeypatch):
    from tether.methods.seed.analyzer import parse_analysis

    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")  # checked before the rollouts; Fake answers
    monkeypatch.setenv("OPENAI_MODEL", "m")

    class Fake:
        def analyze(self, prompt):
            ok = "episode_success: success" in prompt
            return parse_analysis('{"episode_summary": "s", "episode_skill": "say it"}' if ok else "nope")

    model, tok = tiny_policy
    cfg = seed_sft_config(tmp_path, "env.max_turns=1", f"run_dir={tmp_path / 'sft'}",
                          sft={"tasks": 3, "rollouts_per_task": 1, "analyzer": "openai", "epochs": 1,
                               "eval_examples": 0})
    summary = run_skill_sft(cfg, policy=model, tokenizer=tok, analyzer=Fake(), engine=ScriptedEngine(tok))
    records = [json.loads(line) for line in (tmp_path / "sft" / "data" / "records.jsonl").read_text().splitlines()]
    assert [r["outcome"] for r in records] == ["success", "failure", "failure"]  # one turn: only "win" wins
    assert summary["kept"] == 1 and summary["train_examples"] == 1 and records[0]["analyzer"] == "openai"


def test_stage_one_mixes_in_replay_pairs(tiny_policy, tmp_path):
    replay = tmp_path / "pairs.jsonl"
    replay.write_text("".join(json.dumps({"prompt": f"p{i}", "response": "<action>up</action>"}) + "\n"
                              for i in range(5)))
    model, tok = tiny_policy

    def stage_one(**sft):  # each in a run directory of its own: a finished run with other settings is refused
        cfg = seed_sft_config(tmp_path, "env.max_turns=1", f"run_dir={tmp_path / 'sft' / str(len(sft))}",
                              sft={"tasks": 2, "rollouts_per_task": 1, "epochs": 1, "batch_size": 8,
                                   "eval_examples": 0, "val_fraction": 0.0, **sft})
        return run_skill_sft(cfg, policy=model, tokenizer=tok, engine=ScriptedEngine(tok))

    summary = stage_one(replay_data=str(replay), replay_examples=3)
    assert summary["replay_examples"] == 3 and summary["train_examples"] == 2 + 3
    assert stage_one(replay_data=str(replay))["train_examples"] == 2 + 5

    with pytest.raises(ConfigError, match=r"^sft\.replay_data: no file"):  # before any rollout: no engine needed
        run_skill_sft(seed_sft_config(tmp_path, sft={"replay_data": str(tmp_path / "no")}),
                      policy=model, tokenizer=tok, engine=object())
    replay.write_text('{"prompt": "p"}\n')
    with pytest.raises(ConfigError, match=r"^sft\.replay_data: .*pairs.jsonl line 1 has no 'response' field"):
        stage_one(replay_data=str(replay))


def test_stage_one_reads_the_top_level_sft_section_of_its_config_file(tiny_policy, tmp_path):
    """A `tether seed-sft` file: `sft` holds stage 1's settings (an override reaches them too), `methods.seed` the
    analyzer prompt's options; the run directory's copy keeps them where the file put them."""
    config = tmp_path / "stage1.yaml"
    config.write_text(f"""# tether seed-sft stage1.yaml
run_dir: {tmp_path / 'sft'}
env: {{name: scripted, kwargs: {{turns: 3}}, max_turns: 1, train_tasks: 8, val_tasks: 3}}
rollout: {{max_new_tokens: 8}}
logging: {{tensorboard: false, progress: false}}
methods:
  seed: {{include_summary: false}}
sft: {{tasks: 3, rollouts_per_task: 1, epochs: 2, batch_size: 2, micro_batch_size: 1, eval_examples: 0,
      val_fraction: 0.0}}
""")
    model, tok = tiny_policy
    summary = run_skill_sft(config, ["sft.rollouts_per_task=2"], policy=model, tokenizer=tok,
                            engine=ScriptedEngine(tok))
    # 3 tasks x 2 rollouts, each analysed by the rule analyzer (always parses), 2 epochs of 3 batches of 2
    assert (summary["trajectories"], summary["train_examples"], summary["steps"]) == (6, 6, 6)
    train = [json.loads(line) for line in (tmp_path / "sft" / "data" / "train.jsonl").read_text().splitlines()]
    assert json.loads(train[0]["response"]).keys() == {"episode_skill"}  # methods.seed.include_summary: false
    saved = load_command_config("seed-sft", tmp_path / "sft" / "config.yaml")
    assert (saved.sft.tasks, saved.sft.rollouts_per_task, saved.methods) == (3, 2, {"seed": {"include_summary": False}})
    with pytest.raises(ConfigError, match=r"^invalid configuration:\n  methods\.seed\.sft: moved to the top-level "
                                          r"sft section of the `tether seed-sft` config"):
        run_skill_sft(config, ["methods.seed.sft.tasks=2"], policy=model, tokenizer=tok, engine=object())


def test_an_openai_analyzer_without_its_endpoint_stops_before_any_rollout(tiny_policy, tmp_path, monkeypatch):
    """The analyzer is built after every trajectory is played: its variables are checked first, and validate probes
    its server."""
    from tests.rewards.helpers import closed_port_url
    from tether.checks import check_config
    from tether.checks.machine import probe_endpoints

    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_MODEL", raising=False)
    model, tok = tiny_policy
    cfg = seed_sft_config(tmp_path, sft={"analyzer": "openai"})
    with pytest.raises(ConfigError, match=r"^sft\.analyzer=openai: \$OPENAI_BASE_URL and \$OPENAI_MODEL not set"):
        run_skill_sft(cfg, policy=model, tokenizer=tok, engine=object())  # a rollout would fail on object()
    monkeypatch.setenv("OPENAI_BASE_URL", closed_port_url())
    monkeypatch.setenv("OPENAI_MODEL", "m")
    check_config(cfg)
    [line] = probe_endpoints(cfg)
    assert line.startswith("sft.openai ($OPENAI_BASE_URL): cannot connect to http://127.0.0.1:"), line
    assert probe_endpoints(seed_sft_config(tmp_path)) == []  # the rule analyzer calls no server


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_validate(path):
    cfg = load_command_config(config_command(path), path)
    assert cfg.env is not None and cfg.env.name in ("frozenlake", "sokoban")
    if path.name != "sft.yaml":  # the compared RL runs share the paper's KL and entropy coefficients
        assert cfg.algorithm.kl.coef == 0.01 and cfg.algorithm.entropy_coef == 0.001


def test_encode_chat_prompt_of_a_row_is_what_the_loop_sent(tiny_policy, tmp_path):
    trainer = seed_trainer(tiny_policy, tmp_path)
    batch, _ = scored_batch(trainer)
    from tether.methods.seed.prompting import user_message

    for ids in batch.prompt_ids:
        assert encode_chat(trainer.tokenizer, user_message(trainer.tokenizer, ids)) == list(ids)


def test_rule_analyzer_writes_the_skills_and_the_policy_writes_none(tiny_policy, tmp_path):
    from tether.methods.seed.rule_analyzers import Trajectory, rule_analysis

    trainer = seed_trainer(tiny_policy, tmp_path, seed_settings={"analyzer": "rule"})
    batch, metrics = scored_batch(trainer)
    assert not any("Analyze the following agent episode" in p for p in trainer.engine.prompts)
    assert metrics["seed/analysis_success_rate"] == 1.0  # the canned policy analyzer would fail on failures
    for ep, skill in zip(batch.info["episode"], batch.info["seed_skill"], strict=True):
        want = json.loads(rule_analysis(Trajectory.from_episode(ep), "scripted", success=ep.ret >= 1.0))
        assert skill == want["episode_skill"]
    assert (batch.token["seed_mask"].sum(1) > 0).all()  # every row has a teacher


def test_unknown_analyzer_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="analyzer"):
        agent_config(tmp_path, methods={"seed": {**SEED, "analyzer": "oracle"}})
