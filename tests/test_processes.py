"""A run ``tether experiment`` starts stops (one SIGTERM: it saves its step) when the runner is killed, instead of
training on as an orphan that holds its run directory's lock against the runner started again (tether/processes.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tether.lab import experiment
from tether.processes import PARENT_ENV

ROOT = Path(__file__).resolve().parents[1]

# The starter: two idle threads besides the one that starts the command (the runner's pool has several: the
# kernel's parent-death signal fired once per thread, and a second SIGTERM ends a run in the middle of its save);
# prints the command's pid, then waits to be killed.
STARTER = """
import subprocess, sys, threading, time
from tether.processes import starter_env
import os
for _ in range(2):
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
def start():
    command = subprocess.Popen(sys.argv[1:], env=starter_env(dict(os.environ)))
    print(command.pid, flush=True)
    command.wait()
threading.Thread(target=start).start()
time.sleep(60)
"""

# A command that runs the callback every tether command runs first, then says how many SIGTERMs it got in the second
# after the first (or that none came within 8 s).
COUNTING = """
import signal, time
from tether.cli import main
got = []
signal.signal(signal.SIGTERM, lambda *_: got.append(time.monotonic()))
main(debug=False)
print("ready", flush=True)
deadline = time.monotonic() + 8
while time.monotonic() < (got[0] + 1 if got else deadline):
    time.sleep(0.05)
print(f"SIGTERM x{len(got)}", flush=True)
"""


def test_the_runner_names_itself_to_its_runs():
    assert experiment._one_thread_env()[PARENT_ENV] == str(os.getpid())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX reparenting, as on the lab's machines")
def test_a_command_whose_starter_is_killed_gets_one_sigterm():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    starter = subprocess.Popen([sys.executable, "-c", STARTER, sys.executable, "-c", COUNTING], env=env,
                               stdout=subprocess.PIPE, text=True)
    int(starter.stdout.readline())  # the command's pid: it started
    assert starter.stdout.readline() == "ready\n"
    starter.kill()
    starter.wait()
    # the command writes to the starter's stdout, which it inherited: its last line arrives when it ends
    assert starter.stdout.read() == "SIGTERM x1\n"  # was "SIGTERM x0" after 8 s: it ran on as an orphan
