"""The metric names in code and in docs/metrics.md agree."""

import json
import re
from pathlib import Path

from tether.track import METHOD_NAMESPACES, METRICS

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_every_metric_is_in_the_docs_table():
    text = DOC.read_text()
    missing = [name for name in METRICS if f"| `{name}` |" not in text]
    assert not missing, f"add these to the table in docs/metrics.md: {missing}"


def test_names_are_namespaced_and_do_not_use_method_namespaces():
    for name in METRICS:
        assert "/" in name
        assert not name.startswith(METHOD_NAMESPACES)


def test_every_metric_a_run_logs_is_in_the_docs_table(tmp_path):
    """A key a run writes to metrics.jsonl but docs/metrics.md never names (``health/degenerate_steps`` was one) is a
    curve nobody can read: each logged key is a cell of the table, written out in full."""
    from tests.trainer.helpers import tiny_config
    from tether.models import tiny_model
    from tether.trainer import Trainer

    model, tok = tiny_model(seed=0)
    Trainer(tiny_config(tmp_path, "val.every=1", "train.steps=1"), policy=model, tokenizer=tok).fit()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    logged = {key for row in rows for key in row} - {"step"}
    cells = set(re.findall(r"`([\w/@]+)`", " ".join(line.split("|")[1] for line in DOC.read_text().splitlines()
                                                    if line.startswith("| `"))))
    assert {"actor/pg_loss", "val/avg@k"} <= logged
    assert sorted(logged - cells) == []
