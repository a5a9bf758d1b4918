"""Unauthenticated probes: ``GET /health`` (liveness) and ``GET /ready`` (readiness).

They are answered before SigV4, so only the exact requests are probes:
``GET /health`` or ``GET /ready`` with no query string and no ``Authorization``
header. A signed or presigned request to the same path (every S3 request on a
bucket named ``health`` or ``ready`` carries one) is S3 as always.

``/ready`` is 200 when the object store answers (:meth:`ObjectStore.probe`: one
request, however many buckets there are, as anyone may ask) and the storage server answers
its RPC ``ping`` within :data:`PROBE_TIMEOUT_S`; otherwise, and from the moment
a drain starts (SIGTERM), it is 503 with the reason in a JSON body, so a load
balancer stops sending traffic before the listener closes.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from protocol.errors import S3Error
from protocol.rpc import Op
from storage_server.store import ObjectStore

from .storage_rpc import StorageServerClient

PROBES = ("/health", "/ready")
PROBE_TIMEOUT_S = 2.0


def is_probe(request: web.Request) -> bool:
    return (request.method == "GET" and request.raw_path in PROBES
            and "Authorization" not in request.headers)


class Health:
    """The probes' state: whether the gateway is draining, and how to reach what it depends on."""

    def __init__(self, store: ObjectStore, rpc: StorageServerClient) -> None:
        self.store = store
        self.rpc = rpc
        self.draining = False

    async def answer(self, request: web.Request) -> web.Response:
        if request.raw_path == "/health":
            return web.json_response({"status": "ok"})
        reasons = ["draining: the gateway is shutting down"] if self.draining else await self._unreachable()
        if reasons:
            return web.json_response({"status": "unavailable", "reasons": reasons}, status=503)
        return web.json_response({"status": "ready"})

    async def _unreachable(self) -> list[str]:
        """What does not answer, checked concurrently."""
        store, storage_server = await asyncio.gather(
            _check("object store", self.store.probe()),
            _check("storage server", self.rpc.call(Op.PING)))
        return [r for r in (store, storage_server) if r]


async def _check(what: str, probe) -> str:
    try:
        await asyncio.wait_for(probe, PROBE_TIMEOUT_S)
        return ""
    except asyncio.TimeoutError:
        return f"{what}: no answer within {PROBE_TIMEOUT_S:g} s"
    except S3Error as e:
        return f"{what}: {e.message}" if e.message else f"{what}: {e.code.name}"
    except Exception as e:
        return f"{what}: {e.__class__.__name__}"
