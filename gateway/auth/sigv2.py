"""AWS Signature Version 2 (HMAC-SHA1), header and query-string forms.

boto3 and aws-cli v1 still presign S3 URLs with it by default, so a gateway
that refused it would break ``aws s3 presign``. The payload is not signed in
V2; Content-MD5, when sent, still protects it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from multidict import CIMultiDictProxy

from protocol.errors import ErrorCode, S3Error
from protocol.kv_http import KVOp

from . import dates

# Sub-resources that are part of the V2 canonical resource: S3's (as botocore signs them) and the KV
# extensions', so a signature covers every query name that selects an operation.
SUBRESOURCES = frozenset(
    "accelerate acl cors defaultObjectAcl location logging partNumber policy requestPayment torrent versioning versionId "
    "versions website uploads uploadId response-content-type response-content-language response-expires "
    "response-cache-control response-content-disposition response-content-encoding delete lifecycle tagging restore "
    "storageClass notification replication analytics metrics inventory select select-type object-lock".split()
) | frozenset(op.value for op in KVOp)


def canonical_resource(resource_path: str, pairs: list[tuple[str, str]]) -> str:
    subs = sorted((k, v) for k, v in pairs if k in SUBRESOURCES)
    if not subs:
        return resource_path
    return resource_path + "?" + "&".join(f"{k}={v}" if v else k for k, v in subs)


def string_to_sign(method: str, headers: CIMultiDictProxy[str], date_line: str, resource: str) -> str:
    amz = {}
    for k in headers:
        lk = k.lower()
        if lk.startswith("x-amz-"):
            amz[lk] = ",".join(v.strip() for v in headers.getall(k))
    lines = [method, headers.get("Content-MD5", "").strip(), headers.get("Content-Type", "").strip(), date_line]
    lines += [f"{k}:{amz[k]}" for k in sorted(amz)]
    return "\n".join(lines + [resource])


def signature(secret: str, sts: str) -> str:
    return base64.b64encode(hmac.new(secret.encode(), sts.encode(), hashlib.sha1).digest()).decode()


def request_time(headers: CIMultiDictProxy[str]) -> tuple[float, tuple[str, ...]]:
    """(time of the request, the Date lines a correct signature may put in its string to sign).

    ``X-Amz-Date`` wins over ``Date`` and may take either date form. With it, the
    specification's Date line is empty (the time is signed among the ``x-amz-*``
    headers); botocore's ``HmacV1Auth`` still signs the ``Date`` header's value
    there, and that is accepted too: both strings cover the same request.
    """
    amz_date, date = headers.get("x-amz-date"), headers.get("Date")
    raw = amz_date or date
    if not raw:
        raise S3Error(ErrorCode.AccessDenied, "AWS authentication requires a valid Date or x-amz-date header")
    ts = dates.parse(raw)
    if ts is None:
        raise S3Error(ErrorCode.AccessDenied, f"Invalid date {raw!r}: expected an HTTP date (RFC 1123) or YYYYMMDD'T'HHMMSS'Z'.")
    if not amz_date:
        return ts, (raw.strip(),)
    return ts, ("",) if date is None else ("", date.strip())
