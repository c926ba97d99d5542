"""tether experiment's runner: a line per finished run (which, done of total, running, ETA), failures in job order."""

from __future__ import annotations

import re
from types import SimpleNamespace

from tether.lab.experiment import run_all


def test_each_finished_run_prints_its_line_and_failures_keep_the_order_of_the_jobs(capsys):
    protocol = SimpleNamespace(name="study", parallel=2)
    jobs = [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    def work(_protocol, arm, seed):
        if arm == "b":
            raise RuntimeError(f"boom {seed}")

    failures = run_all(protocol, work, jobs)
    assert failures == ["b/seed0: boom 0", "b/seed1: boom 1"]
    err = capsys.readouterr().err.splitlines()
    assert err[0].endswith("experiment study: 4 runs, 2 at a time")
    runs = err[1:]
    assert [int(re.match(r"run (\d)/4", line).group(1)) for line in runs] == [1, 2, 3, 4]  # in the order they end
    assert sorted(line.split()[2] for line in runs) == ["a/seed0", "a/seed1", "b/seed0", "b/seed1"]
    assert [line.split(",")[1].split()[0] for line in runs] == ["2", "2", "1", "0"]  # still running
    assert all(("FAILED" in line) == line.split()[2].startswith("b/") for line in runs)
    assert runs[-1].startswith("run 4/4") and ", 0 running" in runs[-1] and runs[-1].endswith("eta 0:00")
