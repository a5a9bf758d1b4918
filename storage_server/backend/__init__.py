"""Object store backends behind one small interface (:class:`Backend`)."""

from .base import Backend, BucketInfo, ByteRange, ListPage, ObjectMeta, PartInfo, PutSpec, UploadInfo
from .localdisk import LocalDiskBackend

__all__ = [
    "Backend",
    "BucketInfo",
    "ByteRange",
    "ListPage",
    "LocalDiskBackend",
    "ObjectMeta",
    "PartInfo",
    "PutSpec",
    "UploadInfo",
]
