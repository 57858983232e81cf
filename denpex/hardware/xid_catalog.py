"""The Xid catalog: what each NVIDIA Xid code means for an operator, kept as data.

The table lives in ``xid_catalog.json`` next to this module (package data), so adding a code is a
data change reviewed on its own, not an ``if`` somewhere in the correlation.

    >>> catalog = default_xid_catalog()
    >>> entry = catalog.lookup(79)
    >>> (entry.name, entry.bucket, entry.supports_isolation)
    ('GPU has fallen off the bus', <XidBucket.REBOOT_NODE: 'reboot_node'>, True)
    >>> catalog.lookup(9999) is None
    True
"""

from __future__ import annotations

import json
from enum import StrEnum
from functools import lru_cache
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from denpex.hardware.errors import CatalogError
from denpex.hardware.events import Severity

__all__ = ["XidBucket", "XidEntry", "XidCatalog", "load_xid_catalog", "default_xid_catalog"]


class XidBucket(StrEnum):
    """What an operator does about an Xid."""

    APPLICATION = "application"
    """Restart the application; not a hardware problem in itself."""
    WATCH = "watch"
    """Ignore or watch the trend only."""
    NAMED_WORKFLOW = "named_workflow"
    """Follow the workflow named for it (ECC, NVLink)."""
    RESET_GPU = "reset_gpu"
    """The GPU needs a reset before it is trusted again."""
    REBOOT_NODE = "reboot_node"
    """The node needs a reboot (the GPU fell off the bus)."""


class XidEntry(BaseModel):
    """One Xid code and what it means for the isolation decision."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: int = Field(ge=0)
    name: str
    bucket: XidBucket
    supports_isolation: bool
    application_error: bool
    note: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "XidEntry":
        if self.supports_isolation and self.application_error:
            raise ValueError(f"Xid {self.code}: cannot both support isolation and be an application error")
        if self.bucket in (XidBucket.RESET_GPU, XidBucket.REBOOT_NODE) and not self.supports_isolation:
            raise ValueError(f"Xid {self.code}: bucket {self.bucket} must support isolation")
        return self

    @property
    def severity(self) -> Severity:
        """Fatal when the GPU needs a reset or the node a reboot before use; else non-fatal."""
        return Severity.FATAL if self.supports_isolation else Severity.NON_FATAL


class XidCatalog(BaseModel):
    """All known Xid entries, one per code."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    about: str = ""
    entries: tuple[XidEntry, ...]

    @model_validator(mode="after")
    def _unique(self) -> "XidCatalog":
        codes = [e.code for e in self.entries]
        repeated = sorted({c for c in codes if codes.count(c) > 1})
        if repeated:
            raise ValueError(f"Xid codes listed more than once: {repeated}")
        return self

    def lookup(self, code: int) -> XidEntry | None:
        """The entry for ``code``, or ``None`` when the catalog does not know it."""
        for entry in self.entries:
            if entry.code == code:
                return entry
        return None

    def severity_of(self, code: int) -> Severity:
        """The catalog's severity for ``code``; ``UNKNOWN`` for codes it does not list."""
        entry = self.lookup(code)
        return entry.severity if entry else Severity.UNKNOWN


def load_xid_catalog(path: Path | None = None) -> XidCatalog:
    """Read a catalog file (default: the packaged ``xid_catalog.json``); all problems in one error."""
    try:
        if path is None:
            text = resources.files("denpex.hardware").joinpath("xid_catalog.json").read_text("utf-8")
        else:
            text = path.read_text("utf-8")
        return XidCatalog.model_validate(json.loads(text))
    except OSError as exc:
        raise CatalogError(f"{path or 'packaged xid_catalog.json'}: cannot read: {exc}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CatalogError(f"{path or 'packaged xid_catalog.json'}: not valid JSON: {exc}") from exc
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors()
        )
        raise CatalogError(
            f"{path or 'packaged xid_catalog.json'}: invalid Xid catalog: {problems}; fix the entries named"
        ) from exc


@lru_cache(maxsize=1)
def default_xid_catalog() -> XidCatalog:
    """The packaged catalog. Cached because it is immutable package data read on every parse."""
    return load_xid_catalog()
