"""The toy task every test here trains on, registered in the test process (workers register their own)."""

from __future__ import annotations

import pytest

from tests.trainer.helpers import register_toy, unregister_toy


@pytest.fixture(autouse=True)
def toy_task():
    register_toy()
    yield
    unregister_toy()
