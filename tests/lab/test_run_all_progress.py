"""tether experiment's runner: a line per finished run (which, done of total, running, ETA), failures in job order."""

from __future__ import annotations

import re
import threading
from types import SimpleNamespace

from tether.lab.experiment import run_all


def test_each_finished_run_prints_its_line_and_failures_keep_the_order_of_the_jobs(capsys):
    protocol = SimpleNamespace(name="study", parallel=2)
    jobs = [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    first_done = threading.Event()

    def work(_protocol, arm, seed):
        if (arm, seed) == ("a", 0):
            first_done.set()
        else:
            first_done.wait(5)  # ("a", 0) ends first, so the failures below finish after it
        if arm == "b":
            raise RuntimeError(f"boom {seed}")

    failures = run_all(protocol, work, jobs)
    assert failures == ["b/seed0: boom 0", "b/seed1: boom 1"]
    err = capsys.readouterr().err.splitlines()
    assert err[0].endswith("experiment study: 4 runs, 2 at a time")
    runs = err[1:]
    assert len(runs) == 4 and runs[0].startswith("run 1/4  a/seed0 done, 2 running")
    assert [int(re.match(r"run (\d)/4", line).group(1)) for line in runs] == [1, 2, 3, 4]
    assert sum("FAILED" in line for line in runs) == 2
    assert runs[-1].startswith("run 4/4") and ", 0 running" in runs[-1] and runs[-1].endswith("eta 0:00")
