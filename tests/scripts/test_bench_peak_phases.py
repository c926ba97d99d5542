"""benchmarks/bench_peak_phases.py without a trainer: each phase reports its own peak, not the process's."""

from __future__ import annotations

import sys

import pytest
import torch

from benchmarks.bench_peak_phases import measured

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")


def test_each_phase_reports_its_own_peak_and_the_memory_it_kept():
    phases: dict[str, list[dict[str, float]]] = {"big": [], "small": []}

    def allocate() -> None:
        x = torch.ones(50_000_000)  # 200 MB, touched; freed (an mmapped block) on return
        del x

    measured(phases, "big", allocate)()
    measured(phases, "small", lambda: None)()
    big, small = phases["big"][0], phases["small"][0]
    assert big["peak_gb"] - big["start_rss_gb"] > 0.19
    assert big["end_rss_gb"] < big["peak_gb"] - 0.15
    assert small["peak_gb"] - small["start_rss_gb"] < 0.05  # the high-water mark was reset between phases
