"""Plots from a synthetic metrics.jsonl."""

import json

import pytest

from tether.track import mean_series, plot_compare, plot_run, plot_seed_means, read_metrics, seed_groups

PNG_MAGIC = b"\x89PNG"


def write_run(run_dir, steps=30, val_every=10, reward_offset=0.0):
    run_dir.mkdir(parents=True)
    with (run_dir / "metrics.jsonl").open("w") as f:
        for step in range(steps):
            row = {"step": step, "train/reward_mean": reward_offset + step / steps,
                   "train/accuracy": step / steps, "train/response_length": 20 - step / 3,
                   "actor/entropy": 1.0 - step / 60, "actor/ppo_kl": 1e-3 * step, "actor/kl_loss": 1e-2,
                   "perf/step_s": 6.0, "reward/faults": 0}
            f.write(json.dumps(row) + "\n")
            if step % val_every == 0:  # validation keys exist at some steps only
                f.write(json.dumps({"step": step, "val/avg@k": step / 40, "val/pass@k": step / 30}) + "\n")
        f.write('{"step": 30, "train/rew')  # a torn last line from a live run
    return run_dir


def test_plot_run_writes_pngs(tmp_path):
    run = write_run(tmp_path / "run")
    paths = plot_run(run)
    names = [p.name for p in paths]
    assert names[:5] == ["reward.png", "val.png", "entropy.png", "kl.png", "response_length.png"]
    assert {"metrics_train.png", "metrics_actor.png", "metrics_val.png", "metrics_perf.png",
            "metrics_reward.png"} <= set(names)
    for path in paths:
        assert path.parent == run / "plots"
        assert path.read_bytes()[:4] == PNG_MAGIC


def test_plot_run_skips_figures_without_data(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0, "loss": 1.0}\n{"step": 1, "loss": 0.5}\n')
    paths = plot_run(run, out_dir=tmp_path / "out")
    assert [p.name for p in paths] == ["metrics_other.png"]


def test_read_metrics_skips_torn_line(tmp_path):
    rows = read_metrics(write_run(tmp_path / "run", steps=3) / "metrics.jsonl")
    assert len(rows) == 4 and rows[-1]["step"] == 2


def test_plot_skips_lines_that_are_not_metric_rows(tmp_path):
    run = write_run(tmp_path / "run", steps=3)
    with (run / "metrics.jsonl").open("a") as f:
        f.write('\n[1, 2]\n"text"\n\x00\x00\n{"step": "three", "x": 1}\n{"step": 3, "x": "y"}\n')
    assert [row["step"] for row in read_metrics(run / "metrics.jsonl")] == [0, 0, 1, 2, "three", 3]
    assert plot_run(run)


def test_plot_compare(tmp_path):
    runs = {"grpo": write_run(tmp_path / "a"), "dapo": write_run(tmp_path / "b", reward_offset=0.1)}
    out = plot_compare(runs, "val/avg@k", tmp_path / "cmp" / "val.png")
    assert out.read_bytes()[:4] == PNG_MAGIC
    smoothed = plot_compare(runs, "train/reward_mean", tmp_path / "reward.png", smooth=5)
    assert smoothed.exists()
    with pytest.raises(ValueError, match=r"no run has metric 'val/pass@1'; available: .*val/avg@k"):
        plot_compare(runs, "val/pass@1", tmp_path / "x.png")


def test_seed_groups_and_mean_series():
    assert seed_groups(["armor", "dapo", "armor_s1", "dapo_kl_0.01", "armor_s2", "dapo_kl_0.01_s1"]) == {
        "armor": ["armor", "armor_s1", "armor_s2"], "dapo": ["dapo"],
        "dapo_kl_0.01": ["dapo_kl_0.01", "dapo_kl_0.01_s1"]}
    # the second run stopped early: only the steps both have count
    steps, mean, low, high = mean_series([([0, 10, 20], [0.1, 0.4, 0.3]), ([0, 10], [0.3, 0.2])])
    assert steps == [0, 10] and mean == pytest.approx([0.2, 0.3]) and low == [0.1, 0.2] and high == [0.3, 0.4]


def test_plot_seed_means(tmp_path):
    runs = {"grpo": write_run(tmp_path / "a"), "grpo_s1": write_run(tmp_path / "b", reward_offset=0.1),
            "dapo": write_run(tmp_path / "c")}
    out = plot_seed_means(runs, ["val/avg@k", "train/reward_mean"], tmp_path / "means.png")
    assert out.read_bytes()[:4] == PNG_MAGIC
