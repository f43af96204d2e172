"""Shared fixtures: where the bundled data and ``../shared`` live."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["service_fixtures"]

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
SHARED = Path(os.environ.get("BAECHI_SHARED", ROOT.parent / "shared"))
HAVE_SHARED = (SHARED / "graphs").is_dir()

#: Marks a test that reads ``../shared``; it is skipped, saying so, where that is absent.
needs_shared = pytest.mark.skipif(
    not HAVE_SHARED, reason=f"../shared not found at {SHARED} (it is always present in CI)"
)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not HAVE_SHARED:
        pytest.skip(f"../shared not found at {SHARED}")
    return SHARED
