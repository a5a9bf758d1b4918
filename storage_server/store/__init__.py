"""Storage behind two small interfaces.

* :class:`ObjectStore` — buckets, objects, listing and multipart: what the S3 API needs.
* :class:`ChunkSource` — the KV path: longest-prefix lookup, batched puts, pinned chunks to range-read.

:mod:`.factory` opens the implementation ``store.backend`` names.
"""

from .chunk_source import ChunkHandle, ChunkSource, PinFor, PinnedChunks
from .factory import open_chunk_source, open_object_store
from .lifecycle import LifecycleRule, abort_after_s
from .object_store import BucketInfo, ByteRange, ListPage, ObjectMeta, ObjectStore, PartInfo, PutSpec, UploadInfo, WriteCondition

__all__ = [
    "BucketInfo",
    "ByteRange",
    "ChunkHandle",
    "ChunkSource",
    "LifecycleRule",
    "ListPage",
    "ObjectMeta",
    "ObjectStore",
    "PartInfo",
    "PinFor",
    "PinnedChunks",
    "PutSpec",
    "UploadInfo",
    "WriteCondition",
    "abort_after_s",
    "open_chunk_source",
    "open_object_store",
]
