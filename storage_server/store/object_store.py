"""The object-store interface: the S3 operations the gateway serves through a backend.

(The KV path reads through :mod:`.chunk_source`.) Methods are async so a network
backend (upstream S3) fits as naturally as the local disk. Records crossing the interface are frozen
dataclasses; failures are :class:`~protocol.errors.S3Error`.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from protocol.errors import ErrorCode, S3Error

from .lifecycle import LifecycleRule


@dataclass(frozen=True)
class BucketInfo:
    name: str
    owner: str
    created: float
    region: str
    acl: str = "private"  # a canned ACL
    tags: dict[str, str] = field(default_factory=dict)
    # This incarnation of the bucket: a bucket deleted and created again (by anyone) has another,
    # so what was granted for the old one (a data ticket, cached chunks) never reaches the new one.
    incarnation: str = ""
    lifecycle: tuple[LifecycleRule, ...] = ()  # its lifecycle configuration (the AbortIncompleteMultipartUpload subset)


@dataclass(frozen=True)
class ObjectMeta:
    """Everything S3 returns about an object besides its bytes."""

    bucket: str
    key: str
    size: int
    etag: str  # quoted, as S3 sends it
    last_modified: float
    content_type: str = "binary/octet-stream"
    user_metadata: dict[str, str] = field(default_factory=dict)
    # Cache-Control, Content-Disposition, Content-Encoding, Content-Language, Expires
    system_headers: dict[str, str] = field(default_factory=dict)
    checksums: dict[str, str] = field(default_factory=dict)  # e.g. {"CRC32": "base64"}
    part_sizes: tuple[int, ...] = ()  # non-empty for multipart objects
    storage_class: str = "STANDARD"
    owner: str = ""
    # The backend's handle on exactly this version's bytes (local disk: its file), so a
    # reader never pairs this metadata with a newer version's bytes.
    tags: dict[str, str] = field(default_factory=dict)
    acl: str = "private"  # a canned ACL
    locator: str = field(default="", compare=False, repr=False)


@dataclass(frozen=True)
class PutSpec:
    """What a writer declares about the object it is about to store."""

    content_type: str = "binary/octet-stream"
    user_metadata: dict[str, str] = field(default_factory=dict)
    system_headers: dict[str, str] = field(default_factory=dict)
    expected_md5: bytes | None = None  # Content-MD5, decoded
    expected_checksums: dict[str, str] = field(default_factory=dict)  # algorithm -> base64
    checksum_algorithms: tuple[str, ...] = ()  # compute and store these
    expected_size: int | None = None
    # Checksums known only once the body has ended (aws-chunked trailers);
    # called by the backend after the last chunk, before committing.
    late_checksums: Callable[[], dict[str, str]] | None = None
    immutable: bool = False  # KV chunks: identical re-put is a no-op, different bytes refused
    tags: dict[str, str] = field(default_factory=dict)
    acl: str = "private"  # a canned ACL
    checksum_type: str = "COMPOSITE"  # multipart: COMPOSITE (checksum of the parts' checksums) or FULL_OBJECT


@dataclass(frozen=True)
class WriteCondition:
    """S3's conditional write (PutObject, CompleteMultipartUpload, CopyObject): ``If-None-Match: *`` (the key holds no
    object) or ``If-Match: <etag>`` (its current version has this ETag). Stores check it atomically with the write
    (:func:`~storage_server.store.rules.check_write_condition`), so of concurrent writers exactly the ones it allows land."""

    if_none_match: bool = False
    if_match: str | None = None  # as sent: quoted or not, or "*" for any current version


@dataclass(frozen=True)
class ListPage:
    objects: list[ObjectMeta]
    common_prefixes: list[str]
    is_truncated: bool
    next_marker: str | None  # last key or prefix returned, for continuation


@dataclass(frozen=True)
class UploadInfo:
    upload_id: str
    bucket: str
    key: str
    initiated: float
    owner: str
    spec: PutSpec


@dataclass(frozen=True)
class PartInfo:
    part_number: int
    size: int
    etag: str
    last_modified: float
    checksums: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ByteRange:
    """Inclusive-exclusive byte range ``[start, end)``."""

    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start


BodyStream = AsyncIterator[bytes]


class ObjectReader(abc.ABC):
    """One version of an object, open for reading: ``meta`` and the bytes always belong together.

    ``head`` holds the first bytes, read together with the metadata, so a small
    object needs no further I/O. Always ``close()`` it.
    """

    meta: ObjectMeta
    head: bytes

    @abc.abstractmethod
    def stream(self, rng: ByteRange | None = None, chunk_size: int = 1 << 20) -> BodyStream:
        """The bytes of ``rng`` (the whole object by default)."""

    @abc.abstractmethod
    def close(self) -> None: ...


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


def unsupported(operation: str, store: object) -> S3Error:
    return S3Error(ErrorCode.NotImplemented, f"{operation} is not supported by the {type(store).__name__} store.")


class ObjectStore(abc.ABC):
    """An object store: the S3 operations the gateway serves.

    The core (buckets, put/head/open/delete, listing) is abstract. Everything else has a
    default in the style of versitygw's ``BackendUnsupported``: a generic implementation
    where one exists (``put_many``, ``delete_many``), otherwise ``501 NotImplemented``
    naming the operation, so a new backend starts small and grows operation by operation.
    Implementations make writes atomic and durable.
    """

    # -- buckets -----------------------------------------------------------
    @abc.abstractmethod
    async def create_bucket(self, name: str, owner: str, region: str, acl: str = "private") -> None: ...
    @abc.abstractmethod
    async def get_bucket(self, name: str) -> BucketInfo: ...
    @abc.abstractmethod
    async def delete_bucket(self, name: str) -> None: ...
    @abc.abstractmethod
    async def list_buckets(self, owner: str, prefix: str = "", after: str = "", limit: int = 10000) -> list[BucketInfo]: ...

    async def probe(self) -> None:
        """Whether the store answers (``/ready``): raises if not. A backend whose listing is costly overrides it with one cheap request."""
        await self.list_buckets("", limit=1)

    # -- objects -----------------------------------------------------------
    @abc.abstractmethod
    async def put_object(self, bucket: str, key: str, body: BodyStream, spec: PutSpec, owner: str,
                         condition: WriteCondition | None = None) -> ObjectMeta:
        """Store ``body`` as the key's object; with ``condition``, only if it holds at the commit (else 412/404/409)."""

    async def put_many(self, bucket: str, items: list[tuple[str, bytes | memoryview, PutSpec]], owner: str) -> list[ObjectMeta]:
        """Store many small objects; all are durable before it returns. Backends override it to amortise durability."""
        return [await self.put_object(bucket, key, _once(bytes(data)), spec, owner) for key, data, spec in items]

    @abc.abstractmethod
    async def head_object(self, bucket: str, key: str) -> ObjectMeta: ...
    @abc.abstractmethod
    async def open_object(self, bucket: str, key: str, prefetch: int = 0) -> ObjectReader:
        """The current version, open, with up to ``prefetch`` leading bytes already read (NoSuchKey if none)."""
    @abc.abstractmethod
    async def delete_object(self, bucket: str, key: str) -> None: ...

    async def delete_many(self, bucket: str, keys: list[str]) -> None:
        """Delete many keys (missing ones are not an error). Backends batch this."""
        for key in keys:
            await self.delete_object(bucket, key)

    async def copy_object(self, src: ObjectMeta, bucket: str, key: str, spec: PutSpec, owner: str,
                          condition: WriteCondition | None = None) -> ObjectMeta:
        raise unsupported("CopyObject", self)

    @abc.abstractmethod
    async def list_objects(self, bucket: str, prefix: str = "", delimiter: str = "", after: str = "", limit: int = 1000) -> ListPage: ...

    # -- multipart ---------------------------------------------------------
    async def create_upload(self, bucket: str, key: str, spec: PutSpec, owner: str) -> UploadInfo:
        raise unsupported("CreateMultipartUpload", self)

    async def get_upload(self, bucket: str, key: str, upload_id: str) -> UploadInfo:
        raise unsupported("Multipart upload", self)

    async def upload_part(self, upload: UploadInfo, part_number: int, body: BodyStream, spec: PutSpec) -> PartInfo:
        raise unsupported("UploadPart", self)

    async def upload_part_copy(self, upload: UploadInfo, part_number: int, src: ObjectMeta, rng: ByteRange | None) -> PartInfo:
        raise unsupported("UploadPartCopy", self)

    async def list_parts(self, upload: UploadInfo, after: int = 0, limit: int = 1000) -> list[PartInfo]:
        raise unsupported("ListParts", self)

    async def complete_upload(self, upload: UploadInfo, parts: list[tuple[int, str, dict[str, str]]],
                              condition: WriteCondition | None = None) -> ObjectMeta:
        """``parts``: (part number, ETag, checksums the client claims) in request order; ``condition`` as for :meth:`put_object`."""
        raise unsupported("CompleteMultipartUpload", self)

    async def abort_upload(self, upload: UploadInfo) -> None:
        raise unsupported("AbortMultipartUpload", self)

    # -- tagging and canned ACLs -------------------------------------------
    async def set_object_tags(self, bucket: str, key: str, tags: dict[str, str]) -> None:
        raise unsupported("PutObjectTagging", self)

    async def set_object_acl(self, bucket: str, key: str, acl: str) -> None:
        raise unsupported("PutObjectAcl", self)

    async def set_bucket_tags(self, bucket: str, tags: dict[str, str]) -> None:
        raise unsupported("PutBucketTagging", self)

    async def set_bucket_acl(self, bucket: str, acl: str) -> None:
        raise unsupported("PutBucketAcl", self)

    async def set_bucket_lifecycle(self, bucket: str, rules: tuple[LifecycleRule, ...]) -> None:
        """Replace the bucket's lifecycle rules (none: DeleteBucketLifecycle)."""
        raise unsupported("PutBucketLifecycleConfiguration", self)

    async def completed_upload(self, bucket: str, key: str, upload_id: str) -> ObjectMeta | None:
        """The object a recently completed upload became, if the key still holds it (a retried Complete
        answers with it); None if this store does not remember."""
        return None

    async def list_uploads(self, bucket: str, prefix: str = "", after_key: str = "", after_upload: str = "", limit: int = 1000) -> list[UploadInfo]:
        """Uploads in progress under ``prefix`` after (key, upload id), in that order."""
        raise unsupported("ListMultipartUploads", self)

    async def list_uploads_page(self, bucket: str, prefix: str, delimiter: str, key_marker: str, upload_marker: str,
                                limit: int) -> "UploadPage":
        """One ListMultipartUploads page, rolled up by ``delimiter`` (the same rule as object listings)."""
        from .rules import group_uploads

        async def fetch(after_key: str, after_upload: str, n: int) -> list[UploadInfo]:
            return await self.list_uploads(bucket, prefix, after_key, after_upload, n)

        return await group_uploads(fetch, prefix, delimiter, key_marker, upload_marker, limit)

    # -- housekeeping ------------------------------------------------------
    async def bucket_names(self) -> list[str]:
        """Every bucket of every tenant (housekeeping's view: abandoned uploads are aborted in each)."""
        raise unsupported("bucket_names", self)

    async def reclaim_orphans(self) -> int:
        """Delete stored bytes that no metadata references (crash leftovers); returns how many."""
        return 0

    async def close(self) -> None:
        """Release resources (connections, pools)."""


if TYPE_CHECKING:
    from .rules import UploadPage
