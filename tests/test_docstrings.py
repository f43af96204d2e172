"""Every example in the engine's docstrings runs and prints what it says."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import baechi

MODULES = ["baechi", *sorted(
    info.name for info in pkgutil.walk_packages(baechi.__path__, "baechi.")
    if info.name != "baechi.report"  # no examples; plotly is tested elsewhere
)]


def test_modules_are_found() -> None:
    assert "baechi.algorithms.etf" in MODULES and "baechi.simulate" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
