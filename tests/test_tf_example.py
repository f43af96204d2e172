"""``examples/keras_end_to_end.py`` runs, in-process engine and through the real service."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import HAVE_TENSORFLOW
from service_fixtures import needs_redis

pytestmark = pytest.mark.tf

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "keras_end_to_end.py"


def run_example(*args: str) -> str:
    if not HAVE_TENSORFLOW:
        pytest.skip("TensorFlow is not installed (the tf extra)")
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("BAECHI_URL", None)
    done = subprocess.run([sys.executable, str(EXAMPLE), *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    match = re.search(r"placement: (\d+)/(\d+) planned ops", out)
    assert match, out
    assert int(match.group(1)) >= 0.99 * int(match.group(2)) > 0
    assert re.search(r"step time: predicted [\d.]+ ms .* measured [\d.]+ ms", out), out
    return out


def test_example_with_the_embedded_engine() -> None:
    out = run_example("--steps", "5")
    assert "embedded engine" in out


@needs_redis
@pytest.mark.service
def test_example_through_the_service(service: Any) -> None:
    out = run_example("--server", service.url, "--api-key", service.keys["key-a"],
                      "--steps", "5")
    assert f"service {service.url}" in out
