"""``examples/torch_end_to_end.py`` runs, in-process engine and through the real service."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from service_fixtures import needs_redis

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "torch_end_to_end.py"


def run_example(*args: str) -> str:
    pytest.importorskip("torch")
    env = {**os.environ}
    env.pop("BAECHI_URL", None)
    done = subprocess.run([sys.executable, str(EXAMPLE), *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    out = done.stdout
    placed = re.search(r"losses \(placed\): (.+)", out)
    unplaced = re.search(r"losses \(unplaced\): (.+)", out)
    assert placed and unplaced, out
    assert placed.group(1) == unplaced.group(1)
    assert len(placed.group(1).split()) == 3
    assert "identical losses (torch.equal): True" in out
    check = re.search(r"device check: (\d+)/(\d+) op runs", out)
    assert check and check.group(1) == check.group(2) and int(check.group(2)) > 0, out
    transfers = re.search(r"apply_plan: (\d+) transfers", out)
    assert transfers, out
    assert re.search(r"predicted step [\d.]+ ms vs [\d.]+ ms on one device", out), out
    return out


def test_example_with_the_embedded_engine() -> None:
    out = run_example("--steps", "3", "--time-limit", "1")
    assert "embedded engine" in out


@needs_redis
@pytest.mark.service
def test_example_through_the_service(service: Any) -> None:
    out = run_example("--server", service.url, "--api-key", service.keys["key-a"],
                      "--steps", "3", "--time-limit", "1")
    assert f"service {service.url}" in out
