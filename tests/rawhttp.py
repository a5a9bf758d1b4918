"""Hand-built S3 requests, signed by botocore's own SigV4 signer, sent with http.client.

For what boto3 will not send on its own: skewed clocks, virtual-hosted
addressing on 127.0.0.1, aws-chunked bodies, malformed parameters.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import http.client
from dataclasses import dataclass
from email.utils import formatdate
from unittest import mock
from urllib.parse import urlsplit

import botocore.auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from support import TenantKeys


@dataclass
class RawResponse:
    status: int
    headers: http.client.HTTPMessage
    body: bytes


def send(endpoint: str, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b"") -> RawResponse:
    u = urlsplit(endpoint)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for k, v in (headers or {}).items():
            conn.putheader(k, v.encode() if isinstance(v, str) else v)
        conn.endheaders(body if body else None)
        r = conn.getresponse()
        return RawResponse(r.status, r.headers, r.read())
    finally:
        conn.close()


class _AsIsPayloadAuth(botocore.auth.S3SigV4Auth):
    """S3's signer, but keeping the x-amz-content-sha256 we chose (streaming modes, wrong hashes)."""

    def _modify_request_before_signing(self, request):
        botocore.auth.SigV4Auth._modify_request_before_signing(self, request)


class _BothDatesAuth(_AsIsPayloadAuth):
    """Sends (and signs) a ``Date`` header beside ``X-Amz-Date``: botocore itself sends one or the other."""

    date_format = "rfc1123"

    def _set_necessary_date_headers(self, request):
        stamp = request.context["timestamp"]
        for name in ("Date", "X-Amz-Date"):
            if name in request.headers:
                del request.headers[name]
        request.headers["X-Amz-Date"] = stamp
        ts = datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.timezone.utc).timestamp()
        request.headers["Date"] = formatdate(ts, usegmt=True) if self.date_format == "rfc1123" else stamp


def sign(tenant: TenantKeys, method: str, url: str, headers: dict[str, str] | None = None, body: bytes = b"",
         payload_hash: str | None = None, when: datetime.datetime | None = None, date_too: str | None = None) -> dict[str, str]:
    """Headers for ``url`` signed with SigV4 by botocore (optionally at another time). ``date_too``
    ("rfc1123" or "iso8601") adds a signed ``Date`` header in that form beside ``X-Amz-Date``."""
    req = AWSRequest(method=method, url=url, headers=dict(headers or {}), data=body)
    req.headers["x-amz-content-sha256"] = payload_hash or hashlib.sha256(body).hexdigest()
    signer_cls = _AsIsPayloadAuth if date_too is None else type("_Dated", (_BothDatesAuth,), {"date_format": date_too})
    signer = signer_cls(Credentials(tenant.access_key, tenant.secret_key), "s3", "us-east-1")
    if when is not None:
        with mock.patch("botocore.auth.get_current_datetime", return_value=when):
            signer.add_auth(req)
    else:
        signer.add_auth(req)
    return {**dict(req.headers.items()), "Host": urlsplit(url).netloc}


def signed(endpoint: str, tenant: TenantKeys, method: str, path: str, headers: dict[str, str] | None = None,
           body: bytes = b"", host: str | None = None, **kw) -> RawResponse:
    host = host or urlsplit(endpoint).netloc
    h = sign(tenant, method, f"http://{host}{path}", headers, body, **kw)
    if body and "Content-Length" not in h:
        h["Content-Length"] = str(len(body))
    return send(endpoint, method, path, h, body)


def presign(tenant: TenantKeys, method: str, url: str, expires_in: int, signature_version: str = "s3v4",
            signed_at: float | None = None) -> str:
    """``url`` presigned by botocore's own query signers (SigV2 ``s3`` or SigV4 ``s3v4``), valid for
    ``expires_in`` seconds (any value, even one S3 refuses) from ``signed_at`` (now by default)."""
    req = AWSRequest(method=method, url=url)
    creds = Credentials(tenant.access_key, tenant.secret_key)
    if signature_version == "s3v4":
        signer = botocore.auth.S3SigV4QueryAuth(creds, "s3", "us-east-1", expires=expires_in)
    else:
        signer = botocore.auth.HmacV1QueryAuth(creds, expires=expires_in)
    now = datetime.datetime.now(datetime.timezone.utc).timestamp() if signed_at is None else signed_at
    at = datetime.datetime.fromtimestamp(now, datetime.timezone.utc).replace(tzinfo=None)
    with mock.patch("botocore.auth.get_current_datetime", return_value=at), mock.patch("botocore.auth.time.time", return_value=now):
        signer.add_auth(req)
    return req.url


def sign_v2(tenant: TenantKeys, method: str, resource: str, headers: dict[str, str], date_line: str) -> dict[str, str]:
    """``headers`` with a SigV2 ``Authorization`` added, computed as AWS's RESTAuthentication page describes:
    the ``Date`` line is ``date_line``, then every ``x-amz-*`` header, then the resource."""
    amz = sorted((k.lower(), v.strip()) for k, v in headers.items() if k.lower().startswith("x-amz-"))
    lines = [method, headers.get("Content-MD5", ""), headers.get("Content-Type", ""), date_line, *(f"{k}:{v}" for k, v in amz), resource]
    sig = base64.b64encode(hmac.new(tenant.secret_key.encode(), "\n".join(lines).encode(), hashlib.sha1).digest()).decode()
    return {**headers, "Authorization": f"AWS {tenant.access_key}:{sig}"}


def chunk_signature(key: bytes, amz_date: str, scope: str, prev: str, data: bytes) -> str:
    sts = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", amz_date, scope, prev, hashlib.sha256(b"").hexdigest(), hashlib.sha256(data).hexdigest()])
    return hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()


def signing_key(secret: str, date: str) -> bytes:
    k = hmac.new(("AWS4" + secret).encode(), date.encode(), hashlib.sha256).digest()
    for part in ("us-east-1", "s3", "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    return k
