"""benchmarks/bench_async.py without running a trainer: a step's timings, the overlap and its ideal, the settings it
accepts, and the pinning of a process's threads."""

from __future__ import annotations

import os

import pytest

from benchmarks.bench_async import compare, parse_args, pin, step_record

# a synchronous step: 3 s until the batch, 1 s of push, 6 s of update; an asynchronous one: the batch was ready, and
# 0.5 s of its 1.5 s weight sync was the wait for the sampling job
SYNC = {"perf/step_s": 10.0, "perf/rollout_s": 3.0, "perf/weight_sync_s": 1.0, "perf/rollout_tok_s": 100.0,
        "train/reward_mean": 0.5}
ASYNC = {"perf/step_s": 7.5, "perf/rollout_s": 0.01, "perf/weight_sync_s": 1.5, "perf/rollout_tok_s": 30000.0,
         "train/reward_mean": 0.5, "rollout/staleness": 1.0}


def test_a_step_splits_into_rollout_update_push_and_the_wait_for_the_job():
    sync = step_record(SYNC, 10.2, pushes=[1.0], work=[2.9])
    assert sync["update_s"] == 6.0 and sync["push_s"] == 1.0 and sync["waited_s"] == 3.0
    assert sync["tokens"] == 300.0 and sync["staleness"] == 0.0 and sync["sampling_jobs"] == 1.0
    stale = step_record(ASYNC, 7.6, pushes=[1.0], work=[3.2])
    assert stale["update_s"] == pytest.approx(7.5 - 0.01 - 1.5)
    assert stale["waited_s"] == pytest.approx(0.01 + 0.5)  # the batch's wait plus the push's wait for the job
    assert stale["rollout_work_s"] == 3.2 and stale["staleness"] == 1.0


def test_overlap_is_the_baselines_step_over_this_one_and_the_ideal_its_max_phase_plus_push():
    medians = {"hf-sync": {"step_s": 8.0, "rollout_s": 3.0, "update_s": 5.0, "push_s": 0.0},
               "ray-sync": {"step_s": 10.0, "rollout_s": 3.0, "update_s": 6.0, "push_s": 1.0},
               "ray-async": {"step_s": 7.5, "rollout_s": 0.0, "update_s": 6.0, "push_s": 1.0},
               "hf-async": {"step_s": 6.4, "rollout_s": 0.0, "update_s": 6.0, "push_s": 0.1}}
    c = compare(medians)
    assert c["ray-async"]["baseline"] == "ray-sync"
    assert c["ray-async"]["overlap"] == pytest.approx(10.0 / 7.5)
    assert c["ray-async"]["ideal"] == pytest.approx(10.0 / (6.0 + 1.0))  # max(3, 6) + 1
    assert c["hf-async"]["overlap"] == pytest.approx(8.0 / 6.4)
    assert c["hf-async"]["ideal"] == pytest.approx(8.0 / 5.0)  # max(3, 5) + 0
    assert c["ray-sync"]["over_hf_sync"] == pytest.approx(0.8) and "overlap" not in c["ray-sync"]
    assert compare({"ray-sync": medians["ray-sync"]})["ray-sync"]["over_hf_sync"] is None


def test_an_asynchronous_setting_needs_its_baseline_and_a_warm_up_step():
    assert parse_args([]).settings == ["hf-sync", "ray-sync", "ray-async", "hf-async"]
    assert parse_args(["--settings", "ray-sync", "ray-async"]).settings == ["ray-sync", "ray-async"]
    for argv in (["--settings", "ray-async"], ["--warmup", "0"], ["--steps", "0"]):
        with pytest.raises(SystemExit):
            parse_args(argv)


def test_pin_moves_every_thread_of_a_process():
    import threading

    before = os.sched_getaffinity(0)
    started, stop = threading.Event(), threading.Event()
    worker = threading.Thread(target=lambda: (started.set(), stop.wait()))
    worker.start()
    started.wait()
    one = {min(before)}
    try:
        pin(os.getpid(), one)
        assert os.sched_getaffinity(0) == one and os.sched_getaffinity(worker.native_id) == one
    finally:
        pin(os.getpid(), before)
        stop.set()
        worker.join()
    assert os.sched_getaffinity(0) == before
