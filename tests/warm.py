"""A warm interpreter: one process imports torch, transformers and tether's trainer once, then forks a process per
script it is asked to run.

A test that must run tether in a process of its own (to SIGKILL it mid-save, say) otherwise starts a fresh
interpreter each time, and the imports were about 6.5 s of each such ``tether train``'s 9 s of CPU time. The fork
happens before any tether code runs, so each run is as separate as a fresh ``python -c``: its own memory, its own
signals, and it leaves through the interpreter's usual exit (atexit, stream flushes). What it shares with its
siblings is only what importing left behind, and the hash seed of ``str`` keys.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Serves one request at a time: a line [script, stderr path, argv] in; the run's exit status (negative: the signal
# that ended it, as subprocess reports it) out. The forked child leaves the loop and runs the script as __main__.
SERVER = """
import json, os, sys

# what a run imports (about 6.5 of its 9 s of CPU time), the model's classes included: transformers loads them lazily
import torch, transformers.models.llama.modeling_llama  # noqa: F401
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast  # noqa: F401
import tether.cli, tether.rollout.single_turn, tether.trainer.trainer  # noqa: F401


def next_run():
    for line in sys.stdin:
        pid = os.fork()
        if pid == 0:
            return json.loads(line)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)
    sys.exit(0)


script, stderr, argv = next_run()
null = os.open(os.devnull, os.O_RDWR)
os.dup2(null, 0)
os.dup2(null, 1)
os.dup2(os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 2)
sys.argv = ["-c", *argv]
exec(compile(script, "<string>", "exec"), {"__name__": "__main__"})
"""


class WarmPython:
    """``run(script, *argv)`` is ``subprocess.run([python, "-c", script, *argv])`` with stderr captured, on a forked
    copy of the warm server."""

    def __init__(self, server: subprocess.Popen, scratch: Path) -> None:
        self._server, self._scratch, self._runs = server, scratch, 0

    def run(self, script: str, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
        self._runs += 1
        stderr = self._scratch / f"stderr{self._runs}.txt"
        self._server.stdin.write(json.dumps([script, str(stderr), list(argv)]) + "\n")
        self._server.stdin.flush()
        ready, _, _ = select.select([self._server.stdout], [], [], timeout)
        assert ready, f"the run did not end within {timeout} s: {stderr.read_text()}"
        code = int(self._server.stdout.readline())
        return subprocess.CompletedProcess(["-c", script, *argv], code, None, stderr.read_text())


@contextmanager
def warm_python(scratch: Path, env: Mapping[str, str]) -> Iterator[WarmPython]:
    """A warm server whose runs see ``env`` (on top of this process's), writing their stderr under ``scratch``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    server = subprocess.Popen([sys.executable, "-c", SERVER], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        yield WarmPython(server, scratch)
    finally:
        server.stdin.close()  # the server's loop ends and it exits
        server.wait(timeout=60)
