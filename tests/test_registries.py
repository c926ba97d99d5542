"""Every registry of tether is one :class:`tether.registry.Registry`, and each behaves alike: an unknown name is
refused in one line that lists the known names, a taken name is refused, a lookup returns what was registered."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tether.algos import ADVANTAGES, POLICY_LOSSES, ROLLOUT_CORRECTIONS
from tether.engine.registry import ENGINES, EngineEntry
from tether.envs.registry import ENVS
from tether.methods import METHODS, Method
from tether.methods.seed.rule_analyzers import OBSERVATION_SOLVERS, RULE_ANALYZERS
from tether.registry import Registry, UnknownNameError
from tether.tasks.registry import TASKS


def _advantage(inputs, *, scale: float = 1.0):
    return inputs


def _policy_loss(inputs, *, agg: str = "token-mean"):
    return inputs


def _correction(log_ratio, mask, *, bound: float = 2.0):
    return log_ratio


def _task(**kwargs: Any) -> Any:
    return kwargs


# registry -> a new entry it accepts
REGISTRIES: dict[str, tuple[Registry, Callable[[], Any]]] = {
    "advantages": (ADVANTAGES, lambda: _advantage),
    "policy losses": (POLICY_LOSSES, lambda: _policy_loss),
    "rollout corrections": (ROLLOUT_CORRECTIONS, lambda: _correction),
    "tasks": (TASKS, lambda: _task),
    "envs": (ENVS, lambda: "tether.envs.scripted:ScriptedEnv"),
    "methods": (METHODS, lambda: type("Fresh", (Method,), {"name": "fresh"})),
    "rule analyzers": (RULE_ANALYZERS, lambda: lambda traj, success: ("", "")),
    "observation solvers": (OBSERVATION_SOLVERS, lambda: lambda observation, task: None),
    "engines": (ENGINES, lambda: EngineEntry("tether.engine.hf:build_hf_engine", interventions=True)),
}


@pytest.fixture(params=sorted(REGISTRIES))
def registry(request) -> tuple[Registry, Callable[[], Any]]:
    reg, make = REGISTRIES[request.param]
    with reg.restored():
        yield reg, make


def test_an_unknown_name_is_one_line_listing_the_known_names(registry):
    reg, _ = registry
    assert len(reg) > 0
    with pytest.raises(UnknownNameError) as err:
        reg["no_such_name"]
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"unknown {reg.kind} 'no_such_name'; known: ")
    listed = message.split("; known: ", 1)[1].split(", or ")[0]
    assert listed.split(", ") == sorted(reg)
    assert isinstance(err.value, KeyError) and isinstance(err.value, ValueError)
    assert "no_such_name" not in reg and reg.get("no_such_name") is None


def test_a_taken_name_is_refused_and_the_first_entry_kept(registry):
    reg, make = registry
    name = sorted(reg)[0]
    first = reg[name]
    with pytest.raises(ValueError, match=f"{reg.kind} '{name}' is already registered"):
        reg.add(name, make())
    assert reg[name] is first


def test_a_lookup_returns_the_registered_entry_until_it_is_removed(registry):
    reg, make = registry
    entry, before = make(), sorted(reg)
    with reg.restored():
        assert reg.register("_test_entry")(entry) is entry
        assert reg["_test_entry"] is entry and "_test_entry" in reg and sorted(reg) == sorted([*before, "_test_entry"])
        assert reg.unregister("_test_entry") is entry and "_test_entry" not in reg
        reg.add("_test_entry", entry)
    assert sorted(reg) == before  # restored() put the registry back as it was


def test_the_seed_tables_refuse_an_entry_of_the_wrong_signature():
    for table in (RULE_ANALYZERS, OBSERVATION_SOLVERS):
        with table.restored(), pytest.raises(TypeError, match="two positional arguments"):
            table.add("_one_argument", lambda observation: None)


def test_a_refused_entry_is_named_by_the_registrys_kind_and_the_entrys_name():
    with ENVS.restored(), pytest.raises(ValueError, match=r"^env 'my_env': target must look like "
                                                          r"'package\.module:Class', got 'MyEnv'$"):
        ENVS.add("my_env", "MyEnv")
    with RULE_ANALYZERS.restored(), pytest.raises(TypeError, match=r"^rule analyzer 'my_env': it must take two "
                                                                   r"positional arguments$"):
        RULE_ANALYZERS.add("my_env", lambda trajectory: None)
    with POLICY_LOSSES.restored(), pytest.raises(TypeError, match=r"^policy loss 'mine': hyperparameter 'scale' must "
                                                                   r"be keyword-only with a default"):
        POLICY_LOSSES.add("mine", lambda inputs, *, agg="token-mean", scale: inputs)
    # a module:function is checked on lookup, named as the config names it
    with pytest.raises(TypeError, match=r"^policy loss 'tests\.user_plugins:EvenLength': it must take \(inputs, "):
        POLICY_LOSSES["tests.user_plugins:EvenLength"]


def test_a_registry_without_a_resolver_takes_no_module_name():
    reg = Registry("thing")
    reg.add("a", 1)
    with pytest.raises(UnknownNameError, match=r"^unknown thing 'os:getcwd'; known: a$"):
        reg["os:getcwd"]
    resolving = Registry("thing", resolve=lambda target: target.upper(), own="module:Thing")
    assert resolving["os:getcwd"] == "OS:GETCWD" and "os:getcwd" not in resolving
    with pytest.raises(UnknownNameError, match=r"^unknown thing 'b'; known: \(none\), or module:Thing of your own$"):
        resolving["b"]
