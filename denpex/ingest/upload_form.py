"""The parts of an upload's ``multipart/form-data`` body, read from its spool file in chunks.

The body is never loaded whole: the ``dump`` part goes to a spool file of its own (hashed as it is
written), ``identity``, ``telemetry`` and ``stacks`` parts to memory under their caps. Example::

    --b
    Content-Disposition: form-data; name="identity"

    {"job_id": "job-1", "incident_id": "inc-1", "rank": 0, "world_size": 4}
    --b
    Content-Disposition: form-data; name="dump"; filename="rank_0.pkl"

    <the dump's bytes>
    --b
    Content-Disposition: form-data; name="stacks"; filename="rank_0.stacks.json"

    {"format": "denpex.stacks/1", "rank": 0, "source": "collector", "threads": [...]}
    --b--

    -> UploadForm(identity=b'{"job_id": ...}', dump=DumpPart(filename="rank_0.pkl", file=SpooledFile(...)),
                  telemetry=[], stacks={StackSource.COLLECTOR: b'{"format": ...}'})

The stacks parts are named for their source: ``stacks`` (the collector's file) and
``stacks_pyspy`` (the py-spy sidecar's), each at most once and each under the stacks model's byte
limit; what they hold is checked by :mod:`denpex.ingest.stacks_check`.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from denpex.evidence.stacks import MAX_BYTES as MAX_STACKS_BYTES
from denpex.evidence.stacks import StackSource
from denpex.ingest.body_spool import SpooledFile, SpoolSlot
from denpex.ingest.errors import InvalidRequestError, PayloadTooLargeError

__all__ = ["FormCaps", "DumpPart", "UploadForm", "STACKS_PARTS", "parse_upload_form"]

_CHUNK = 1 << 20

STACKS_PARTS = {"stacks": StackSource.COLLECTOR, "stacks_pyspy": StackSource.PY_SPY}
"""The stacks part names and the source each must hold (one file of each per upload)."""


@dataclass(frozen=True, slots=True)
class FormCaps:
    """Caps on the parts (the dump's is docs/contracts.md's 256 MiB by default)."""

    max_dump_bytes: int
    max_telemetry_bytes: int
    max_identity_bytes: int = 1 << 20
    max_telemetry_parts: int = 32
    max_stacks_bytes: int = MAX_STACKS_BYTES
    """Per stacks part: the stacks model's own byte limit."""


@dataclass(frozen=True, slots=True)
class DumpPart:
    """The ``dump`` part: its file name (which says the encoding) and its spooled bytes."""

    filename: str
    file: SpooledFile


@dataclass(frozen=True, slots=True)
class UploadForm:
    """The parts of one upload."""

    identity: bytes
    dump: DumpPart | None
    """None for a node agent's telemetry-only upload (then ``telemetry`` is not empty)."""
    telemetry: list[bytes]
    stacks: dict[StackSource, bytes] = field(default_factory=dict)
    """The stacks files sent, by the source their part name says (not yet checked)."""


@dataclass
class _Part:
    name: str = ""
    filename: str | None = None
    fd: int | None = None
    path: Path | None = None
    size: int = 0
    digest: hashlib._Hash = field(default_factory=hashlib.sha256)
    buffer: bytearray = field(default_factory=bytearray)


class _Collector:
    """python-multipart's callbacks: routes each part's bytes to memory or the spool."""

    def __init__(self, slot: SpoolSlot, caps: FormCaps) -> None:
        self.slot = slot
        self.caps = caps
        self.part = _Part()
        self.header_field = bytearray()
        self.header_value = bytearray()
        self.headers: dict[bytes, bytes] = {}
        self.identity: bytes | None = None
        self.dump: DumpPart | None = None
        self.telemetry: list[bytes] = []
        self.telemetry_bytes = 0
        self.stacks: dict[StackSource, bytes] = {}

    def on_part_begin(self) -> None:
        self.part = _Part()
        self.headers = {}

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self.header_field += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self.header_value += data[start:end]

    def on_header_end(self) -> None:
        self.headers[bytes(self.header_field).lower()] = bytes(self.header_value)
        self.header_field.clear()
        self.header_value.clear()

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self.headers.get(b"content-disposition", b""))
        self.part.name = options.get(b"name", b"").decode("utf-8", errors="replace")
        filename = options.get(b"filename")
        self.part.filename = filename.decode("utf-8", errors="replace") if filename is not None else None
        if self.part.name == "dump":
            if self.dump is not None:
                raise InvalidRequestError("an upload has one part 'dump'")
            self.part.path, self.part.fd = self.slot.new_file("dump")
        elif self.part.name == "telemetry" and len(self.telemetry) >= self.caps.max_telemetry_parts:
            raise InvalidRequestError(f"at most {self.caps.max_telemetry_parts} telemetry parts per upload")
        elif self.part.name in STACKS_PARTS and STACKS_PARTS[self.part.name] in self.stacks:
            raise InvalidRequestError(f"an upload has at most one part {self.part.name!r} (one rank's stacks file)")

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        chunk = data[start:end]
        part = self.part
        part.size += len(chunk)
        if part.name == "dump":
            if part.size > self.caps.max_dump_bytes:
                raise PayloadTooLargeError(f"the dump is over the {self.caps.max_dump_bytes:,}-byte cap per "
                                           "dump; nothing was stored")
            self.slot.charge(len(chunk))
            part.digest.update(chunk)
            view = memoryview(chunk)
            while view and part.fd is not None:  # the fd is opened in on_headers_finished
                view = view[os.write(part.fd, view):]
        elif part.name == "identity":
            if part.size > self.caps.max_identity_bytes:
                raise PayloadTooLargeError(f"the identity part is over its {self.caps.max_identity_bytes:,}-byte "
                                           "cap; nothing was stored")
            part.buffer += chunk
        elif part.name == "telemetry":
            self.telemetry_bytes += len(chunk)
            if self.telemetry_bytes > self.caps.max_telemetry_bytes:
                raise PayloadTooLargeError(f"the telemetry parts are over their {self.caps.max_telemetry_bytes:,}"
                                           "-byte cap; nothing was stored")
            part.buffer += chunk
        elif part.name in STACKS_PARTS:
            if part.size > self.caps.max_stacks_bytes:
                raise PayloadTooLargeError(f"the {part.name} part is over its {self.caps.max_stacks_bytes:,}-byte "
                                           "cap; nothing was stored")
            part.buffer += chunk
        # Parts with other names are skipped: read, never kept.

    def on_part_end(self) -> None:
        part = self.part
        if part.name == "dump" and part.fd is not None and part.path is not None:
            os.close(part.fd)
            part.fd = None
            self.dump = DumpPart(filename=part.filename or "dump",
                                 file=SpooledFile(path=part.path, size=part.size, sha256=part.digest.hexdigest()))
        elif part.name == "identity":
            self.identity = bytes(part.buffer)
        elif part.name == "telemetry":
            self.telemetry.append(bytes(part.buffer))
        elif part.name in STACKS_PARTS:
            self.stacks[STACKS_PARTS[part.name]] = bytes(part.buffer)

    def close(self) -> None:
        if self.part.fd is not None:
            os.close(self.part.fd)
            self.part.fd = None


def parse_upload_form(body: Path, content_type: str, slot: SpoolSlot, caps: FormCaps) -> UploadForm:
    """The parts of the spooled body; a bad body is 422, a part over its cap 413."""
    kind, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise InvalidRequestError("an upload is multipart/form-data (with a boundary) with the parts "
                                  "'identity' and 'dump'")
    collector = _Collector(slot, caps)
    callbacks = {name: getattr(collector, name) for name in (
        "on_part_begin", "on_header_field", "on_header_value", "on_header_end", "on_headers_finished",
        "on_part_data", "on_part_end")}
    parser = MultipartParser(boundary, callbacks)  # type: ignore[arg-type]
    try:
        with body.open("rb") as fh:
            while chunk := fh.read(_CHUNK):
                parser.write(chunk)
        parser.finalize()
    except MultipartParseError as exc:
        raise InvalidRequestError(f"the multipart body cannot be parsed ({exc})") from exc
    finally:
        collector.close()
    if collector.dump is None and collector.stacks:
        raise InvalidRequestError("a stacks part comes with its rank's 'dump' part: the stacks belong to that "
                                  "dump's version")
    if collector.identity is None or (collector.dump is None and not collector.telemetry):
        raise InvalidRequestError("an upload needs a part 'identity' (JSON) and a file part 'dump' (or, from a "
                                  "node agent's key, at least one 'telemetry' part)")
    return UploadForm(identity=collector.identity, dump=collector.dump, telemetry=collector.telemetry,
                      stacks=collector.stacks)
