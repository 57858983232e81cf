"""One canonical spelling of a PCI address, so Xid lines, AER lines, NVML and manifests match.

The same GPU is written three ways:

- kernel Xid lines: ``PCI:0000:3b:00`` (no function number),
- manifests and AER lines: ``0000:3b:00.0``,
- NVML ``busId``: ``00000000:3B:00.0`` (8-digit domain, upper case, sometimes bytes).

``canonical_pci`` turns each into ``dddd:bb:dd.f`` in lower case (``0000:3b:00.0``); a domain above
0xffff (VMD domains such as ``10000``) keeps its significant digits. A missing function is taken as
``.0``: Xid lines name a GPU, and a GPU is function 0.

    >>> canonical_pci("PCI:0000:3B:00")
    '0000:3b:00.0'
    >>> canonical_pci("00000000:3B:00.0")
    '0000:3b:00.0'
    >>> canonical_pci("gpu0") is None
    True
"""

from __future__ import annotations

import re

__all__ = ["canonical_pci", "same_pci_device", "PCI_ADDRESS_PATTERN"]

# domain:bus:device[.function]; the domain may be 4 to 8 hex digits, or absent in old logs.
PCI_ADDRESS_PATTERN = r"(?:[0-9A-Fa-f]{4,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?"

_ADDRESS = re.compile(
    r"^(?:PCI:)?(?:(?P<domain>[0-9a-f]{4,8}):)?(?P<bus>[0-9a-f]{2}):(?P<dev>[0-9a-f]{2})"
    r"(?:\.(?P<fn>[0-7]))?$"
)


def canonical_pci(address: str | bytes | None) -> str | None:
    """Return ``dddd:bb:dd.f`` for any common spelling of a PCI address, or ``None`` if it is not one."""
    if address is None:
        return None
    if isinstance(address, bytes):
        address = address.decode("ascii", errors="replace")
    text = address.strip().rstrip("\x00").strip().lower()
    if text.startswith("pci:"):
        text = text[4:]
    match = _ADDRESS.match(text)
    if match is None:
        return None
    domain = int(match["domain"] or "0", 16)
    bus, dev = int(match["bus"], 16), int(match["dev"], 16)
    if dev > 0x1F:
        # A PCI device number has 5 bits; anything larger is not an address.
        return None
    fn = int(match["fn"] or "0")
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}"


def same_pci_device(a: str | None, b: str | None) -> bool:
    """True when two canonical addresses name the same device slot (any function).

    A GPU's audio or other functions (``.1``) sit on the same card, so an AER report for them is on
    the GPU's own PCIe path.
    """
    if a is None or b is None:
        return False
    return a.rsplit(".", 1)[0] == b.rsplit(".", 1)[0]
