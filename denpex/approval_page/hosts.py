"""Which ``Host`` the approval page answers to: the guard against DNS rebinding.

A site an approver visits can point its own name at the page's address (DNS rebinding); the
approver's browser then sends that site's requests to the page, from the approver's own address,
with the site's name as ``Host``. They could spend the approver's allowance of wrong codes. So the
page answers only to names the operator lists (``serve-approvals --allowed-host``) and to what no
rebinding can forge: an IP address, or ``localhost``.

    host_allowed("approvals.example.com:8090", ("approvals.example.com",))  # True
    host_allowed("10.0.0.5:8090", ())                                      # True: an address
    host_allowed("evil.example", ("*.example.com",))                       # False
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

__all__ = ["host_allowed", "check_host_pattern"]


def host_allowed(header: str, allowed: Sequence[str]) -> bool:
    """Whether a request's ``Host`` (or a trusted proxy's ``X-Forwarded-Host``) names this page:
    an IP address, ``localhost``, or a name in ``allowed`` (``*.example.com`` takes its subdomains)."""
    name = _name_of(header.strip())
    if not name:
        return False
    if name == "localhost" or _is_address(name):
        return True
    for pattern in allowed:
        wanted = pattern.lower().rstrip(".")
        if wanted.startswith("*.") and name.endswith(wanted[1:]) and len(name) > len(wanted) - 1:
            return True
        if name == wanted:
            return True
    return False


def check_host_pattern(pattern: str) -> str:
    """``pattern`` as ``--allowed-host`` takes it (ValueError otherwise): a name, or ``*.`` and a name."""
    wildcard = pattern.startswith("*.")
    name = pattern[2:] if wildcard else pattern
    labels = name.rstrip(".").split(".")
    if not name or len(pattern) > 253 or any(not label or not all(c.isalnum() or c == "-" for c in label)
                                             for label in labels):
        raise ValueError(f"{pattern!r} is not a host name (a name like approvals.example.com, or *.example.com)")
    if wildcard and len(labels) < 2:  # "*.com" would take every site under a top-level domain
        raise ValueError(f"{pattern!r} covers a whole top-level domain: name the domain (*.example.com)")
    return pattern.lower()


def _name_of(header: str) -> str:
    """The name in a Host header, without its port: ``[::1]:8090`` is ``::1``."""
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else ""
    name = header.rsplit(":", 1)[0] if header.count(":") == 1 else header
    return name.lower().rstrip(".")


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
