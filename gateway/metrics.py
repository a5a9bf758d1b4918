"""Prometheus metrics of the gateway: per operation, requests by status, latency and bytes.

Fed by the per-operation hook (:data:`gateway.middleware.OPERATION_HOOKS`), so
every request is counted once with the status the client got (499 when it
went away). Each gateway has its own registry, with the process collectors,
served on ``[metrics] gateway_port`` (never on the S3 port: a scrape carries no
signature).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from .middleware import OperationRecord

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class GatewayMetrics:
    """One gateway's metrics (its own registry: an in-process test node holds a gateway and a storage server)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        for shared in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):  # the process's own: CPU, memory, fds, GC
            r.register(shared)
        self.requests = Counter("objectcache_requests", "Requests by S3/KV operation and HTTP status", ["operation", "status"], registry=r)
        self.latency = Histogram("objectcache_request_duration_seconds", "Time from request to the last byte of the response",
                                 ["operation"], buckets=LATENCY_BUCKETS, registry=r)
        self.bytes_in = Counter("objectcache_request_bytes", "Request body bytes received", ["operation"], registry=r)
        self.bytes_out = Counter("objectcache_response_bytes", "Response bytes sent", ["operation"], registry=r)
        self.draining = Gauge("objectcache_gateway_draining", "1 once SIGTERM was received and the gateway is draining", registry=r)

    def observe(self, record: OperationRecord) -> None:
        """An :data:`~gateway.middleware.OPERATION_HOOKS` entry."""
        op = record.operation
        self.requests.labels(op, str(record.status)).inc()
        self.latency.labels(op).observe(record.duration_s)
        self.bytes_in.labels(op).inc(record.bytes_in)
        self.bytes_out.labels(op).inc(record.bytes_out)

    async def listen(self, host: str, port: int) -> Callable[[], Awaitable[None]]:
        """Serve ``/metrics`` on its own port, apart from S3 (it keeps answering while the S3 listener drains); a stop function."""
        app = web.Application()
        app.router.add_get("/metrics", self._scrape)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        return runner.cleanup

    async def _scrape(self, _: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})
