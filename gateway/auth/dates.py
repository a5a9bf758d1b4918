"""Request times in the two forms S3 accepts in ``X-Amz-Date`` and ``Date``.

SigV4's own form is ISO 8601 basic (``20130524T000000Z``); HTTP dates (RFC 1123,
``Fri, 24 May 2013 00:00:00 GMT``, and RFC 850 / asctime) are what ``Date``
carries, and botocore's SigV4 signer sends one *instead of* ``X-Amz-Date``
whenever the request already has a ``Date`` header. Either form names one
instant; a zone-less HTTP date (``-0000``) is UTC, never the server's local time.
"""

from __future__ import annotations

import datetime
import time
from calendar import timegm
from email.utils import parsedate_to_datetime

AMZ_FORMAT = "%Y%m%dT%H%M%SZ"


def parse(raw: str) -> float | None:
    """Seconds since the epoch for either form; None if ``raw`` is neither."""
    raw = raw.strip()
    try:
        return float(timegm(time.strptime(raw, AMZ_FORMAT)))
    except ValueError:
        pass
    try:
        dt = parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=datetime.timezone.utc)
    return dt.timestamp()


def amz(ts: float) -> str:
    """The ISO 8601 basic form SigV4's string to sign and scope use."""
    return time.strftime(AMZ_FORMAT, time.gmtime(ts))
