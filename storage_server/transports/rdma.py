"""``rdma``: RDMA WRITE into a client memory region (a separate issue; answered 501 until then).

The plan: the client registers memory and sends its remote description as the
capability (compatible with the ``x-amz-rdma-token`` convention); the server
writes each layer's slices one-sidedly and notifies the layer (NIXL/UCX, or
pyverbs WRITE_WITH_IMM carrying the layer index).
"""

from __future__ import annotations

from protocol.errors import ErrorCode, S3Error

from .base import OpenRequest, Transport


class RdmaTransport(Transport):
    name = "rdma"

    @classmethod
    def open(cls, request: OpenRequest) -> Transport:
        raise S3Error(ErrorCode.NotImplemented, "The rdma transport is not implemented yet; use shm or http.", extra={"Field": "target.transport"})
