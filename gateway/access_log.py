"""The access log: one structured line per finished request, from the per-operation hook.

The line is a JSON object (the message itself in text format; top-level keys in
``log.format = "json"``, which reads ``record.fields``). Its request id is the
client's ``x-amz-request-id`` and, for a kv-get, the storage server's transfer
line and the END frame carry the same id. Only these fields are written:
never a header, a signature or a key.
"""

from __future__ import annotations

import json
import logging

from .middleware import OperationRecord

log = logging.getLogger("objectcache.access")


def fields(record: OperationRecord) -> dict[str, object]:
    return {"request_id": record.request_id, "tenant": record.tenant, "operation": record.operation, "bucket": record.bucket,
            "status": record.status, "bytes_in": record.bytes_in, "bytes_out": record.bytes_out,
            "duration_s": round(record.duration_s, 6)}


def log_request(record: OperationRecord) -> None:
    """An :data:`~gateway.middleware.OPERATION_HOOKS` entry."""
    if log.isEnabledFor(logging.INFO):
        f = fields(record)
        log.info(json.dumps(f), extra={"fields": f})
