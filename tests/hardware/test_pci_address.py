"""PCI addresses from Xid lines, manifests, AER lines and NVML all meet in one canonical form."""

from __future__ import annotations

import pytest

from denpex.hardware.pci import canonical_pci, same_pci_device


@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [
        pytest.param("PCI:0000:3b:00", "0000:3b:00.0", id="xid-line-no-function"),
        pytest.param("0000:3b:00.0", "0000:3b:00.0", id="manifest"),
        pytest.param("00000000:3B:00.0", "0000:3b:00.0", id="nvml-8-digit-upper"),
        pytest.param(b"00000000:3B:00.0\x00\x00", "0000:3b:00.0", id="nvml-bytes-nul-padded"),
        pytest.param("3b:00.0", "0000:3b:00.0", id="no-domain"),
        pytest.param("0000:73:00.1", "0000:73:00.1", id="second-function"),
        pytest.param("10000:01:00.0", "10000:01:00.0", id="vmd-domain"),
        pytest.param("gpu0", None, id="not-an-address"),
        pytest.param("0000:3b:20.0", None, id="device-number-over-31"),
        pytest.param("0000:3b:00.9", None, id="function-over-7"),
        pytest.param(None, None, id="none"),
    ],
)
def test_canonical_pci(spelling: str | bytes | None, canonical: str | None) -> None:
    assert canonical_pci(spelling) == canonical


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        pytest.param("0000:3b:00.0", "0000:3b:00.1", True, id="other-function-same-card"),
        pytest.param("0000:3b:00.0", "0000:5e:00.0", False, id="other-card"),
        pytest.param("0000:3b:00.0", None, False, id="unknown"),
    ],
)
def test_same_pci_device(a: str, b: str | None, same: bool) -> None:
    assert same_pci_device(a, b) is same
