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

from enum import StrEnum
from functools import lru_cache
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from denpex.evidence.loading import FileKind, decode, read_capped, validated
from denpex.hardware.errors import CatalogError
from denpex.hardware.events import Severity

__all__ = ["XidBucket", "RecoveryAction", "XidEntry", "XidCatalog", "load_xid_catalog", "default_xid_catalog"]

_MAX_CATALOG_BYTES = 4 * 1024 * 1024
_XID_FILE = FileKind("the Xid catalog", invalid="invalid Xid catalog", hint="fix the entries named")


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


class RecoveryAction(BaseModel):
    """One GPU recovery action the driver can require, as NVML's ``nvmlDeviceGpuRecoveryAction_t``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    supports_isolation: bool
    note: str | None = None


class XidEntry(BaseModel):
    """One Xid code and what it means for the isolation decision.

    Most codes mean one thing. Xid 154 ("GPU recovery action changed ... to 0x2 (Node Reboot
    Required)") means what the action it names means: ``recovery_actions`` maps NVML's action
    number to that meaning, and ``supports_isolation`` is what a missing or unlisted action means.

        >>> entry = default_xid_catalog().lookup(154)
        >>> entry.supports_isolation_for(2), entry.action_phrase(2)
        (True, 'recovery action now: Node Reboot Required')
        >>> entry.supports_isolation_for(0), entry.severity_for(0).value
        (False, 'non_fatal')
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: int = Field(ge=0)
    name: str
    bucket: XidBucket
    supports_isolation: bool
    application_error: bool
    note: str | None = None
    recovery_actions: dict[int, RecoveryAction] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> "XidEntry":
        if self.supports_isolation and self.application_error:
            raise ValueError(f"Xid {self.code}: cannot both support isolation and be an application error")
        if self.bucket in (XidBucket.RESET_GPU, XidBucket.REBOOT_NODE) and not self.supports_isolation:
            raise ValueError(f"Xid {self.code}: bucket {self.bucket} must support isolation")
        if self.recovery_actions and self.application_error:
            raise ValueError(f"Xid {self.code}: an Xid whose meaning follows a recovery action is not an application error")
        return self

    @property
    def severity(self) -> Severity:
        """Fatal when the GPU needs a reset or the node a reboot before use; else non-fatal."""
        return self.severity_for(None)

    def supports_isolation_for(self, recovery_action: int | None) -> bool:
        """Whether an event of this code, naming ``recovery_action``, supports isolating the node."""
        action = self.recovery_actions.get(recovery_action) if recovery_action is not None else None
        return action.supports_isolation if action is not None else self.supports_isolation

    def severity_for(self, recovery_action: int | None) -> Severity:
        """The event's severity; ``UNKNOWN`` when its meaning needs an action the catalog does not know."""
        if self.recovery_actions and recovery_action not in self.recovery_actions:
            return Severity.UNKNOWN
        return Severity.FATAL if self.supports_isolation_for(recovery_action) else Severity.NON_FATAL

    def action_phrase(self, recovery_action: int | None) -> str | None:
        """``recovery action now: Node Reboot Required``; ``None`` for codes that name no action."""
        if not self.recovery_actions:
            return None
        if recovery_action is None:
            return "recovery action not logged"
        action = self.recovery_actions.get(recovery_action)
        if action is None:
            return f"recovery action now: {recovery_action:#x}, not in Denpex's Xid catalog"
        return f"recovery action now: {action.name}"


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

    def severity_of(self, code: int, recovery_action: int | None = None) -> Severity:
        """The catalog's severity for ``code`` (and the recovery action it names); ``UNKNOWN`` for unlisted codes."""
        entry = self.lookup(code)
        return entry.severity_for(recovery_action) if entry else Severity.UNKNOWN


def load_xid_catalog(path: Path | None = None) -> XidCatalog:
    """Read a catalog file (default: the packaged ``xid_catalog.json``); all problems in one error."""
    if path is None:
        source: object = "packaged xid_catalog.json"
        data = resources.files("denpex.hardware").joinpath("xid_catalog.json").read_bytes()
    else:
        source, data = path, read_capped(path, _MAX_CATALOG_BYTES, _XID_FILE, CatalogError)
    return validated(XidCatalog, decode(data, source, _XID_FILE, CatalogError, "json"), source, _XID_FILE, CatalogError)


@lru_cache(maxsize=1)
def default_xid_catalog() -> XidCatalog:
    """The packaged catalog. Cached because it is immutable package data read on every parse."""
    return load_xid_catalog()
