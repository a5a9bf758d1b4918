"""Per-request state shared by the router and the operation handlers."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeVar

from aiohttp import web
from multidict import CIMultiDictProxy

from gateway.auth.payload import body_stream
from gateway.auth.sigv4 import AuthResult
from protocol.checksums import Digester, verify_digests
from protocol.config import GatewayConfig
from protocol.errors import ErrorCode, S3Error
from protocol.wire import MAX_KEY_BYTES
from storage_server.store import BucketInfo, ObjectMeta, ObjectStore

from . import headers as h
from . import xml
from .access import may_read

T = TypeVar("T")
_BUCKET_CHARS = re.compile(r"^[a-z0-9.-]*$")
_IPV4_RE = re.compile(r"^\d+\.\d+\.\d+\.\d+$")
RESERVED_PREFIXES = ("xn--", "sthree-")
RESERVED_SUFFIXES = ("-s3alias", "--ol-s3")


def bucket_name_problem(name: str) -> str | None:
    """Why ``name`` breaks S3's bucket naming rules (the first rule it breaks), or None if it keeps them all."""
    if not 3 <= len(name) <= 63:
        return f"it is {len(name)} characters long; a bucket name must be 3 to 63 characters long"
    if not _BUCKET_CHARS.match(name):
        bad = sorted({c for c in name if not ("a" <= c <= "z" or "0" <= c <= "9" or c in ".-")})
        return f"it contains {' '.join(repr(c) for c in bad)}; only lowercase letters a-z, digits 0-9, '.' and '-' are allowed"
    if not (name[0].isalnum() and name[-1].isalnum()):
        return "it must begin and end with a lowercase letter or a digit"
    if ".." in name:
        return "it must not contain two adjacent periods ('..')"
    if _IPV4_RE.match(name):
        return "it must not be formatted as an IP address"
    for prefix in RESERVED_PREFIXES:
        if name.startswith(prefix):
            return f"the prefix {prefix!r} is reserved"
    for suffix in RESERVED_SUFFIXES:
        if name.endswith(suffix):
            return f"the suffix {suffix!r} is reserved"
    return None


def validate_bucket_name(name: str) -> None:
    problem = bucket_name_problem(name)
    if problem is not None:
        raise S3Error(ErrorCode.InvalidBucketName, f"The specified bucket is not valid: {problem}.", resource=f"/{name}",
                      extra={"BucketName": name})


class Level(StrEnum):
    """What a request addresses: the handler at a level may rely on ``bucket`` (and ``key``) being set."""

    SERVICE = "service"
    BUCKET = "bucket"
    OBJECT = "object"


@dataclass(frozen=True)
class Address:
    bucket: str | None
    key: str | None
    path_style: bool = True

    @property
    def level(self) -> Level:
        return Level.SERVICE if self.bucket is None else Level.BUCKET if self.key is None else Level.OBJECT

    @property
    def resource(self) -> str:
        """``/bucket/key`` as error bodies name it (``/`` for the service)."""
        return "/" + "/".join(p for p in (self.bucket, self.key) if p)


@dataclass
class S3Request:
    """One authenticated S3 request, addressed to the service, a bucket or an object."""

    http: web.Request
    request_id: str
    auth: AuthResult
    store: ObjectStore
    config: GatewayConfig
    addr: Address
    query: dict[str, str]
    trailers: dict[str, str] = field(default_factory=dict)

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        return self.http.headers

    @property
    def tenant(self) -> str:
        return self.auth.tenant

    @property
    def bucket(self) -> str:
        """The addressed bucket: routing sends only bucket- and object-level requests to handlers that read it."""
        if self.addr.bucket is None:
            raise LookupError("a service-level request has no bucket")
        return self.addr.bucket

    @property
    def key(self) -> str:
        """The addressed key: routing sends only object-level requests to handlers that read it."""
        if self.addr.key is None:
            raise LookupError("a service- or bucket-level request has no key")
        return self.addr.key

    @property
    def resource(self) -> str:
        return "/" + "/".join(p for p in (self.addr.bucket, self.addr.key) if p is not None)

    def body(self) -> AsyncIterator[bytes]:
        """The decoded, verified request body (fills ``trailers`` as it ends)."""
        return body_stream(self.http.content, self.auth, self.trailers, self.config.body_timeout_s)

    async def body_bytes(self, limit: int, object_checksums: bool = False) -> bytes:
        """The whole (small) body, with its declared Content-MD5 / x-amz-checksum-* verified (with
        ``object_checksums`` the x-amz-checksum-* headers describe an object, not this body: Complete)."""
        expected, algorithms, trailer = ({}, (), None) if object_checksums else h.checksum_request(self.headers)
        md5 = h.content_md5(self.headers)
        digester = Digester(algorithms)
        out = bytearray()
        async for chunk in self.body():
            out += chunk
            if len(out) > limit:
                raise S3Error(ErrorCode.InvalidRequest, f"Request body exceeds {limit} bytes.")
        body = bytes(out)
        digester.update(body)
        expected.update(h.trailer_checksums(trailer, self.trailers))
        verify_digests(digester, md5, expected)
        return body

    def expected_length(self) -> int | None:
        n = h.decoded_length(self.headers, self.auth.payload_mode.is_streaming)
        if n is None and self.http.method == "PUT" and "chunked" not in self.headers.get("Transfer-Encoding", ""):
            raise S3Error(ErrorCode.MissingContentLength, resource=self.resource)
        return n

    @property
    def requester(self) -> str | None:
        """The signing tenant; None for an anonymous request (allowed only to read public objects)."""
        return self.auth.tenant or None

    @property
    def owner_id(self) -> str:
        """The signing tenant as bucket records name their owner (``protocol.config.Tenant.owner_id``)."""
        return self.auth.owner

    def owns(self, bucket: BucketInfo) -> bool:
        """Whether the signing tenant owns ``bucket``: its record names the tenant's owner id, or (a record
        written before owner ids, which named the tenant only) the tenant's name."""
        if not self.auth.tenant:
            return False
        return bucket.owner == self.auth.owner or ("~" not in bucket.owner and bucket.owner == self.auth.tenant)

    async def readable_bucket(self) -> BucketInfo:
        """The addressed bucket for a read that an object's ACL may allow (its owner's, or a public object's)."""
        try:
            info = await self.store.get_bucket(self.bucket)
        except S3Error as e:
            raise S3Error(ErrorCode.AccessDenied, resource=self.resource) if self.requester is None else e from None
        return info

    async def readable(self, lookup: Awaitable[T], bucket: BucketInfo) -> T:
        """``lookup``'s result; a missing key is AccessDenied to anyone but the owner (existence is not leaked)."""
        try:
            return await lookup
        except S3Error as e:
            if e.code == ErrorCode.NoSuchKey and not self.owns(bucket):
                raise S3Error(ErrorCode.AccessDenied, resource=self.resource) from None
            raise

    def check_read(self, meta: ObjectMeta, bucket: BucketInfo) -> None:
        """The owner reads anything; others what the object's canned ACL grants them."""
        if not self.owns(bucket) and not may_read(meta.acl, bucket.owner, self.requester):
            raise S3Error(ErrorCode.AccessDenied, resource=self.resource)

    async def owned_bucket(self, name: str | None = None) -> BucketInfo:
        """The addressed bucket, if it exists and belongs to the caller's tenant."""
        name = name or self.bucket
        info = await self.store.get_bucket(name)
        if not self.owns(info):
            raise S3Error(ErrorCode.AccessDenied, resource=f"/{name}")
        return info

    def int_param(self, name: str, default: int, lo: int = 0, hi: int | None = None) -> int:
        raw = self.query.get(name)
        if raw is None:
            return default
        try:
            v = int(raw)
        except ValueError:
            v = -1
        if v < lo:
            raise S3Error(ErrorCode.InvalidArgument, f"Argument {name} must be an integer >= {lo}.", extra={"ArgumentName": name, "ArgumentValue": raw})
        return min(v, hi) if hi is not None else v

    def key_checked(self) -> str:
        if len(self.key.encode()) > MAX_KEY_BYTES:
            raise S3Error(ErrorCode.KeyTooLongError, resource=self.resource, extra={"MaxSizeAllowed": str(MAX_KEY_BYTES)})
        return xml.check_text("key", self.key)  # a key listings could not carry is refused when it is written
