"""Whole-object GETs (and HEADs) to a configured upstream endpoint, signed with botocore's S3 SigV4 and sent on aiohttp directly.

A cold kv-get is a burst of chunk GETs, and through aiobotocore each cost the node 4.4 ms of CPU (256 KiB from
SeaweedFS; this path: 1.6 ms): its event hooks, endpoint rule set, user-agent string, parameter validation and
response parser (``dateutil`` parsing ``Last-Modified``) ran per request. py-spy on a node through cold 24-chunk
kv-gets put 70% of its busy samples there, so the fetch was bound by the node's own CPU, and its time swung with
whatever else ran on the host. This path sends the same signed request and reads only what a chunk fetch needs
(status, ``Content-Length``, ``ETag``, the body).

It answers only a plain ``200``. Anything else (an error status, a redirect, a connection refused or reset before
the headers) is repeated through botocore, whose error translation then decides, so a failure is never a
different answer: an answer botocore would retry counts as its first attempt (``store.s3.max_attempts`` requests
in all, as before), any other costs one more request. It is used where the
endpoint and keys are configured (``store.s3.endpoint_url``, ``access_key``); AWS's own endpoints and the AWS
credential chain go through botocore.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import aiohttp
import yarl
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from protocol.config import S3StoreConfig

RETRY = object()  # the request failed as botocore retries: the caller's next attempt is its second
ABSENT = object()  # a HEAD's 404


class LeanBody:
    """A response body with what the callers use of botocore's ``StreamingBody``."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp

    async def iter_chunks(self, chunk_size: int) -> Any:
        try:
            async for piece in self._resp.content.iter_chunked(chunk_size):
                yield piece
        finally:
            self._resp.release()

    async def read(self) -> bytes:
        try:
            return await self._resp.read()
        finally:
            self._resp.release()

    def close(self) -> None:
        self._resp.close()

    async def __aenter__(self) -> "LeanBody":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._resp.release()


class LeanGets:
    """Signed whole-object GETs and HEADs on one aiohttp session (opened lazily, on the loop that uses it)."""

    def __init__(self, cfg: S3StoreConfig) -> None:
        self.cfg = cfg
        self.base = cfg.endpoint_url.rstrip("/")
        self.signer = S3SigV4Auth(Credentials(cfg.access_key, cfg.secret_key), "s3", cfg.region)
        self._session: aiohttp.ClientSession | None = None
        self.served = self.declined = 0  # requests answered here; those handed back to botocore (status: ``upstream``)

    @staticmethod
    def usable(cfg: S3StoreConfig) -> bool:
        """Whether the endpoint is addressed by path and the keys are ours to sign with."""
        return bool(cfg.endpoint_url and cfg.access_key and cfg.secret_key)

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None:
            timeout = aiohttp.ClientTimeout(sock_connect=self.cfg.connect_timeout_s, sock_read=self.cfg.read_timeout_s)
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=self.cfg.max_connections),
                                                  timeout=timeout, auto_decompress=False)
        return self._session

    def signed(self, method: str, bucket: str, key: str) -> tuple[str, dict[str, str]]:
        """The URL (path style, the key percent-encoded as botocore does) and the signed headers of a request."""
        url = f"{self.base}/{quote(bucket, safe='')}/{quote(key, safe='/~')}"
        req = AWSRequest(method, url)
        self.signer.add_auth(req)
        return url, dict(req.headers.items())

    async def _send(self, method: str, bucket: str, key: str) -> aiohttp.ClientResponse | object:
        """The response (its headers read), or :data:`RETRY` where none came."""
        url, headers = self.signed(method, bucket, key)
        try:
            return await self._session_now().request(method, yarl.URL(url, encoded=True), headers=headers, allow_redirects=False,
                                                     skip_auto_headers=("Accept-Encoding",))
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError):
            self.declined += 1
            return RETRY

    def _declined(self, resp: aiohttp.ClientResponse) -> object | None:
        resp.release()
        self.declined += 1
        return RETRY if resp.status >= 500 or resp.status == 429 else None

    async def get(self, bucket: str, key: str) -> dict[str, Any] | object | None:
        """``{"Body", "ContentLength", "ETag"}`` of a ``200``; :data:`RETRY` where botocore would retry (no answer, a
        5xx or 429: this was its first attempt); None for any other answer (botocore asks again and translates it)."""
        resp = await self._send("GET", bucket, key)
        if not isinstance(resp, aiohttp.ClientResponse):
            return resp
        length = resp.headers.get("Content-Length")
        if resp.status != 200 or length is None:
            return self._declined(resp)
        self.served += 1
        return {"Body": LeanBody(resp), "ContentLength": int(length), "ETag": resp.headers.get("ETag", "")}

    async def head(self, bucket: str, key: str) -> str | object | None:
        """The ETag of a ``200``; :data:`ABSENT` for a ``404`` (no such key, or no such bucket: a HEAD's answer has no
        body to tell them apart, and its callers take both as absent); else as :meth:`get`."""
        resp = await self._send("HEAD", bucket, key)
        if not isinstance(resp, aiohttp.ClientResponse):
            return resp
        if resp.status in (200, 404):
            resp.release()
            self.served += 1
            return resp.headers.get("ETag", "") if resp.status == 200 else ABSENT
        return self._declined(resp)

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
