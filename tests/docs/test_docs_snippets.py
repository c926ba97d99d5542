"""Docs that run: every YAML block of README.md and docs/ that imports a file of the user's (`imports: [x.py]`)
loads and passes the config checks with that file as the page shows it (its ```python blocks that begin `# x.py` or
define what the YAML names from it, `x:Name`), or as examples/ ships it. A name the YAML uses but no block defines
(the page's reward function, task or environment) fails here, as it would for a reader who copies the page. No
model loads: the checks run without the machine's (no model files, data sets or Hub)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
import yaml

from tether.checks import check_config
from tether.config import load_config
from tether.envs.registry import ENVS
from tether.tasks.registry import TASKS

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
REFERENCE = re.compile(r"^([A-Za-z_]\w*):([A-Za-z_]\w*)$")


def blocks(page: Path, lang: str) -> list[str]:
    return [body for kind, body in BLOCK.findall(page.read_text(encoding="utf-8")) if kind == lang]


def defined_names(source: str) -> set[str]:
    """The top-level functions, classes and assignments of a block; none for a block that is not a module (an
    excerpt with `...` in place of code)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    return names | {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}


def strings(value: object) -> list[str]:
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [*strings(k), *strings(v)]]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return [value] if isinstance(value, str) else []


def importing_blocks() -> list[tuple[Path, int, dict]]:
    found = []
    for page in PAGES:
        for index, body in enumerate(blocks(page, "yaml")):
            data = yaml.safe_load(body)
            if isinstance(data, dict) and data.get("imports"):
                found.append((page, index, data))
    return found


IMPORTING = importing_blocks()


def module_source(page: Path, stem: str, names: set[str]) -> str:
    """The file ``stem``.py as the page shows it (its ```python blocks headed ``# stem.py`` or defining any of
    ``names``), else as examples/ ships it."""
    shown = [body for body in blocks(page, "python")
             if body.startswith(f"# {stem}.py\n") or defined_names(body) & names]
    if shown:
        return "\n\n".join(shown)
    shipped = sorted((ROOT / "examples").rglob(f"{stem}.py"))
    return shipped[0].read_text(encoding="utf-8") if shipped else ""


def test_the_pages_hold_importing_blocks():
    assert len(IMPORTING) >= 4


@pytest.mark.parametrize("page, index, data", IMPORTING,
                         ids=[f"{p.relative_to(ROOT)}#yaml{i}" for p, i, _ in IMPORTING])
def test_a_yaml_block_that_imports_a_file_loads_with_that_file(page, index, data, tmp_path, monkeypatch):
    stems = [Path(name).stem for name in data["imports"]]
    wanted: dict[str, set[str]] = {stem: set() for stem in stems}
    for text in strings(data):
        match = REFERENCE.match(text)
        if match and match.group(1) in wanted:
            wanted[match.group(1)].add(match.group(2))
    for stem, names in wanted.items():
        source = module_source(page, stem, names)
        where = page.relative_to(ROOT)
        assert source, f"{where}: no ```python block is {stem}.py (headed `# {stem}.py`, or defining {sorted(names)})"
        missing = sorted(names - defined_names(source))
        assert not missing, f"{where}: the YAML names {missing} from {stem}.py, which no block of the page defines"
        (tmp_path / f"{stem}.py").write_text(source, encoding="utf-8")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(data), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    for stem in stems:  # a module of that name another test imported (tests/test_user_code.py's capitals) steps aside
        monkeypatch.delitem(sys.modules, stem, raising=False)
    # each block imports its own my_rewards.py: the loader refuses a second file under a module name it holds;
    # the names the page registers (docs/tasks.md's capitals) go with its modules, for the next import
    with TASKS.restored(), ENVS.restored():
        try:
            check_config(load_config(config), machine=False)
        finally:
            for stem in stems:
                sys.modules.pop(stem, None)
