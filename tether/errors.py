"""tether's errors and the exit codes the CLI ends with.

Every error a user can fix or must know about is a :class:`TetherError`: the CLI prints its message as one line
(a traceback only with ``--debug``) and exits with its :attr:`~TetherError.exit_code`. Anything else is a bug:
a traceback and exit code 1. This module imports nothing, so every layer (the config schema included) can use it.

==========  =====================================================================================================
exit code   meaning
==========  =====================================================================================================
0           done
1           a crash (a bug: the traceback says where)
2           bad input: the config, a file or model it names, the run directory, the machine (before any step)
3           a health check stopped the run (parity, token round trip, collapse, nothing can train)
4           the run stopped early and can be resumed: non-finite updates, a DAPO refill shortfall
5           an environment fault: no episode could start (its constructor or reset kept failing)
128 + N     stopped by signal N (130: Ctrl-C, 143: SIGTERM): train after saving a checkpoint, sft and
            seed-sft after saving run_dir/sft_state (the same command resumes either)
==========  =====================================================================================================
"""

from __future__ import annotations

EXIT_CRASH = 1
EXIT_CONFIG = 2
EXIT_HEALTH = 3
EXIT_STOPPED = 4
EXIT_ENV_FAULT = 5


class TetherError(Exception):
    """An error with a message meant for the user, ending the command with :attr:`exit_code`."""

    exit_code: int = EXIT_CRASH


class EnvFaultError(TetherError, RuntimeError):
    """An environment kept failing to construct or reset: no episode could start."""

    exit_code = EXIT_ENV_FAULT


class RefillShortfall(TetherError, RuntimeError):
    """DAPO's dynamic sampling spent ``rollout.max_gen_batches`` without enough groups; the trainer adds the last
    checkpoint to the message. Resuming with ``rollout.partial_batches`` or more ``max_gen_batches`` is accepted."""

    exit_code = EXIT_STOPPED


class TrainingStopped(TetherError, RuntimeError):
    """The run ended before its last step: a signal (exit code 128 + N; ``tether train`` saved a checkpoint first,
    ``tether sft`` and ``tether seed-sft`` their ``run_dir/sft_state``, and each resumes from it), or updates that
    stayed non-finite or a DAPO refill shortfall (exit code 4, resumable)."""

    def __init__(self, message: str, exit_code: int = EXIT_STOPPED) -> None:
        super().__init__(message)
        self.exit_code = exit_code
