"""The kernel log's patterns and values, as data: what each recognised line looks like
(``journalctl -k -o short-iso``), and how its words become times and severities. The reader
(``reader.py``, ``pcie.py``) only dispatches on them."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from denpex.hardware.events import Severity, to_utc
from denpex.hardware.pci import PCI_ADDRESS_PATTERN

# Lines of one report (root-port AER + device header, repeated OOM lines) arrive within this.
SAME_REPORT = timedelta(seconds=5)
# Codes are small integers; anything longer is garbage, not a code.
MAX_CODE = 1_000_000

ADDR = PCI_ADDRESS_PATTERN
# A host name never ends in ":"; "TIME kernel: msg" (journalctl --no-hostname) has no host at all.
PREFIX = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\d[T ]\S+)\s+(?P<host>\S*[^\s:])\s+(?P<ident>[^\s:]+):\s?(?P<msg>.*)$")
PRINTK_TIME = re.compile(r"^\[\s*\d+\.\d+\]\s*")

XID = re.compile(r"NVRM: Xid\b.*?:\s*(?P<code>\d+)\s*(?:,|$)\s*(?P<rest>.*)$")
XID_PCI = re.compile(rf"NVRM: Xid\s*\((?:PCI:)?(?P<pci>{ADDR})\)")
PID = re.compile(r"\bpid='?(?P<pid>\d+)'?")
NAME = re.compile(r"\bname=(?P<name>[^,]*)")
GPU_AT = re.compile(rf"NVRM: GPU at PCI:(?P<pci>{ADDR}): (?P<uuid>GPU-[0-9A-Fa-f-]+)")
# Xid 154. The text in parentheses varies between drivers ("Node Reboot Required", "OS Reboot"); the
# number is NVML's recovery action and is what the catalog reads.
RECOVERY = re.compile(
    r"recovery action changed from\s+(?:0x)?[0-9a-fA-F]+(?:\s*\([^()]{0,64}\))?\s+to\s+(?:0x)?(?P<to>[0-9a-fA-F]{1,8})\b"
)

SXID = re.compile(rf"SXid\s*\((?:PCI:)?(?P<pci>{ADDR})\):\s*(?P<code>\d+)\s*,?\s*(?P<rest>.*)$")
LINK = re.compile(r"\b[Ll]ink\s*#?(?P<link>\d+)")

DEVICE_PREFIX = re.compile(rf"^(?:(?P<drv>\S+)\s+)?(?P<bdf>{ADDR}):\s+(?P<body>.*)$")
AER_HEADER = re.compile(
    r"^(?:AER:\s*)?PCIe Bus Error:\s*severity=(?P<sev>[^,]+)(?:,\s*type=(?P<type>[^,]+))?(?:,\s*(?P<agent>.*))?$"
)
AER_DETAIL = re.compile(
    r"^(?:AER:\s*)?(?:device \[[0-9a-fA-F]{4}:[0-9a-fA-F]{4}\]|\[\s*\d+\]|TLP Header|"
    r"(?:Uncorrectable|Correctable) error status|aer_\w+:|aer_layer=|error status/mask)"
)
ADDR_IN_TEXT = re.compile(ADDR)

# Firmware-first (APEI GHES) CPER records, as drivers/firmware/efi/cper.c prints them. ``{N}`` is
# a counter per record: records printed at the same time interleave, and N restarts at each boot.
GHES = re.compile(r"^(?:\{(?P<seq>\d{1,10})\})?\[Hardware Error\]:\s*(?P<body>.*)$")
GHES_HEADER = "Hardware error from APEI Generic Hardware Error Source"
GHES_SEVERITY = re.compile(r"^event severity:\s*(?P<sev>\w+)")
GHES_SECTION = re.compile(r"^Error \d+, type:\s*(?P<sev>\w+)")
GHES_SECTION_TYPE = re.compile(r"^section[_ ]type:\s*(?P<type>.*)$")
# The section's address. "vendor_id: 0x10de, device_id: 0x2330" names the PCI device id instead;
# anchoring at the start of the body keeps the two apart.
GHES_DEVICE = re.compile(rf"^device_id:\s*(?P<bdf>{ADDR})\s*$")
# CPER severities (cper_severity_str); the kernel maps them to AER ones the same way.
CPER_SEVERITY = {"fatal": Severity.FATAL, "recoverable": Severity.NON_FATAL, "corrected": Severity.CORRECTABLE}

OOM = re.compile(
    r"(?:Memory cgroup out of memory|Out of memory(?: \([^)]*\))?):\s*Kill(?:ed)? process\s+"
    r"(?P<pid>\d+)\s+\((?P<comm>[^)]*)\)"
)
OOM_KILLED = re.compile(r"^Killed process\s+(?P<pid>\d+)\s+\((?P<comm>[^)]*)\)")
OOM_SUMMARY = re.compile(r"^oom-kill:.*?\btask=(?P<comm>[^,]*),pid=(?P<pid>\d+)")


def cper_severity(text: str) -> Severity:
    # "info" is not an error severity at all: the record does not say how bad it is.
    return CPER_SEVERITY.get(text.strip().lower(), Severity.UNKNOWN)


def parse_time(text: str) -> datetime | None:
    """``2026-11-29T18:45:02+0000`` (or ``+00:00``, fractions, ``Z``) to an aware datetime."""
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    # A time without an offset cannot be placed against the dumps' UTC times.
    if parsed.tzinfo is None:
        return None
    try:
        return to_utc(parsed)
    except ValueError:
        # "0001-01-01T00:00:00+0100" is valid ISO but lies before year 1 in UTC: garbage, not a crash.
        return None


def aer_severity(text: str) -> Severity:
    """Loose: "Uncorrectable (Fatal)", "Uncorrected (Non-Fatal)", "Corrected", "Correctable"."""
    lowered = text.lower()
    if "non-fatal" in lowered or "nonfatal" in lowered:
        return Severity.NON_FATAL
    if "fatal" in lowered:
        return Severity.FATAL
    if "uncorrect" in lowered:
        return Severity.UNKNOWN
    if "correct" in lowered:
        return Severity.CORRECTABLE
    return Severity.UNKNOWN


def same_report(a: datetime, b: datetime) -> bool:
    return abs(b - a) <= SAME_REPORT


def small_int(text: str) -> int | None:
    # pids and link numbers are small; a 40-digit "pid" is garbage, not a process.
    return int(text) if len(text) <= 10 else None
