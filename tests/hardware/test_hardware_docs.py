"""The worked examples in the hardware modules' docstrings stay true."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["pci", "xid_catalog", "kernel_log", "collector_log", "telemetry", "describe"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(f"denpex.hardware.{name}")
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
