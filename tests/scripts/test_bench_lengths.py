"""benchmarks/bench_lengths.py without running a trainer: the children it starts and the table it makes."""

from __future__ import annotations

from pathlib import Path

from benchmarks.bench_lengths import child_command, failure, format_table, parse_args, table_rows


def test_each_child_runs_one_trainer_at_one_budget_with_the_tether_overrides():
    args = parse_args(["--steps", "2", "--group-size", "4", "--tether-override", "optim.max_tokens_per_micro_batch=64"])
    assert args.max_new_tokens == [24, 96, 256]
    cmd = child_command(args, "trl", 96, Path("/tmp/x.json"))
    assert cmd[1].endswith("bench_trl.py")
    flags = " ".join(cmd[2:])
    assert "--only trl --max-new-tokens 96 --steps 2 --warmup 1" in flags and "--group-size 4" in flags
    assert "--prompts-per-step" not in flags  # unset: the quickstart's
    assert "--tether-override optim.max_tokens_per_micro_batch=64" in flags


def test_one_row_per_budget_with_the_ratio_where_both_ran():
    cells = [{"max_new_tokens": 24, "trainer": "tether", "step_s": 10.0, "peak_rss_gb": 3.0, "tokens": 500.0},
             {"max_new_tokens": 24, "trainer": "trl", "step_s": 30.0, "peak_rss_gb": 9.0, "tokens": 510.0},
             {"max_new_tokens": 96, "trainer": "tether", "step_s": 20.0, "peak_rss_gb": 3.5, "tokens": 1500.0}]
    rows = table_rows(cells)
    assert [r["max_new_tokens"] for r in rows] == [24, 96]
    assert rows[0]["trl_over_tether"] == 3.0 and "trl_over_tether" not in rows[1]
    table = format_table(rows).splitlines()
    assert table[2] == "| 24 | 10.00 | 30.00 | 3.00 | 3.00 | 9.00 | 500 | 510 |"
    assert table[3] == "| 96 | 20.00 | - | - | 3.50 | - | 1500 | - |"


def test_a_cell_the_kernel_killed_is_a_row_that_says_so_and_keeps_its_peak():
    cells = [{"max_new_tokens": 256, "trainer": "tether", "step_s": 76.0, "peak_rss_gb": 4.5, "tokens": 1389.0},
             {"max_new_tokens": 256, "trainer": "trl", "peak_rss_gb": 21.9, "failed": failure(-9)}]
    rows = table_rows(cells)
    assert "trl_over_tether" not in rows[0] and rows[0]["trl_peak_gb"] == 21.9
    assert format_table(rows).splitlines()[2] == (
        "| 256 | 76.00 | failed: exit status -9 (SIGKILL: out of memory) | - | 4.50 | 21.90 | 1389 | - |")
    assert failure(1) == "exit status 1"
