"""Prometheus metrics of the storage server: kv-gets, their bytes and timings, and what it holds right now.

Counters and histograms are fed by a :data:`~storage_server.kv_service.TransferObserver`
when a kv-get ends; gauges (active transfers, staging memory, registered
regions, the bandwidth pool's allocation per tenant) are read from the live
service at scrape time, so they can never drift from it. Served on
``[metrics] storage_server_port`` with the process collectors.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from protocol.wire import TransferStats

from .kv_service import KVService, TransferInfo

# measured / predicted: 1 is a perfect prediction, 2 took twice as long as the oracle said.
RATIO_BUCKETS = (0.1, 0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 4, 10)
SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class LiveState(Collector):
    """Gauges read from the service at scrape time (from the listener's thread: plain reads of counts)."""

    def __init__(self, kv: KVService) -> None:
        self.kv = kv

    def collect(self) -> Iterator[Metric]:
        kv = self.kv
        active = GaugeMetricFamily("objectcache_kv_transfers_active", "kv-gets accepted and not yet ended", labels=["mode"])
        modes = Tally(t.plan.mode.name.lower() for t in list(kv.active.values()))
        for mode in ("chunkwise", "layerwise"):
            active.add_metric([mode], modes.get(mode, 0))
        yield active
        yield GaugeMetricFamily("objectcache_kv_staging_held_bytes", "http staging memory held by transfers", value=kv.staging.held)
        yield GaugeMetricFamily("objectcache_kv_staging_limit_bytes", "http staging budget (storage_server.http_staging_bytes)",
                                value=kv.staging.total)
        yield GaugeMetricFamily("objectcache_kv_staging_waiting", "transfers waiting for staging memory", value=kv.staging.waiting)
        yield GaugeMetricFamily("objectcache_kv_regions", "registered shm regions", value=len(kv.regions))
        allocated = GaugeMetricFamily("objectcache_bandwidth_allocated_bytes_per_second",
                                      "bandwidth pool rate allocated to running layerwise transfers, per tenant", labels=["tenant"])
        if kv.pool is not None:
            per_tenant = Tally({t.name: 0.0 for t in kv.config.tenants})  # every tenant has a series, 0 while idle
            for lease in list(kv.pool._leases.values()):
                per_tenant[lease.tenant] += lease.rate
            for tenant, rate in sorted(per_tenant.items()):
                allocated.add_metric([tenant], rate)
            yield GaugeMetricFamily("objectcache_bandwidth_capacity_bytes_per_second", "bandwidth pool capacity B",
                                    value=kv.pool.scheduler.capacity)
        yield allocated
        yield from _tenant_cache(kv.chunks.tenant_status())


# Per-tenant chunk-cache series: (metric, help, field of ChunkSource.tenant_status, counter?).
TENANT_CACHE = (
    ("objectcache_cache_tenant_bytes", "KV chunk bytes the tenant holds on this node", "bytes", False),
    ("objectcache_cache_tenant_max_bytes", "the tenant's bound (cache.tenant_max_bytes, its cache_max_bytes, or cache.max_bytes)",
     "max_bytes", False),
    ("objectcache_cache_tenant_hits", "chunks the tenant's kv-lookups found", "hits", True),
    ("objectcache_cache_tenant_misses", "chunks the tenant's kv-lookups asked for past the found prefix", "misses", True),
    ("objectcache_cache_tenant_evictions", "the tenant's chunks evicted", "evictions", True),
    ("objectcache_cache_tenant_reused_after_eviction", "the tenant's evicted chunks stored again", "reused_after_eviction", True),
    ("objectcache_cache_tenant_eviction_to_reuse_bytes", "bytes the node stored between a chunk's eviction and its return, summed",
     "reuse_gap_bytes", True),
)


def _tenant_cache(status: dict[str, dict[str, int]]) -> Iterator[Metric]:
    for name, help_text, field_name, counter in TENANT_CACHE:
        family = (CounterMetricFamily if counter else GaugeMetricFamily)(name, help_text, labels=["tenant"])
        for tenant, counts in status.items():
            family.add_metric([tenant], counts[field_name])
        yield family


class StorageServerMetrics:
    """One storage server's registry; :meth:`observe` is its transfer observer."""

    def __init__(self, kv: KVService) -> None:
        self.registry = r = CollectorRegistry()
        for shared in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):  # the process's own: CPU, memory, fds, GC
            r.register(shared)
        r.register(LiveState(kv))
        labels = ["mode", "transport"]
        self.gets = Counter("objectcache_kv_gets", "kv-gets accepted, by how they ended", [*labels, "outcome"], registry=r)
        self.payload = Counter("objectcache_kv_get_payload_bytes", "payload bytes delivered by completed kv-gets", labels, registry=r)
        self.first_layer = Histogram("objectcache_kv_get_first_layer_seconds", "transfer start to layer 0 ready in the destination",
                                     labels, buckets=SECONDS_BUCKETS, registry=r)
        self.per_layer = Histogram("objectcache_kv_get_layer_delivery_seconds", "delivery time per layer (a transfer's mean)",
                                   labels, buckets=SECONDS_BUCKETS, registry=r)
        self.path_bytes = Counter("objectcache_kv_get_path_bytes", "chunk bytes of completed kv-gets by where they came from "
                                  "(local cache, upstream, peer:<node>)", ["path"], registry=r)
        self.failovers = Counter("objectcache_kv_get_failovers", "peer streams replaced by another path within a kv-get", registry=r)
        self.total = Histogram("objectcache_kv_get_seconds", "transfer start to END", labels, buckets=SECONDS_BUCKETS, registry=r)
        # The delivery-time oracle against the truth (cluster nodes): from the kv-get's arrival to its first layer / END.
        self.oracle_ratio = Histogram("objectcache_oracle_measured_over_predicted", "a kv-get's measured time over the oracle's "
                                      "prediction, from its arrival (phase: first_layer, total)", ["phase"], buckets=RATIO_BUCKETS, registry=r)
        self.oracle_error = Histogram("objectcache_oracle_error_seconds", "|measured - predicted| of a kv-get's time from its arrival "
                                      "(phase: first_layer, total)", ["phase"], buckets=SECONDS_BUCKETS, registry=r)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        kv.observers.append(self.observe)

    def _labelled(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, found once per label set: prometheus_client validates and locks on every call
        (six per kv-get, 40 µs of its time to the END frame, cProfile). Label sets are few (mode, transport, outcome, path)."""
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def observe(self, info: TransferInfo, outcome: str, stats: TransferStats | None) -> None:
        mode, transport = info.plan.mode.name.lower(), info.descriptor.target.transport.name.lower()
        self._labelled(self.gets, mode, transport, outcome).inc()
        if stats is None or outcome != "ok":
            return
        self._labelled(self.payload, mode, transport).inc(stats.payload_bytes)
        self._labelled(self.first_layer, mode, transport).observe(stats.first_layer_s)
        self._labelled(self.per_layer, mode, transport).observe(stats.delivery_s / max(info.descriptor.num_layers, 1))
        self._labelled(self.total, mode, transport).observe(stats.total_s)
        for path, nbytes in stats.paths.items():
            self._labelled(self.path_bytes, path).inc(nbytes)
        if stats.failovers:
            self.failovers.inc(stats.failovers)
        if info.forecast is not None:
            measured = {"first_layer": stats.setup_s + stats.first_layer_s, "total": stats.setup_s + stats.total_s}
            predicted = {"first_layer": info.forecast.first_layer_s, "total": info.forecast.total_s}
            for phase, seconds in measured.items():
                if predicted[phase] > 0:
                    self._labelled(self.oracle_ratio, phase).observe(seconds / predicted[phase])
                self._labelled(self.oracle_error, phase).observe(abs(seconds - predicted[phase]))

    def listen(self, host: str, port: int) -> Callable[[], None]:
        """Serve ``/metrics`` on its own listener thread; a stop function."""
        server, thread = start_http_server(port, host, self.registry)

        def stop() -> None:
            server.shutdown()
            server.server_close()
            thread.join(5)

        return stop
