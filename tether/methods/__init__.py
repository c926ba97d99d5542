"""Method plug-ins (ARMOR, EAPO, SEED) and their registry."""

from tether.methods import (
    armor,  # noqa: F401  (registers the 'armor' plug-in)
    eapo,  # noqa: F401  (registers the 'eapo' plug-in)
    seed,  # noqa: F401  (registers the 'seed' and 'opsd' plug-ins)
)
from tether.methods.base import METHODS, Method, MethodSettings, build_methods, method_config, register_method
from tether.methods.context import MiniBatch, Reference, StepContext

__all__ = ["METHODS", "Method", "MethodSettings", "MiniBatch", "Reference", "StepContext", "build_methods",
           "method_config", "register_method"]
