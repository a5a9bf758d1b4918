"""One kv-get as the storage server's collaborators see it: its accepted record (:class:`TransferInfo`), the
delivery-time forecast a cluster node attaches, and the hooks around the KV service (pacers, observers, the
cluster's delegate), apart from the service's orchestration (:mod:`storage_server.kv_service`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from protocol.verbs import VerbsDevice
from protocol.wire import Descriptor, TransferStats

from .executor import Pacer
from .plan import TransferPlan
from .transports import Transport

access_log = logging.getLogger("objectcache.access.transfers")


@dataclass(frozen=True)
class Forecast:
    """The delivery-time oracle's prediction for one kv-get, from its arrival (the metrics set it against the measured)."""

    first_layer_s: float
    total_s: float


class Forecaster(Protocol):
    """Predicts kv-gets (a cluster node's :class:`~storage_server.cluster.estimator.Estimator`)."""

    def snapshot(self, request_id: str = "") -> Any:
        """The link picture now (taken when kv-get ``request_id`` arrives)."""

    def forecast(self, snapshot: Any, d: Descriptor, paths: dict[str, int]) -> Forecast:
        """The prediction for ``d`` whose chunks took ``paths``, from the picture at its arrival."""


@dataclass(frozen=True)
class TransferInfo:
    """One accepted kv-get, as pacers and status see it."""

    request_id: str
    tenant: str
    bucket: str
    descriptor: Descriptor
    plan: TransferPlan
    forecast: Forecast | None = None
    arrived: float = 0.0  # time.perf_counter() when the storage server received the kv-get (a load budget counts from it)

    def describe(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "tenant": self.tenant, "mode": self.plan.mode.name.lower(),
                "payload_bytes": self.descriptor.payload_bytes}


# Builds a pacer for a transfer (or None to leave it alone). Injected by whoever builds the server.
PacerFactory = Callable[[TransferInfo], Pacer | None]
# Opens the RDMA device for the pyverbs engine (by name, "" = the first); pyverbs by default.
VerbsOpener = Callable[[str], VerbsDevice]
# Told of every accepted kv-get once it ends: how ("ok", "error", "client_gone", "failed") and its END
# statistics when it completed (the metrics plug in here).
TransferObserver = Callable[[TransferInfo, str, TransferStats | None], None]


class Pacers:
    """Several pacers in order."""

    def __init__(self, pacers: Sequence[Pacer]) -> None:
        self.pacers = pacers

    async def before_layer(self, nbytes: int) -> None:
        for p in self.pacers:
            await p.before_layer(nbytes)

    def after_layer(self) -> None:
        for p in self.pacers:
            p.after_layer()


class Delegate(Protocol):
    """Serves a kv-get through other nodes (the cluster's peer -> engine rdma path), or declines (None)."""

    async def delegate(self, tenant: str, bucket: str, request_id: str, d: Descriptor, transport: Transport,
                       accept: Callable[[], None]) -> TransferStats | None:
        """The kv-get's END statistics once delivered through other nodes (having called ``accept`` first),
        or None, before accepting, to serve it here."""


def log_transfer(info: TransferInfo, outcome: str, stats: TransferStats | None) -> None:
    """The storage server's access line for a kv-get: the gateway's request id, so both logs join."""
    if access_log.isEnabledFor(logging.INFO):
        fields = {"request_id": info.request_id, "tenant": info.tenant, "bucket": info.bucket, "operation": "KVGet",
                  "outcome": outcome, "mode": info.plan.mode.name.lower(), "transport": info.descriptor.target.transport.name.lower(),
                  "bytes": info.descriptor.payload_bytes if outcome == "ok" else 0,
                  "seconds": round(stats.total_s, 6) if stats is not None else None,
                  "paths": stats.paths if stats is not None else None, "failovers": stats.failovers if stats is not None else 0}
        access_log.info(json.dumps(fields), extra={"fields": fields})
