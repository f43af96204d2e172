"""Shared fixtures: where the bundled data and ``../shared`` live."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

pytest_plugins = ["service_fixtures"]

# A property test's failure prints the blob that replays it (@reproduce_failure): a clone, as
# CI's, has no .hypothesis database, so the blob is the only record of the failing example.
settings.register_profile("baechi", print_blob=True)
settings.load_profile("baechi")

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
SHARED = Path(os.environ.get("BAECHI_SHARED", ROOT.parent / "shared"))
HAVE_SHARED = (SHARED / "graphs").is_dir()
#: Logical CPU devices the TensorFlow tests split the CPU into, standing in for GPUs (DESIGN §8).
TF_DEVICES = 4

#: Marks a test that reads ``../shared``; it is skipped, saying so, where that is absent.
needs_shared = pytest.mark.skipif(
    not HAVE_SHARED, reason=f"../shared not found at {SHARED} (it is always present in CI)"
)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not HAVE_SHARED:
        pytest.skip(f"../shared not found at {SHARED}")
    return SHARED


@pytest.fixture(scope="module")
def tf() -> Any:
    """TensorFlow with the CPU split into ``TF_DEVICES`` logical devices; skips without it."""
    tf = pytest.importorskip("tensorflow")
    from baechi.client.devices import split_cpu

    try:
        split_cpu(TF_DEVICES)
    except RuntimeError as exc:
        pytest.skip(f"cannot split the CPU into {TF_DEVICES} devices here: {exc}")
    return tf
