"""S3-over-RDMA on the client: registered memory and its ``x-amz-rdma-token`` for plain S3 GETs, and a whole-object
GET that the storage server writes straight into that memory."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator
from urllib.parse import quote

import aiohttp
import numpy as np

from protocol.errors import ErrorCode, S3Error
from protocol.rdma_token import HEADER_RDMA_BYTES, HEADER_RDMA_REPLY, HEADER_RDMA_TOKEN, REPLY_OK
from protocol.wire import TransportKind

from .destinations import Destinations
from .signed import SignedRequests, _s3_error, _unreachable


class RdmaGets(SignedRequests):
    """``rdma_memory`` and ``get_object_rdma``."""

    bucket: str
    _destinations: dict[TransportKind, Destinations]
    _rdma_unavailable: str

    @contextlib.asynccontextmanager
    async def rdma_memory(self, nbytes: int) -> AsyncIterator[tuple[str, memoryview]]:
        """Registered memory of ``nbytes`` and the ``x-amz-rdma-token`` describing it, for plain S3 GETs.

        Any S3 client may send the token on a GET of a whole object (the S3-over-RDMA convention):
        the storage server writes the object into this memory and the response has no body. The
        memory is this client's until the block exits.
        """
        destinations = self._destinations.get(TransportKind.RDMA)
        if destinations is None:
            raise ValueError(f"transport 'rdma' is not available in this process: {self._rdma_unavailable}")
        dest = await destinations.acquire(nbytes, None)
        try:
            yield destinations.token(dest).encode(), dest.view
        finally:
            destinations.release(dest)

    async def get_object_rdma(self, key: str, bucket: str | None = None) -> np.ndarray:
        """GET a whole object over RDMA (``x-amz-rdma-token``); a copy of its bytes.

        ``NotImplemented`` when the server declines (the object no longer fits, a Range…): GET it plainly then.
        """
        assert self._http is not None, "use the client inside `async with`"
        bucket = bucket or self.bucket
        url = f"{self.endpoint}/{bucket}/{quote(key, safe='/~')}"
        try:
            async with self._http.head(url, headers=self._signed_headers("HEAD", url, hashlib.sha256(b"").hexdigest(), {})) as head:
                if head.status != 200:  # a HEAD has no error body: its status says it
                    code = {403: ErrorCode.AccessDenied, 404: ErrorCode.NoSuchKey}.get(head.status, ErrorCode.InternalError)
                    raise S3Error(code, f"HEAD {bucket}/{key}: HTTP {head.status}", f"/{bucket}/{key}")
                size = int(head.headers["Content-Length"])
        except aiohttp.ClientError as e:
            raise _unreachable(self.endpoint, f"HEAD {key}", e) from None
        async with self.rdma_memory(max(size, 1)) as (token, view):
            headers = self._signed_headers("GET", url, hashlib.sha256(b"").hexdigest(), {HEADER_RDMA_TOKEN: token})
            try:
                async with self._http.get(url, headers=headers) as resp:
                    body = await resp.read()
                    if resp.status != 200:
                        raise _s3_error(resp.status, body)
                    if resp.headers.get(HEADER_RDMA_REPLY) != REPLY_OK or body:
                        raise S3Error(ErrorCode.InternalError, "the server answered x-amz-rdma-token with the bytes in the body")
                    n = int(resp.headers[HEADER_RDMA_BYTES])
            except aiohttp.ClientError as e:
                raise _unreachable(self.endpoint, f"GET {key}", e) from None
            return np.frombuffer(view[:n], np.uint8).copy()
