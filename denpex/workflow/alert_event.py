"""The alert event's old address: it is ``denpex.ingest.alert_event`` now.

The event moved down to the ingest service, which emits it, so that ingest no longer imports the
workflow. This name stays for users' scripts that fire the event from here (the contracts named
this module until the move). New code imports ``denpex.ingest.alert_event``.
"""

from denpex.ingest.alert_event import ALERT_EVENT, AlertEvent, AlertEventError, api_headers, emit_alert

__all__ = ["ALERT_EVENT", "AlertEvent", "AlertEventError", "api_headers", "emit_alert"]
