"""What a health check stops a run with: :class:`HealthError`, or its subclass for a collapse."""

from tether.errors import EXIT_HEALTH, TetherError


class HealthError(TetherError, RuntimeError):
    """A health check stopped the run: engine-trainer parity, the token round trip, a collapse (action stop), or
    nothing left to train on. Exit code 3."""

    exit_code = EXIT_HEALTH


class CollapseError(HealthError):
    """Validation collapsed from its peak while the training reward rose (``health.collapse.action: stop``).

    Attributes:
        step: the step whose validation completed the collapse.
        peak_step: the step of the peak, whose weights are in ``run_dir/checkpoints/best``.
    """

    def __init__(self, message: str, *, step: int, peak_step: int) -> None:
        super().__init__(message)
        self.step, self.peak_step = step, peak_step
