"""Hand-built S3 requests, signed by botocore's own SigV4 signer, sent with http.client.

For what boto3 will not send on its own: skewed clocks, virtual-hosted
addressing on 127.0.0.1, aws-chunked bodies, malformed parameters.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import http.client
from dataclasses import dataclass
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


def sign(tenant: TenantKeys, method: str, url: str, headers: dict[str, str] | None = None, body: bytes = b"",
         payload_hash: str | None = None, when: datetime.datetime | None = None) -> dict[str, str]:
    """Headers for ``url`` signed with SigV4 by botocore (optionally at another time)."""
    req = AWSRequest(method=method, url=url, headers=dict(headers or {}), data=body)
    req.headers["x-amz-content-sha256"] = payload_hash or hashlib.sha256(body).hexdigest()
    signer = _AsIsPayloadAuth(Credentials(tenant.access_key, tenant.secret_key), "s3", "us-east-1")
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


def chunk_signature(key: bytes, amz_date: str, scope: str, prev: str, data: bytes) -> str:
    sts = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", amz_date, scope, prev, hashlib.sha256(b"").hexdigest(), hashlib.sha256(data).hexdigest()])
    return hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()


def signing_key(secret: str, date: str) -> bytes:
    k = hmac.new(("AWS4" + secret).encode(), date.encode(), hashlib.sha256).digest()
    for part in ("us-east-1", "s3", "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    return k
