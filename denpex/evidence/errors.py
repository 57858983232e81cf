"""Errors raised while reading evidence.

    EvidenceError            any evidence that cannot be used
    ├── ManifestError        the job manifest is unreadable or invalid
    ├── DumpError            one Flight Recorder dump is unusable (the triage reports it and goes on)
    │   └── UnsafePickleError  a pickle asked to import or call something
    └── EvidenceSourceError  the folder or bucket itself cannot be listed
"""

from __future__ import annotations

__all__ = ["EvidenceError", "ManifestError", "DumpError", "UnsafePickleError", "EvidenceSourceError"]


class EvidenceError(Exception):
    """Evidence that cannot be used."""


class ManifestError(EvidenceError):
    """The job manifest is unreadable or invalid."""


class DumpError(EvidenceError):
    """One Flight Recorder dump is unusable; the message says why."""


class UnsafePickleError(DumpError):
    """A pickle tried to import or call something; it was refused before anything ran."""


class EvidenceSourceError(EvidenceError):
    """The evidence location itself (folder, bucket) cannot be read."""
