"""Shared fixtures: where the bundled data and ``../shared`` live."""

from __future__ import annotations

import gc
import importlib.util
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
#: Logical CPU devices the TensorFlow tests split the CPU into, standing in for GPUs (docs/format.md §8).
TF_DEVICES = 4

#: Marks a test that reads ``../shared``; it is skipped, saying so, where that is absent.
needs_shared = pytest.mark.skipif(
    not HAVE_SHARED, reason=f"../shared not found at {SHARED} (it is always present in CI)"
)


#: Whether the ``tf`` extra is installed; found without importing it (see below).
HAVE_TENSORFLOW = importlib.util.find_spec("tensorflow") is not None

#: Marks a test that needs TensorFlow installed but runs it in a child process only.
needs_tensorflow = pytest.mark.skipif(not HAVE_TENSORFLOW,
                                      reason="TensorFlow is not installed (the tf extra)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``tf`` run last, in their files' order. Once TensorFlow is imported in
    this process, ``place`` runs every placement in a fresh interpreter
    (``baechi.api.CONFLICTING_MODULES``): the tests after it ran up to 20 times slower
    (tests/test_search.py's property test: 118 s instead of 6 s)."""
    items.sort(key=lambda item: item.get_closest_marker("tf") is not None)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Imports and collection leave about 300k objects alive for the whole session; frozen,
    the garbage collector no longer walks them on every full collection. Each walk paused
    this process 0.25-0.45 s (up to 1.2 s once TensorFlow is imported), enough to starve
    one of ``auto``'s time shares: in CI, m-SCT's plan placed as if memory were unlimited got
    0.47 s of tests/test_repair.py's 5 s request and was not placed. A service worker places
    in a fresh work horse, which such a pause does not hit."""
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not HAVE_SHARED:
        pytest.skip(f"../shared not found at {SHARED}")
    return SHARED


@pytest.fixture(scope="module")
def tf() -> Any:
    """TensorFlow with the CPU split into ``TF_DEVICES`` logical devices; skips without it."""
    tf = pytest.importorskip("tensorflow")
    from baechi.client.tf.devices import split_cpu

    try:
        split_cpu(TF_DEVICES)
    except RuntimeError as exc:
        pytest.skip(f"cannot split the CPU into {TF_DEVICES} devices here: {exc}")
    return tf
