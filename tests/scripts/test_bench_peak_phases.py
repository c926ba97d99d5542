"""benchmarks/bench_peak_phases.py without a trainer: each phase reports its own peak, not the process's."""

from __future__ import annotations

import mmap
import sys

import pytest
import torch

from benchmarks.bench_peak_phases import measured

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")


def test_each_phase_reports_its_own_peak_and_the_memory_it_kept():
    phases: dict[str, list[dict[str, float]]] = {"big": [], "small": []}

    def allocate() -> None:
        # 200 MB of anonymous pages of its own, touched, unmapped on return: a malloc of that size could reuse
        # freed heap that earlier tests left resident, and then raise no peak (seen in the full suite)
        block = mmap.mmap(-1, 200_000_000)
        for offset in range(0, len(block), mmap.PAGESIZE):
            block[offset] = 1
        block.close()

    measured(phases, "big", allocate)()
    measured(phases, "small", lambda: None)()
    big, small = phases["big"][0], phases["small"][0]
    assert big["peak_gb"] - big["start_rss_gb"] > 0.19
    assert big["end_rss_gb"] < big["peak_gb"] - 0.15
    assert small["peak_gb"] - small["start_rss_gb"] < 0.05  # the high-water mark was reset between phases


def test_malloc_trim_before_a_phase_returns_freed_heap_pages():
    from benchmarks.bench_peak_phases import status_gb
    blocks = [torch.ones(16_000) for _ in range(3_000)]  # 64 KB each, under glibc's mmap threshold: the heap
    pin = torch.ones(16_000)  # allocated last, it keeps the freed blocks off the heap's top, which glibc trims alone
    del blocks
    held = status_gb("VmRSS")
    phases: dict[str, list[dict[str, float]]] = {"kept": [], "trimmed": []}
    measured(phases, "kept", lambda: None)()
    measured(phases, "trimmed", lambda: None, trim=True)()
    assert phases["kept"][0]["start_rss_gb"] > held - 0.02  # without the trim the freed ~190 MB stay resident
    assert phases["trimmed"][0]["start_rss_gb"] < held - 0.15
    del pin
