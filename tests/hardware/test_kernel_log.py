"""Kernel log parsing on real-format ``journalctl -k -o short-iso`` lines, one variant per case."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from denpex.hardware import RejectReason, Severity, SignalKind
from denpex.hardware.kernel_log import MAX_LINE_CHARS, parse_kernel_log

P = "2026-11-29T18:45:02+0000 gpu-node-002 kernel: "
T = datetime(2026, 11, 29, 18, 45, 2, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("line", "code", "pci", "pid", "comm", "severity"),
    [
        pytest.param(
            P + "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus.",
            79, "0000:3b:00.0", 4242, "python", Severity.FATAL, id="xid79-with-pid",
        ),
        pytest.param(
            P + "NVRM: Xid (PCI:0000:2b:00): 79, pid=..., GPU has fallen off the bus.",
            79, "0000:2b:00.0", None, None, Severity.FATAL, id="xid79-elided-pid",
        ),
        pytest.param(
            P + "NVRM: Xid (PCI:0000:3b:00): 31, pid=626486, name=pt_main_thread, Ch 00000008, intr 00000000. "
            "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f1a_00000000. Fault is of type FAULT_PDE",
            31, "0000:3b:00.0", 626486, "pt_main_thread", Severity.NON_FATAL, id="xid31-mmu-fault",
        ),
        pytest.param(
            "2026-11-29T18:45:02+00:00 gpu-node-002 kernel: NVRM: Xid (PCI:0000:CB:00): 13, pid='<unknown>', "
            "name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 0, SM 1): Out Of Range Address",
            13, "0000:cb:00.0", None, None, Severity.NON_FATAL, id="xid13-colon-offset-unknown-pid",
        ),
        pytest.param(
            P + "NVRM: Xid (0000:01:00): 31, Ch 0000000b, engmask 00000120, intr 10000000",
            31, "0000:01:00.0", None, None, Severity.NON_FATAL, id="xid-old-form-no-PCI-prefix",
        ),
        pytest.param(
            P + "NVRM: Xid (PCI:0000:01:00): 62, 322bff9a 0000b3b8 00000000 206a4b08 206a3cc8",
            62, "0000:01:00.0", None, None, Severity.FATAL, id="xid62-hex-data",
        ),
        pytest.param(
            P + "[ 4909.922970] NVRM: Xid (PCI:0000:01:00): 13, 0005 00000000 0000502d 00000104",
            13, "0000:01:00.0", None, None, Severity.NON_FATAL, id="xid-printk-time-inside",
        ),
        pytest.param(
            P + "NVRM: Xid (PCI:0000:3b:00): 999, something new",
            999, "0000:3b:00.0", None, None, Severity.UNKNOWN, id="xid-code-not-in-catalog",
        ),
    ],
)
def test_xid_lines(line: str, code: int, pci: str, pid: int | None, comm: str | None, severity: Severity) -> None:
    result = parse_kernel_log([line])
    [event] = result.events
    assert (event.kind, event.code, event.severity) == (SignalKind.XID, code, severity)
    assert event.gpu is not None and event.gpu.pci_bus_id == pci
    assert (event.pid, event.comm) == (pid, comm)
    assert (event.host, event.time) == ("gpu-node-002", T)
    assert event.line == line and result.rejected == 0


@pytest.mark.parametrize(
    ("stamp", "expected"),
    [
        pytest.param("2026-11-29T18:45:02+0000", T, id="plus-0000"),
        pytest.param("2026-11-29T18:45:02+00:00", T, id="plus-00-colon-00"),
        pytest.param("2026-11-30T00:15:02+0530", T, id="non-utc-offset-converted"),
        pytest.param("2026-11-29T13:45:02-0500", T, id="negative-offset"),
        pytest.param("2026-11-29T18:45:02.250000+0000", T.replace(microsecond=250000), id="short-iso-precise"),
    ],
)
def test_timestamps_become_utc(stamp: str, expected: datetime) -> None:
    [event] = parse_kernel_log([f"{stamp} h kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."]).events
    assert event.time == expected and event.time.utcoffset().total_seconds() == 0


@pytest.mark.parametrize(
    ("lines", "severity", "link", "continuations"),
    [
        pytest.param(
            ["nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)"],
            Severity.NON_FATAL, 32, 0, id="non-fatal",
        ),
        pytest.param(
            [
                "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Fatal, Link 28 sourcetrack timeout error (First)",
                "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Severity 1 Engine instance 28 Sub-engine instance 00",
                "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Data {0x00000000, 0x00000000, 0x00000000}",
            ],
            Severity.FATAL, 28, 2, id="fatal-with-data-lines",
        ),
    ],
)
def test_sxid_lines(lines: list[str], severity: Severity, link: int, continuations: int) -> None:
    result = parse_kernel_log([P + line for line in lines])
    [event] = result.events
    assert (event.kind, event.severity, event.link, event.device_pci) == (SignalKind.SXID, severity, link, "0000:05:00.0")
    assert result.continuation_lines == continuations and result.rejected == 0


@pytest.mark.parametrize(
    ("lines", "severity", "device", "reporter", "continuations"),
    [
        pytest.param(
            [
                "nvidia 0000:3b:00.0: PCIe Bus Error: severity=Uncorrectable (Fatal), type=Transaction Layer, (Receiver ID)",
                "nvidia 0000:3b:00.0:   device [10de:2330] error status/mask=00004000/00000000",
                "nvidia 0000:3b:00.0:    [14] CmpltTO                (First)",
            ],
            Severity.FATAL, "0000:3b:00.0", None, 2, id="device-header-fatal-with-details",
        ),
        pytest.param(
            ["pcieport 0000:00:01.0: AER: Multiple Uncorrectable (Non-Fatal) error message received from 0000:73:00.1"],
            Severity.NON_FATAL, "0000:73:00.1", "0000:00:01.0", 0, id="root-port-multiple-non-fatal",
        ),
        pytest.param(
            [
                "pcieport 0000:00:03.0: AER: Uncorrected (Fatal) error received: 0000:3b:00.0",
                "nvidia 0000:3b:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, id=3b00(Requester ID)",
                "nvidia 0000:3b:00.0:   device [10de:20b0] error status/mask=00040000/00000000",
            ],
            Severity.FATAL, "0000:3b:00.0", "0000:00:03.0", 2, id="old-kernel-uncorrected-merged",
        ),
        pytest.param(
            [
                "pcieport 0000:00:1c.5: AER: Corrected error received: 0000:00:1c.5",
                "pcieport 0000:00:1c.5: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)",
                "pcieport 0000:00:1c.5:   device [8086:a33c] error status/mask=00000001/00002000",
                "pcieport 0000:00:1c.5:    [ 0] RxErr                  (First)",
            ],
            Severity.CORRECTABLE, "0000:00:1c.5", "0000:00:1c.5", 3, id="corrected-self-report",
        ),
        pytest.param(
            ["pcieport 0000:00:03.1: AER: PCIe Bus Error: severity=Correctable, type=Data Link Layer, (Transmitter ID)"],
            Severity.CORRECTABLE, "0000:00:03.1", None, 0, id="newer-kernel-AER-prefix",
        ),
        pytest.param(
            ["pcieport 0000:00:1c.5: AER: Multiple Corrected error received: 0000:00:1c.5"],
            Severity.CORRECTABLE, "0000:00:1c.5", "0000:00:1c.5", 0, id="multiple-corrected",
        ),
    ],
)
def test_aer_lines(
    lines: list[str], severity: Severity, device: str, reporter: str | None, continuations: int
) -> None:
    result = parse_kernel_log([P + line for line in lines])
    [event] = result.events
    assert (event.kind, event.severity) == (SignalKind.PCIE_AER, severity)
    assert (event.device_pci, event.reporter_pci) == (device, reporter)
    assert result.continuation_lines == continuations and result.rejected == 0


def test_aer_details_are_kept_with_their_report() -> None:
    result = parse_kernel_log([
        P + "nvidia 0000:3b:00.0: PCIe Bus Error: severity=Uncorrectable (Fatal), type=Transaction Layer, (Receiver ID)",
        P + "nvidia 0000:3b:00.0:    [14] CmpltTO                (First)",
    ])
    assert "CmpltTO" in result.events[0].detail and "Transaction Layer" in result.events[0].detail


@pytest.mark.parametrize(
    ("lines", "pid", "comm", "detail", "continuations"),
    [
        pytest.param(
            ["Out of memory: Killed process 4242 (python) total-vm:98765432kB, anon-rss:12345678kB, file-rss:0kB, "
             "shmem-rss:0kB, UID:0 pgtables:24680kB oom_score_adj:0"],
            4242, "python", "OOM kill", 0, id="global",
        ),
        pytest.param(
            ["Memory cgroup out of memory: Killed process 5151 (pt_main_thread) total-vm:1000kB, anon-rss:900kB, "
             "file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:100kB oom_score_adj:0"],
            5151, "pt_main_thread", "cgroup OOM kill", 0, id="cgroup",
        ),
        pytest.param(
            ["Out of memory: Kill process 1234 (python) score 999 or sacrifice child",
             "Killed process 1234 (python) total-vm:1000kB, anon-rss:900kB, file-rss:0kB"],
            1234, "python", "OOM kill", 1, id="old-kernel-pair",
        ),
        pytest.param(
            ["oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/slurm/job_1,"
             "task_memcg=/slurm/job_1/step_0,task=python,pid=4242,uid=0",
             "Memory cgroup out of memory: Killed process 4242 (python) total-vm:1000kB, anon-rss:900kB"],
            4242, "python", "cgroup OOM kill", 1, id="summary-then-kill",
        ),
    ],
)
def test_oom_lines(lines: list[str], pid: int, comm: str, detail: str, continuations: int) -> None:
    result = parse_kernel_log([P + line for line in lines])
    [event] = result.events
    assert (event.kind, event.pid, event.comm, event.detail) == (SignalKind.OOM, pid, comm, detail)
    assert result.continuation_lines == continuations and result.rejected == 0


def test_gpu_identity_line_maps_pci_to_uuid() -> None:
    result = parse_kernel_log([P + "NVRM: GPU at PCI:0000:3b:00: GPU-5d1e7a2c-1111-2222-3333-444455556666"])
    [gpu] = result.gpus
    assert gpu.gpu.pci_bus_id == "0000:3b:00.0" and gpu.gpu.uuid == "GPU-5d1e7a2c-1111-2222-3333-444455556666"
    assert result.events == [] and result.rejected == 0


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        pytest.param("Nov 29 18:45:02 gpu-node-002 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x", RejectReason.NO_PREFIX, id="syslog-date"),
        pytest.param("[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, x", RejectReason.NO_PREFIX, id="raw-dmesg"),
        pytest.param("-- Boot 3f2c0d8e5a4b4c1e9f6a7b8c9d0e1f2a --", RejectReason.NO_PREFIX, id="journal-banner"),
        # journalctl --no-hostname: no host to place the Xid on; "kernel:" is not a host name.
        pytest.param("2026-11-29T18:45:02+0000 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x", RejectReason.NO_PREFIX,
                     id="no-hostname"),
        pytest.param("2026-11-29T18:45:02 gpu-node-002 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x", RejectReason.BAD_TIME, id="no-offset"),
        pytest.param("2026-13-45T99:99:99+0000 gpu-node-002 kernel: hello", RejectReason.BAD_TIME, id="impossible-date"),
        # Valid ISO times whose UTC conversion leaves the calendar: counted, not an OverflowError.
        pytest.param("0001-01-01T00:00:00+0100 gpu-node-002 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x",
                     RejectReason.BAD_TIME, id="before-year-1-in-utc"),
        pytest.param("9999-12-31T23:59:59-0100 gpu-node-002 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x",
                     RejectReason.BAD_TIME, id="after-year-9999-in-utc"),
        pytest.param(P + "usb 1-1: new high-speed USB device number 2", RejectReason.UNKNOWN_LINE, id="unrelated-kernel-line"),
        pytest.param(P + "pcieport 0000:00:01.0: AER: enabled with IRQ 122", RejectReason.UNKNOWN_LINE, id="aer-setup-line"),
        pytest.param(P + "NVRM: Xid (PCI:0000:3b:00): garbled", RejectReason.MALFORMED_SIGNAL, id="xid-without-code"),
        pytest.param(P + "NVRM: Xid (PCI:0000:3b:00): 123456789012, x", RejectReason.MALFORMED_SIGNAL, id="xid-absurd-code"),
        pytest.param(P + "nvidia-nvswitch0: SXid (PCI:zz): 1, Fatal", RejectReason.MALFORMED_SIGNAL, id="sxid-bad-address"),
        pytest.param(P + "Out of memory: Killed process abc (python)", RejectReason.MALFORMED_SIGNAL, id="oom-without-pid"),
        pytest.param(P + "nvidia 0000:5e:00.0:   device [10de:2330] error status/mask=00004000/00000000",
                     RejectReason.ORPHAN_CONTINUATION, id="aer-detail-without-header"),
        pytest.param(P + "x" * MAX_LINE_CHARS, RejectReason.LINE_TOO_LONG, id="too-long"),
    ],
)
def test_rejected_lines_are_counted_by_reason(line: str, reason: RejectReason) -> None:
    result = parse_kernel_log([line, ""])
    assert result.events == [] and result.rejects == {reason: 1}
    assert result.lines_read == 1  # the blank line is not counted


def test_hosts_with_well_formed_lines_count_as_covered() -> None:
    result = parse_kernel_log([P + "usb 1-1: reset", "2026-11-29T18:45:02+0000 gpu-node-007 kernel: eth0: link up"])
    assert result.hosts == ["gpu-node-002", "gpu-node-007"] and result.events == []


# -- firmware-first PCIe errors (APEI GHES) -------------------------------------------------------
# Dell/HPE/Lenovo servers let the firmware own AER; the kernel prints the firmware's CPER record
# ("{N}" groups one record), then decodes its AER registers under the device (cper_print_aer).

GHES_PCIE = [
    "{1}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 1",
    "{1}[Hardware Error]: event severity: recoverable",
    "{1}[Hardware Error]:  Error 0, type: recoverable",
    "{1}[Hardware Error]:   section_type: PCIe error",
    "{1}[Hardware Error]:   port_type: 0, PCIe end point",
    "{1}[Hardware Error]:   version: 3.0",
    "{1}[Hardware Error]:   command: 0x0546, status: 0x4010",
    "{1}[Hardware Error]:   device_id: 0000:3b:00.0",
    "{1}[Hardware Error]:   slot: 0",
    "{1}[Hardware Error]:   secondary_bus: 0x00",
    "{1}[Hardware Error]:   vendor_id: 0x10de, device_id: 0x2330",
    "{1}[Hardware Error]:   class_code: 030200",
    "{1}[Hardware Error]:   aer_uncor_status: 0x00004000, aer_uncor_mask: 0x00000000",
    "{1}[Hardware Error]:   aer_uncor_severity: 0x00462030",
    "{1}[Hardware Error]:   TLP Header: 4a000001 0e000004 3b000000 00000000",
    "pcieport 0000:3a:00.0: AER: aer_status: 0x00004000, aer_mask: 0x00000000",
    "pcieport 0000:3a:00.0: AER:    [14] CmplTO                 (First)",
    "pcieport 0000:3a:00.0: AER: aer_layer=Transaction Layer, aer_agent=Requester ID",
    "pcieport 0000:3a:00.0: AER: aer_uncor_severity: 0x00462030",
]
GHES_MEMORY = [
    "{2}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 1",
    "{2}[Hardware Error]: It has been corrected by h/w and requires no further action",
    "{2}[Hardware Error]: event severity: corrected",
    "{2}[Hardware Error]:  Error 0, type: corrected",
    "{2}[Hardware Error]:  fru_text: B3",
    "{2}[Hardware Error]:   section_type: memory error",
    "{2}[Hardware Error]:   error_status: Storage error in DRAM memory (0x0000000000000400)",
    "{2}[Hardware Error]:   physical_address: 0x000000207ffd3e40",
    "{2}[Hardware Error]:   node:1 card:1 module:1 rank:0 bank:3 device:0 row:12345 column:1016",
    "{2}[Hardware Error]:   error_type: 2, single-bit ECC",
]


def ghes_block(seq: int, severity: str, device: str, *, section_type: str | None = None) -> list[str]:
    """The GHES_PCIE record renumbered, with another severity and device (and no AER decode lines)."""
    lines = [line.replace("{1}", f"{{{seq}}}") for line in GHES_PCIE if line.startswith("{")]
    lines[1] = f"{{{seq}}}[Hardware Error]: event severity: {severity}"
    lines[2] = f"{{{seq}}}[Hardware Error]:  Error 0, type: {section_type or severity}"
    lines[7] = f"{{{seq}}}[Hardware Error]:   device_id: {device}"
    return lines


@pytest.mark.parametrize(
    ("lines", "severity"),
    [
        pytest.param(GHES_PCIE, Severity.NON_FATAL, id="recoverable-with-aer-decode"),
        pytest.param(ghes_block(1, "fatal", "0000:3b:00.0"), Severity.FATAL, id="fatal"),
        pytest.param(
            [ghes_block(1, "corrected", "0000:3b:00.0")[0],
             "{1}[Hardware Error]: It has been corrected by h/w and requires no further action",
             *ghes_block(1, "corrected", "0000:3b:00.0")[1:]],
            Severity.CORRECTABLE, id="corrected",
        ),
        # The section's own type is the PCIe error's severity; the event severity is the record's worst.
        pytest.param(ghes_block(1, "fatal", "0000:3b:00.0", section_type="recoverable"), Severity.NON_FATAL,
                     id="section-type-wins"),
        pytest.param(ghes_block(1, "info", "0000:3b:00.0"), Severity.UNKNOWN, id="info-is-not-an-error-severity"),
    ],
)
def test_ghes_pcie_record_is_one_aer_event(lines: list[str], severity: Severity) -> None:
    result = parse_kernel_log([P + line for line in lines])
    [event] = result.events
    assert (event.kind, event.severity, event.host, event.time) == (SignalKind.PCIE_AER, severity, "gpu-node-002", T)
    # "vendor_id: 0x10de, device_id: 0x2330" names the PCI device id, not an address.
    assert (event.device_pci, event.reporter_pci) == ("0000:3b:00.0", None)
    assert "APEI" in event.detail and "PCIe end point" in event.detail
    assert result.continuation_lines == len(lines) - 1 and result.rejected == 0


def test_ghes_aer_decode_lines_are_details_of_the_record() -> None:
    result = parse_kernel_log([P + line for line in GHES_PCIE])
    [event] = result.events
    assert "CmplTO" in event.detail and "aer_layer=Transaction Layer" in event.detail


def test_ghes_record_without_a_device_address_still_counts() -> None:
    lines = [line for line in ghes_block(1, "fatal", "0000:3b:00.0") if "device_id: 0000" not in line]
    [event] = parse_kernel_log([P + line for line in lines]).events
    assert (event.severity, event.device_pci) == (Severity.FATAL, None)


def test_ghes_memory_error_stays_unknown() -> None:
    result = parse_kernel_log([P + line for line in GHES_MEMORY])
    assert result.events == [] and result.rejects == {RejectReason.UNKNOWN_LINE: len(GHES_MEMORY)}


def test_ghes_record_with_a_memory_and_a_pcie_section() -> None:
    pcie = ghes_block(2, "fatal", "0000:5e:00.0")[2:]  # "Error 0, type: fatal" onwards
    lines = [*GHES_MEMORY, pcie[0].replace("Error 0", "Error 1"), *pcie[1:]]
    result = parse_kernel_log([P + line for line in lines])
    [event] = result.events
    assert (event.severity, event.device_pci) == (Severity.FATAL, "0000:5e:00.0")
    assert result.rejects == {RejectReason.UNKNOWN_LINE: len(GHES_MEMORY)}
    assert result.continuation_lines == len(pcie) - 1


def test_interleaved_ghes_records_do_not_mix() -> None:
    first, second = ghes_block(3, "fatal", "0000:3b:00.0"), ghes_block(4, "corrected", "0000:5e:00.0")
    second[10] = "{4}[Hardware Error]:   vendor_id: 0x15b3, device_id: 0x1021"
    interleaved = [line for pair in zip(first, second) for line in pair]
    result = parse_kernel_log([P + line for line in interleaved])
    assert [(e.device_pci, e.severity) for e in result.events] == [
        ("0000:3b:00.0", Severity.FATAL), ("0000:5e:00.0", Severity.CORRECTABLE)]
    assert "0x15b3" not in result.events[0].detail and "0x15b3" in result.events[1].detail
    assert result.rejected == 0


def test_ghes_records_from_two_hosts_do_not_mix() -> None:
    a = ["2026-11-29T18:45:02+0000 gpu-node-001 kernel: " + line for line in ghes_block(1, "fatal", "0000:3b:00.0")]
    b = ["2026-11-29T18:45:02+0000 gpu-node-002 kernel: " + line for line in ghes_block(1, "corrected", "0000:5e:00.0")]
    result = parse_kernel_log([line for pair in zip(a, b) for line in pair])
    assert sorted((e.host, e.device_pci, e.severity) for e in result.events) == [
        ("gpu-node-001", "0000:3b:00.0", Severity.FATAL), ("gpu-node-002", "0000:5e:00.0", Severity.CORRECTABLE)]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        pytest.param(P + "{9}[Hardware Error]:   device_id: 0000:3b:00.0", RejectReason.ORPHAN_CONTINUATION,
                     id="ghes-line-without-its-record"),
        pytest.param(P + "pcieport 0000:3a:00.0: AER: aer_layer=Transaction Layer, aer_agent=Requester ID",
                     RejectReason.ORPHAN_CONTINUATION, id="aer-decode-without-a-record"),
        pytest.param(P + "mce: [Hardware Error]: Machine check events logged", RejectReason.UNKNOWN_LINE, id="mce"),
        pytest.param(P + "{9}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 1",
                     RejectReason.UNKNOWN_LINE, id="ghes-header-alone"),
    ],
)
def test_ghes_lines_without_a_pcie_record_are_counted(line: str, reason: RejectReason) -> None:
    result = parse_kernel_log([line])
    assert result.events == [] and result.rejects == {reason: 1}


# -- Xid 154: the driver's GPU recovery action ----------------------------------------------------


@pytest.mark.parametrize(
    ("tail", "action", "severity"),
    [
        pytest.param("from 0x0 (None) to 0x1 (GPU Reset Required)", 1, Severity.FATAL, id="gpu-reset"),
        pytest.param("from 0x0 (None) to 0x2 (Node Reboot Required)", 2, Severity.FATAL, id="node-reboot"),
        # The text in parentheses varies between drivers; the number is what counts.
        pytest.param("from 0x0 (None) to 0x2 (OS Reboot)", 2, Severity.FATAL, id="node-reboot-other-text"),
        pytest.param("from 0x0 (None) to 0x1 (PF FLR)", 1, Severity.FATAL, id="gpu-reset-other-text"),
        pytest.param("from 0x0 (None) to 0x4 (Drain and Reset)", 4, Severity.FATAL, id="drain-and-reset"),
        pytest.param("from 0x1 (GPU Reset Required) to 0x0 (None)", 0, Severity.NON_FATAL, id="back-to-none"),
        pytest.param("from 0x0 (None) to 0x5 (Recover IMEX Domain)", 5, Severity.NON_FATAL, id="recover-imex-domain"),
        pytest.param("from 0x0 (None) to 0x9 (Something New)", 9, Severity.UNKNOWN, id="action-not-in-catalog"),
    ],
)
def test_xid154_takes_its_severity_from_the_new_recovery_action(tail: str, action: int, severity: Severity) -> None:
    line = P + f"NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed {tail}"
    [event] = parse_kernel_log([line]).events
    assert (event.code, event.recovery_action, event.severity) == (154, action, severity)
    assert event.gpu is not None and event.gpu.pci_bus_id == "0000:01:00.0"


def test_xid154_without_an_action_is_unclassified() -> None:
    [event] = parse_kernel_log([P + "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed"]).events
    assert (event.code, event.recovery_action, event.severity) == (154, None, Severity.UNKNOWN)


def test_only_the_kernels_own_lines_carry_signals() -> None:
    """Issue 8 item 7: any program can log text shaped like an Xid; it must not support a drain."""
    spoofed = [
        "2026-11-29T18:45:02+0000 gpu-node-002 myapp[123]: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
        "2026-11-29T18:45:02+0000 gpu-node-002 root: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
        "2026-11-29T18:45:02+0000 gpu-node-002 python3[4242]: pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:3b:00.0",
    ]
    result = parse_kernel_log(spoofed)
    assert result.events == [] and result.rejects == {RejectReason.NOT_KERNEL: 3}
    genuine = parse_kernel_log([spoofed[0].replace("myapp[123]:", "kernel:")])
    assert [(e.kind.value, e.code) for e in genuine.events] == [("xid", 79)]
