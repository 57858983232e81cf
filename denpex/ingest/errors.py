"""Errors of the ingest service, each with the HTTP status it is answered with.

    IngestError                 any refused request; ``status`` is the HTTP answer
    ├── AuthenticationError     401: bad, expired or replayed signature or token
    ├── ForbiddenError          403: a foreign tenant or cluster, a revoked key, a plan without
    │                           this workflow
    ├── NotFoundError           404: no such incident for the caller's tenant and cluster
    ├── PayloadTooLargeError    413: the body or one dump is over its cap
    ├── InvalidRequestError     422: an identity, dump or alert that fails validation
    └── StoreUnavailableError   503: the evidence store (or the flow engine) cannot be reached

Every one is answered as ``{"error": "<one clear sentence>"}`` and nothing is stored.
"""

from __future__ import annotations

__all__ = [
    "IngestError",
    "AuthenticationError",
    "ForbiddenError",
    "NotFoundError",
    "PayloadTooLargeError",
    "InvalidRequestError",
    "StoreUnavailableError",
    "RegistryError",
]


class IngestError(Exception):
    """A refused request; ``status`` is the HTTP status it is answered with."""

    status: int = 400


class AuthenticationError(IngestError):
    """Bad, expired or replayed signature or bearer token."""

    status = 401


class ForbiddenError(IngestError):
    """Authenticated, but not allowed: foreign tenant or cluster, or a plan without this workflow."""

    status = 403


class NotFoundError(IngestError):
    """No such incident for the caller's tenant and cluster."""

    status = 404


class PayloadTooLargeError(IngestError):
    """The body or one of its parts is over its cap."""

    status = 413


class InvalidRequestError(IngestError):
    """An identity, dump or alert that fails validation."""

    status = 422


class StoreUnavailableError(IngestError):
    """The evidence store or the flow engine cannot be reached; retry later."""

    status = 503


class RegistryError(ValueError):
    """A tenant, key or token command that cannot be carried out (unknown tenant, bad plan...)."""
