"""The one connection a process keeps to the upstream S3 store: an aiobotocore client, bounded retries, error translation.

Every call goes through :meth:`Upstream.call`, so an upstream failure always reaches the
client as an :class:`~protocol.errors.S3Error` from the catalogue: codes the catalogue
knows (NoSuchKey, NoSuchBucket, InvalidPart, ...) pass through, a bodiless 404 becomes the
``missing`` code the caller names, and an outage becomes ``503 ServiceUnavailable`` once
botocore's "standard" retry mode (exponential backoff with jitter, ``max_attempts`` in
all) has given up. Credential problems at the upstream are ObjectCache's misconfiguration,
not the tenant's, so they are 500s with a message that says so rather than AccessDenied.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError, ParamValidationError

from protocol.config import S3StoreConfig
from protocol.errors import ErrorCode, S3Error

from .lean_get import ABSENT, RETRY, LeanGets

T = TypeVar("T")

# Codes that describe ObjectCache's own standing at the upstream, never the tenant's request.
_OURS = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "RequestTimeTooSkewed", "AuthorizationHeaderMalformed"}
_BUSY = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "ServiceUnavailable", "InternalError"}
_TRANSPORT_ERRORS = (BotoCoreError, aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)


def translate(e: ClientError, missing: ErrorCode, resource: str) -> S3Error:
    """An upstream error response as the S3 error this gateway answers with."""
    err = e.response.get("Error", {})
    code, message = str(err.get("Code", "")), str(err.get("Message", "") or "")
    status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    if code in _OURS or status in (401, 403):
        return S3Error(ErrorCode.InternalError, f"The upstream store refused ObjectCache's credentials ({code or status}).", resource)
    if code in _BUSY or status >= 500:
        return S3Error(ErrorCode.ServiceUnavailable, f"The upstream store is unavailable ({code or status}); retry.", resource)
    if code in ErrorCode.__members__:
        return _named(ErrorCode[code], message, resource)
    by_status = {404: missing, 304: ErrorCode.NotModified, 412: ErrorCode.PreconditionFailed, 416: ErrorCode.InvalidRange}
    if status in by_status:
        return _named(by_status[status], "", resource)
    return S3Error(ErrorCode.InternalError, f"The upstream store answered {status} {code}: {message}", resource)


def _named(code: ErrorCode, message: str, resource: str) -> S3Error:
    """The error with the fields S3 puts beside NoSuchKey and NoSuchBucket."""
    bucket, _, key = resource.lstrip("/").partition("/")
    extra = {"Key": key} if code == ErrorCode.NoSuchKey and key else {"BucketName": bucket} if code == ErrorCode.NoSuchBucket and bucket else {}
    return S3Error(code, message, resource, extra)


def unavailable(e: BaseException, resource: str = "") -> S3Error:
    return S3Error(ErrorCode.ServiceUnavailable, f"The upstream store cannot be reached ({type(e).__name__}); retry.", resource)


@dataclass
class RequestTally:
    """Object GETs and HEADs answered (to their first byte) while at least ``full`` were in flight, and the seconds they
    were: the store's achieved request rate at a pin's concurrency, which the delivery-time oracle measures instead
    of trusting the configured first-byte time (a lone request, e.g. a heartbeat's, says nothing of that rate)."""

    full: int = 1
    done: int = 0
    busy_s: float = 0.0
    inflight: int = 0
    since: float = 0.0

    def _tick(self) -> None:
        now = time.perf_counter()
        if self.inflight >= self.full:
            self.busy_s += now - self.since
        self.since = now

    def begin(self) -> None:
        self._tick()
        self.inflight += 1

    def end(self) -> None:
        self._tick()
        if self.inflight >= self.full:
            self.done += 1
        self.inflight -= 1


class Upstream:
    """A lazily opened aiobotocore client (it must be created on the loop that uses it)."""

    def __init__(self, cfg: S3StoreConfig) -> None:
        self.cfg = cfg
        self.requests = RequestTally()
        self._ctx: Any = None
        self._client: Any = None
        self._lock = asyncio.Lock()
        self.lean = LeanGets(cfg) if LeanGets.usable(cfg) else None
        self._retries: tuple[Any, Any] | None = None

    async def client(self) -> Any:
        if self._client is None:
            async with self._lock:
                if self._client is None:
                    self._ctx = get_session().create_client("s3", **self._client_args(self.cfg.max_attempts))
                    self._client = await self._ctx.__aenter__()
        return self._client

    async def _retry_client(self) -> Any:
        """A client with one attempt fewer, for a GET whose first attempt was a lean one (made on first use)."""
        if self._retries is None:
            async with self._lock:
                if self._retries is None:
                    ctx = get_session().create_client("s3", **self._client_args(self.cfg.max_attempts - 1))
                    self._retries = (ctx, await ctx.__aenter__())
        return self._retries[1]

    def _client_args(self, attempts: int) -> dict[str, Any]:
        cfg = self.cfg
        config = AioConfig(
            max_pool_connections=cfg.max_connections,
            # botocore's "max_attempts" counts retries (one more request in all); the setting means attempts.
            retries={"mode": "standard", "total_max_attempts": attempts},
            connect_timeout=cfg.connect_timeout_s, read_timeout=cfg.read_timeout_s,
            # A private endpoint (MinIO, SeaweedFS, Ceph) is addressed by path; AWS by host name.
            s3={"addressing_style": "path" if cfg.endpoint_url else "auto"},
            request_checksum_calculation="when_required", response_checksum_validation="when_required",
        )
        args: dict[str, Any] = {"region_name": cfg.region, "config": config}
        if cfg.endpoint_url:
            args["endpoint_url"] = cfg.endpoint_url
        if cfg.access_key:
            args |= {"aws_access_key_id": cfg.access_key, "aws_secret_access_key": cfg.secret_key}
        return args

    async def call(self, op: str, *, missing: ErrorCode = ErrorCode.NoSuchKey, resource: str = "", client: Any = None,
                   **kwargs: Any) -> dict[str, Any]:
        """One upstream operation (``op`` is the botocore method name) with errors translated."""
        client = client or await self.client()
        timed = op in ("get_object", "head_object")
        if timed:
            self.requests.begin()
        try:
            return await getattr(client, op)(**kwargs)
        except ClientError as e:
            raise translate(e, missing, resource) from None
        except ParamValidationError as e:  # a value the upstream's API cannot carry (raised before any request)
            raise S3Error(ErrorCode.InvalidArgument, str(e).splitlines()[-1], resource) from None
        except _TRANSPORT_ERRORS as e:
            raise unavailable(e, resource) from None
        finally:
            if timed:
                self.requests.end()

    async def get(self, bucket: str, key: str, *, missing: ErrorCode = ErrorCode.NoSuchKey, resource: str = "") -> dict[str, Any]:
        """A whole object: ``{"Body", "ContentLength", "ETag"}`` (the body streams). Past botocore's per-request pipeline
        where it can (:mod:`.lean_get`); any answer but a plain 200 is asked again through :meth:`call`."""
        if self.lean is not None:
            got = await self._timed(self.lean.get(bucket, key))
            if isinstance(got, dict):
                return got
            if got is RETRY:
                return await self.call("get_object", Bucket=bucket, Key=key, missing=missing, resource=resource,
                                       client=await self._after_first_attempt(resource))
        return await self.call("get_object", Bucket=bucket, Key=key, missing=missing, resource=resource)

    async def etag(self, bucket: str, key: str, resource: str = "") -> str | None:
        """``key``'s ETag (a HEAD), None where it is not stored (a missing bucket reads as absent)."""
        if self.lean is not None:
            got = await self._timed(self.lean.head(bucket, key))
            if isinstance(got, str):
                return got
            if got is ABSENT:
                return None
            if got is RETRY:
                return await self._head(bucket, key, resource, await self._after_first_attempt(resource))
        return await self._head(bucket, key, resource)

    async def _timed(self, request: Awaitable[T]) -> T:
        """A lean request, counted in the store's request rate as botocore's GETs and HEADs are (to the first byte)."""
        self.requests.begin()
        try:
            return await request
        finally:
            self.requests.end()

    async def _head(self, bucket: str, key: str, resource: str, client: Any = None) -> str | None:
        try:
            return str((await self.call("head_object", Bucket=bucket, Key=key, resource=resource, client=client)).get("ETag", ""))
        except S3Error as e:
            if e.code in (ErrorCode.NoSuchKey, ErrorCode.NoSuchBucket):
                return None
            raise

    async def exists(self, bucket: str, key: str) -> bool:
        """Whether ``key`` is stored (a HEAD; a missing bucket reads as absent)."""
        return await self.etag(bucket, key) is not None

    async def _after_first_attempt(self, resource: str) -> Any:
        """The client for a request whose first attempt (a lean one) botocore would retry: one attempt fewer, after the
        wait botocore's standard mode makes before its second; a 503 if that was the only attempt allowed."""
        if self.cfg.max_attempts <= 1:
            raise S3Error(ErrorCode.ServiceUnavailable, "The upstream store is unavailable; retry.", resource)
        await asyncio.sleep(random.random())
        return await self._retry_client()

    async def bucket_exists(self, bucket: str) -> bool:
        """Whether the upstream has a bucket of this name, ours or anyone's (a 403 is someone else's bucket)."""
        client = await self.client()
        try:
            await client.head_bucket(Bucket=bucket)
        except ClientError as e:
            status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            if status == 404:
                return False
            if status in (301, 403):
                return True  # someone else's (403), or in another region (301)
            raise translate(e, ErrorCode.NoSuchBucket, f"/{bucket}") from None
        except _TRANSPORT_ERRORS as e:
            raise unavailable(e, f"/{bucket}") from None
        return True

    async def close(self) -> None:
        if self.lean is not None:
            await self.lean.close()
        retries, self._retries = self._retries, None
        if retries is not None:
            await retries[0].__aexit__(None, None, None)
        ctx, self._ctx, self._client = self._ctx, None, None
        if ctx is not None:
            await ctx.__aexit__(None, None, None)


async def body_chunks(body: Any, chunk_size: int, resource: str = "") -> AsyncIterator[bytes]:
    """A GET response body, piece by piece; a connection lost midway is a 503, never a short read."""
    try:
        async for piece in body.iter_chunks(chunk_size):
            yield piece
    except _TRANSPORT_ERRORS as e:
        raise unavailable(e, resource) from None
