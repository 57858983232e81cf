"""Errors of the ingest service, each with the HTTP status it is answered with.

    IngestError                 any refused request; ``status`` is the HTTP answer
    ├── AuthenticationError     401: bad, expired or replayed signature or token
    ├── ForbiddenError          403: a foreign tenant or cluster, a revoked key, a plan without
    │                           this workflow
    ├── NotFoundError           404: no such incident for the caller's tenant and cluster
    ├── RequestTimeoutError     408: the body did not arrive within the time a body may take
    ├── ConflictError           409: conflicts with what the incident already holds (another job)
    ├── PayloadTooLargeError    413: the body or one dump is over its cap
    ├── InvalidRequestError     422: an identity, dump or alert that fails validation
    ├── RateLimitedError        429: a tenant's or cluster's limit is reached (``retry_after_s``)
    └── StoreUnavailableError   503: the evidence store (or the flow engine) cannot be reached,
                                or the service is at its bound of bodies in flight or spool disk

Every one is answered as ``{"error": "<one clear sentence>"}`` and nothing is stored.
"""

from __future__ import annotations

__all__ = [
    "IngestError",
    "AuthenticationError",
    "ForbiddenError",
    "NotFoundError",
    "RequestTimeoutError",
    "ConflictError",
    "RateLimitedError",
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


class RequestTimeoutError(IngestError):
    """The body did not arrive within the time a body may take (uvicorn has no such limit)."""

    status = 408


class ConflictError(IngestError):
    """The request conflicts with what the incident already holds (an alert naming another job)."""

    status = 409


class PayloadTooLargeError(IngestError):
    """The body or one of its parts is over its cap."""

    status = 413


class InvalidRequestError(IngestError):
    """An identity, dump or alert that fails validation."""

    status = 422


class RateLimitedError(IngestError):
    """A tenant's or cluster's rate limit is reached; answered with ``Retry-After``."""

    status = 429

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = max(1, int(retry_after_s))


class StoreUnavailableError(IngestError):
    """The evidence store or the flow engine cannot be reached; retry later."""

    status = 503


class RegistryError(ValueError):
    """A tenant, key or token command that cannot be carried out (unknown tenant, bad plan...)."""
