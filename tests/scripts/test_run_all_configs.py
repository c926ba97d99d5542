"""scripts/run_all_configs.sh on a made-up checkout, with a fake `tether` and `python`: ``--dry-run`` lists what would
run and why, ``--only`` picks a subset (with what it needs), a data script of the checkout runs before the config
that reads its output, and a config is skipped with one line when a script that is not here writes its inputs, a
command it needs failed, or ``tether validate`` refuses it; the exit code counts the failures."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "run_all_configs.sh"

CONFIGS = {  # path: its comment lines
    "base.yaml": ["# tether train configs/base.yaml"],
    "after_base.yaml": ["# tether train configs/after_base.yaml", "# written by: tether train configs/base.yaml"],
    "scripted.yaml": ["# tether sft configs/scripted.yaml", "# written by: python scripts/make_data.py"],
    "with_data.yaml": ["# tether sft configs/with_data.yaml", "# written by: tether train configs/base.yaml",
                       "# written by: python scripts/write_data.py out.jsonl --seed 3"],
    "after_scripted.yaml": ["# tether train configs/after_scripted.yaml",
                            "# written by: tether sft configs/scripted.yaml"],
    "broken.yaml": ["# tether train configs/broken.yaml"],
    "after_broken.yaml": ["# tether train configs/after_broken.yaml", "# written by: tether train configs/broken.yaml"],
    "needs_gpu.yaml": ["# tether train configs/needs_gpu.yaml"],
    "gpu/preset.yaml": ["# tether train configs/gpu/preset.yaml"],
}

FAKE_TETHER = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
case "$*" in
  "validate configs/needs_gpu.yaml") echo "train.device: cuda is not available here (torch has no CUDA)"; exit 2 ;;
  "train configs/broken.yaml") exit 1 ;;
esac
exit 0
"""

FAKE_PYTHON = """#!/usr/bin/env bash
echo "python $*" >> "$CALLS"
"""


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT, tmp_path / "scripts" / SCRIPT.name)
    (tmp_path / "scripts" / "write_data.py").write_text("")  # here, so with_data.yaml's writer runs
    for path, lines in CONFIGS.items():
        config = tmp_path / "configs" / path
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text("\n".join(lines) + "\nseed: 0\n")
    for name, text in (("fake_tether", FAKE_TETHER), ("fake_python", FAKE_PYTHON)):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    return tmp_path


def run(checkout: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "WORK": str(checkout / "work"), "TETHER": str(checkout / "fake_tether"),
           "PYTHON": str(checkout / "fake_python"),
           "CALLS": str(checkout / "calls.txt")}
    return subprocess.run(["bash", str(checkout / "scripts" / SCRIPT.name), *args], env=env, capture_output=True,
                          text=True, timeout=60)


def test_dry_run_lists_what_would_run_and_why_and_what_is_skipped(checkout):
    out = run(checkout, "--dry-run")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "run   tether train configs/base.yaml  (needed by configs/after_base.yaml)",
        "run   tether train configs/after_base.yaml  (selected)",
        "run   tether train configs/broken.yaml  (needed by configs/after_broken.yaml)",
        "run   tether train configs/after_broken.yaml  (selected)",
        "skip  configs/scripted.yaml: its inputs are written by: python scripts/make_data.py",
        "skip  configs/after_scripted.yaml: it needs configs/scripted.yaml, which was skipped",
        "run   tether train configs/needs_gpu.yaml  (selected)",
        "run   python scripts/write_data.py out.jsonl --seed 3  (needed by configs/with_data.yaml)",
        "run   tether sft configs/with_data.yaml  (selected)",
        "(a real run also checks each config with tether validate once its inputs exist, and skips it if refused)",
    ]
    assert not (checkout / "calls.txt").exists()  # nothing ran


def test_only_picks_the_matching_configs_and_what_they_need(checkout):
    out = run(checkout, "--dry-run", "--only", "after_base")
    assert [line for line in out.stdout.splitlines() if not line.startswith("(")] == [
        "run   tether train configs/base.yaml  (needed by configs/after_base.yaml)",
        "run   tether train configs/after_base.yaml  (selected)"]
    assert run(checkout, "--bogus").returncode == 2


def test_a_run_skips_with_one_line_reason_and_counts_failures(checkout):
    out = run(checkout)
    assert out.returncode == 1  # broken.yaml failed; everything else ran or was skipped
    summary = [line.split("\t")[:2] for line in (checkout / "work" / "summary.tsv").read_text().splitlines()]
    assert summary == [
        ["configs/base.yaml", "exit 0"],
        ["configs/after_base.yaml", "exit 0"],
        ["configs/broken.yaml", "exit 1"],
        ["configs/after_broken.yaml", "skipped: it needs configs/broken.yaml, which failed"],
        ["configs/scripted.yaml", "skipped: its inputs are written by: python scripts/make_data.py"],
        ["configs/after_scripted.yaml", "skipped: it needs configs/scripted.yaml, which was skipped"],
        ["configs/needs_gpu.yaml",
         "skipped: tether validate: train.device: cuda is not available here (torch has no CUDA)"],
        ["python scripts/write_data.py out.jsonl --seed 3", "exit 0"],
        ["configs/with_data.yaml", "exit 0"],
    ]
    calls = (checkout / "calls.txt").read_text().splitlines()
    assert "train configs/needs_gpu.yaml" not in calls and "train configs/gpu/preset.yaml" not in calls
    assert calls.index("validate configs/base.yaml") < calls.index("train configs/base.yaml")
    assert calls.count("train configs/base.yaml") == 1  # needed twice, run once
    data = calls.index("python scripts/write_data.py out.jsonl --seed 3")
    assert data < calls.index("validate configs/with_data.yaml") < calls.index("sft configs/with_data.yaml")


def test_a_ledger_keeps_what_ran_to_its_end_across_invocations_and_report_reads_it(checkout):
    run(checkout, "--only", "base")
    run(checkout, "--only", "with_data")
    ledger = [line.split("\t") for line in (checkout / "work" / "finished.tsv").read_text().splitlines()]
    assert [row[2] for row in ledger] == ["configs/base.yaml", "configs/after_base.yaml", "configs/base.yaml",
                                          "python scripts/write_data.py out.jsonl --seed 3", "configs/with_data.yaml"]
    assert all(row[1] == "unknown" and row[3].endswith("s") for row in ledger)  # the made-up checkout is no repo
    assert (checkout / "work" / "summary.tsv").read_text().count("\n") == 3  # this invocation's lines only
    out = run(checkout, "--report")
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert lines[-1].startswith("3 of 8 configs have run to their end")  # not the GPU preset
    assert [line.split()[1] for line in lines[:-1] if line.startswith("finished")] == [
        "configs/after_base.yaml", "configs/base.yaml", "configs/with_data.yaml"]
    assert "never     configs/broken.yaml" in lines and not any("gpu/preset" in line for line in lines)
    other = checkout / "other_work"
    other.mkdir()
    (other / "finished.tsv").write_text("2026-12-06T10:00:00Z\tabc1234\tconfigs/broken.yaml\t5s\n"
                                        "2026-12-06T11:00:00Z\tdef5678\tconfigs/broken.yaml\t1s\n")  # a no-op resume
    lines = run(checkout, "--report", "--also", str(other)).stdout.splitlines()
    assert lines[-1].startswith("4 of 8 configs have run to their end") and str(other / "finished.tsv") in lines[-1]
    assert "finished  configs/broken.yaml  2026-12-06T10:00:00Z at abc1234 (5s)" in lines
    missing = run(checkout, "--report", "--also", str(checkout / "nowhere"))
    assert missing.returncode == 2
    assert f"--also {checkout / 'nowhere'}: no finished.tsv there" in missing.stderr


def test_report_counts_another_ledger_where_work_has_none_yet(checkout):
    # a fresh WORK (a new session) with only the committed record: the old report passed awk the missing WORK
    # ledger, which ended awk at once, and counted nothing
    other = checkout / "record"
    other.mkdir()
    (other / "finished.tsv").write_text("2026-12-06T10:00:00Z\tabc1234\tconfigs/base.yaml\t5s\n")
    lines = run(checkout, "--report", "--also", str(other)).stdout.splitlines()
    assert lines[-1].startswith("1 of 8 configs have run to their end")
    assert "finished  configs/base.yaml  2026-12-06T10:00:00Z at abc1234 (5s)" in lines
    alone = run(checkout, "--report").stdout.splitlines()  # no ledger at all: every config "never", none skipped
    assert alone[-1].startswith("0 of 8 configs have run to their end")
    assert sum(line.startswith("never") for line in alone) == 8


def test_smoke_cuts_each_command_short_and_records_no_finish(checkout):
    """--smoke: train two steps, sft one epoch of 16 examples, SmolLM2 swapped for tiny-64x2 where the command names
    no policy; the ledger is smoked.tsv, so a smoke run never counts as a config run to its end."""
    (checkout / "configs" / "base.yaml").write_text(
        "# tether train configs/base.yaml\nseed: 0\nmodel:\n  name: smollm2-135m-instruct   # the policy\n")
    (checkout / "configs" / "named.yaml").write_text(
        "# tether train configs/named.yaml\n# written by: tether train configs/base.yaml model.name=runs/other\n")
    out = run(checkout, "--smoke", "--only", "with_data")
    assert out.returncode == 0, out.stderr
    run(checkout, "--smoke", "--only", "named")
    calls = (checkout / "calls.txt").read_text().splitlines()
    short = "train.steps=2 train.save_every=1 val.every=1 val.max_prompts=4"
    assert f"train configs/base.yaml {short} model.name=tiny-64x2" in calls
    assert "sft configs/with_data.yaml sft.epochs=1 sft.examples=16" in calls  # its config names no SmolLM2
    assert "python scripts/write_data.py out.jsonl --seed 3" in calls  # data scripts as they are
    assert f"train configs/base.yaml model.name=runs/other {short}" in calls  # the command's own policy stays
    assert f"train configs/named.yaml {short}" in calls
    # validated with the settings it runs with: a run directory finished with tiny-64x2 refused SmolLM2's validate
    assert f"validate configs/base.yaml {short} model.name=tiny-64x2" in calls
    assert (checkout / "work" / "smoked.tsv").is_file() and not (checkout / "work" / "finished.tsv").exists()
    assert run(checkout, "--smoke", "--report").returncode == 2
