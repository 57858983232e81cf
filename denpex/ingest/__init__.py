"""The HTTP edge: signed evidence uploads, alerts, tenants and plan tiers.

    signing      canonical string, HMAC-SHA256 sign/verify, clock skew
    registry     tenants, plans, keys (secrets encrypted at rest), bearer tokens (hashed)
    nonce_cache  replay protection that survives restarts
    auth         the order of the checks, and who the caller is
    plans        plan tiers; only data-center may use hang triage
    errors       the refusals and their HTTP statuses
"""
