"""Signed KV extension requests, the plumbing :class:`ObjectCacheClient` is built on.

The KV extension requests (``kv-put``, ``kv-lookup``, ``kv-get``, ``kv-register``) are signed with the same SigV4
signer as plain S3 calls (botocore's) and sent with aiohttp, because their bodies and the frame-stream responses
are not part of the S3 API model. A failed call is the SDK's own :class:`S3Error`, never a raw aiohttp exception.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import time
import xml.etree.ElementTree as ET
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
from awscrt.checksums import crc32c
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest

from protocol.checksums import b64
from protocol.errors import ErrorCode, S3Error
from protocol.kv_http import KVOp

UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
# Retries of idempotent calls wait backoff, 2·backoff, 4·backoff, ... (±25% jitter), each at most this long.
MAX_BACKOFF_S = 2.0

log = logging.getLogger("objectcache.client")
T = TypeVar("T")


def _unreachable(endpoint: str, what: str, e: BaseException) -> S3Error:
    """A refused, reset or dropped connection as the SDK's own error (never a raw aiohttp exception)."""
    return S3Error(ErrorCode.ServiceUnavailable, f"{what}: the connection to the gateway at {endpoint} failed ({type(e).__name__}: {e})")


def _s3_error(status: int, body: bytes) -> S3Error:
    try:
        doc = ET.fromstring(body)
        code = ErrorCode.__members__.get(doc.findtext("Code") or "", ErrorCode.InternalError)
        extra = {c.tag: c.text or "" for c in doc if c.tag not in ("Code", "Message", "Resource", "RequestId")}
        return S3Error(code, doc.findtext("Message") or "", doc.findtext("Resource") or "", extra)
    except ET.ParseError:
        return S3Error(ErrorCode.InternalError, f"HTTP {status}: {body[:200]!r}")


def _json(record: Any) -> bytes:
    return json.dumps(record.to_json()).encode()


class SignedRequests:
    """Signing, sending and retrying the extension requests; the client's other parts send through these."""

    endpoint: str
    retries: int
    backoff: float
    _signer: SigV4Auth
    _http: aiohttp.ClientSession | None
    _timeout: aiohttp.ClientTimeout

    def _signed_headers(self, method: str, url: str, payload_hash: str, extra: dict[str, str]) -> dict[str, str]:
        req = AWSRequest(method=method, url=url, headers={"X-Amz-Content-SHA256": payload_hash, **extra})
        self._signer.add_auth(req)
        return dict(req.headers.items())

    async def _post(self, path: str, op: KVOp, body: bytes | list, *, payload_hash: str | None = None,
                    extra_headers: dict[str, str] | None = None, stream: bool = False) -> aiohttp.ClientResponse:
        """POST ``path?op`` signed with SigV4. List bodies are sent without joining (KV batches)."""
        assert self._http is not None, "use the client inside `async with`"
        url = f"{self.endpoint}{path}?{op}"
        if isinstance(body, list):
            length = sum(memoryview(p).nbytes for p in body)
            crc = 0
            for p in body:
                crc = crc32c(p, crc)
            headers = self._signed_headers("POST", url, UNSIGNED_PAYLOAD, {"x-amz-checksum-crc32c": b64(crc.to_bytes(4, "big")), **(extra_headers or {})})
            headers["Content-Length"] = str(length)

            async def gen():
                for p in body:
                    yield p

            data: Any = gen()
        else:
            headers = self._signed_headers("POST", url, payload_hash or hashlib.sha256(body).hexdigest(), extra_headers or {})
            data = body
        try:
            resp = await self._http.post(url, data=data, headers=headers)
            if resp.status != 200:
                text = await resp.read()
                resp.release()
                raise _s3_error(resp.status, text)
            if not stream:
                await resp.read()
        except asyncio.TimeoutError:
            raise S3Error(ErrorCode.RequestTimeout, f"no response to ?{op} within {self._timeout.sock_read:.0f} s (read_timeout)") from None
        except aiohttp.ClientError as e:
            raise _unreachable(self.endpoint, f"?{op}", e) from None
        return resp

    async def _retrying(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """Run an idempotent ``call``; on 503 or a failed connection, retry with bounded exponential backoff."""
        started = time.monotonic()
        for attempt in range(self.retries + 1):
            try:
                return await call()
            except S3Error as e:
                if e.code is not ErrorCode.ServiceUnavailable:
                    raise
                if attempt == self.retries:
                    raise S3Error(ErrorCode.ServiceUnavailable, f"{what} failed after {attempt + 1} attempt(s) over "
                                  f"{time.monotonic() - started:.1f} s: {e.message}", e.resource, e.extra) from None
                delay = min(self.backoff * 2 ** attempt, MAX_BACKOFF_S) * random.uniform(0.75, 1.25)
                log.info("%s: %s; retry %d of %d in %.2f s", what, e.message, attempt + 1, self.retries, delay)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")
