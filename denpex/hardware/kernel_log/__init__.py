"""Parse kernel log text (``journalctl -k -o short-iso``) into hardware events.

Each line is ``TIME HOST IDENT: message``; the time must carry a UTC offset (``+0000`` or
``+00:00``). Recognised messages:

- Xid: ``NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus.``;
  for Xid 154 the new recovery action (``... changed from 0x0 (None) to 0x2 (Node Reboot Required)``)
- GPU identity: ``NVRM: GPU at PCI:0000:3b:00: GPU-5d1e...`` (maps a PCI address to a UUID)
- SXid: ``nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress ...``
  (data lines with the same code and no Fatal/Non-fatal word are folded into it)
- PCIe AER: ``nvidia 0000:3b:00.0: PCIe Bus Error: severity=Uncorrectable (Fatal), type=...``,
  root ports' ``AER: Multiple Uncorrected (Non-Fatal) error message received from 0000:73:00.1``,
  and detail lines (``device [10de:2330] error status/mask=...``, ``[14] CmpltTO``) folded in
- Firmware-first PCIe errors (APEI GHES), as servers whose firmware owns AER log them: a CPER
  record of ``{N}[Hardware Error]: ...`` lines (``{N}`` groups one record) whose
  ``section_type: PCIe error`` section becomes the same PCIe AER event as the native lines, with
  its severity (fatal, recoverable -> non-fatal, corrected) and ``device_id: 0000:3b:00.0``; the
  kernel's AER decode after it (``pcieport ...: AER: aer_status: ...``) is folded in. Other
  sections (memory, processor errors) are counted as unknown lines.
- OOM: ``Out of memory: Killed process 1234 (python) ...``, the ``Memory cgroup out of memory:``
  form, the older ``Kill process ... or sacrifice child`` / ``Killed process`` pair and the
  ``oom-kill:...,task=python,pid=1234`` summary (one event per killed pid)

Example::

    >>> result = parse_kernel_log([
    ...     "2026-11-29T18:45:02+0000 gpu-node-002 kernel: NVRM: Xid (PCI:0000:3b:00): 79, "
    ...     "pid=4242, name=python, GPU has fallen off the bus.",
    ...     "2026-11-29T18:45:03+0000 gpu-node-002 kernel: usb 1-1: new device",
    ... ])
    >>> e = result.events[0]
    >>> (e.kind.value, e.code, e.gpu.pci_bus_id, e.pid, e.severity.value)
    ('xid', 79, '0000:3b:00.0', 4242, 'fatal')
    >>> dict(result.rejects)
    {<RejectReason.UNKNOWN_LINE: 'unknown_line'>: 1}
"""


from denpex.hardware.kernel_log.reader import KernelLogReader, parse_kernel_log
from denpex.hardware.line_reader import MAX_LINE_CHARS

__all__ = ["parse_kernel_log", "KernelLogReader", "MAX_LINE_CHARS"]
