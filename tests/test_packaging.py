"""Installing tether prints no warnings of its own making."""

from pathlib import Path

import pytest


def test_the_license_is_an_spdx_expression_so_setuptools_does_not_warn():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"  # the table form ({text = ...}) is deprecated
    assert not any(c.startswith("License ::") for c in project.get("classifiers", []))  # an error beside it
