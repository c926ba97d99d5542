"""The one exception type a health check stops a run with."""


class HealthError(RuntimeError):
    """A health check stopped the run: engine-trainer parity, the token round trip, or a collapse with action=stop."""
