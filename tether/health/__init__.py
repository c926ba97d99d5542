"""Run health checks no peer framework runs for its users (docs/health.md).

* engine-trainer parity (:mod:`tether.health.parity`): the engine samples from the weights being trained;
* token round trip (:mod:`tether.health.round_trip`): the trainer trains on exactly what the engine sampled;
* reward audit (:mod:`tether.health.reward_audit`): no answer extracted vs. a wrong answer vs. a scorer fault;
* over-optimisation guard (:mod:`tether.health.collapse`): validation collapses while training reward rises;
* collapsed-policy warning (:mod:`tether.health.degenerate`): entropy at its maximum or near 0, or zero gradients,
  step after step.
"""

from tether.health.collapse import CollapseGuard
from tether.health.degenerate import DegenerateCheck
from tether.health.errors import CollapseError, HealthError
from tether.health.monitor import HealthMonitor
from tether.health.parity import ParityCheck, allowed_gap, parity_excess
from tether.health.reward_audit import reward_audit
from tether.health.round_trip import RecordingEngine, RoundTripError, check_round_trip

__all__ = ["CollapseError", "CollapseGuard", "DegenerateCheck", "HealthError", "HealthMonitor", "ParityCheck",
           "RecordingEngine", "RoundTripError", "allowed_gap", "check_round_trip", "parity_excess", "reward_audit"]
