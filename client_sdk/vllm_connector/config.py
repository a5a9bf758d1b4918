"""The connector's settings: ``kv_connector_extra_config`` first, then the environment.

Credentials may stay out of the engine's configuration: ``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and ``AWS_DEFAULT_REGION`` (what
``objectcache serve`` writes to ``data/dev-credentials.env``) fill whatever the extra config
leaves out.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TRANSPORTS = ("auto", "shm", "http", "rdma")
MODES = ("auto", "layerwise", "chunkwise")
OVERLAPS = ("auto", "layerwise", "whole")
# Where each setting comes from when the extra config does not name it.
ENV = {"endpoint": "AWS_ENDPOINT_URL", "access_key": "AWS_ACCESS_KEY_ID", "secret_key": "AWS_SECRET_ACCESS_KEY", "region": "AWS_DEFAULT_REGION"}
MAX_NAMESPACE_BYTES = 512  # keys are namespace + "/" + 32 hex digits; S3 allows 1,024 bytes


@dataclass(frozen=True)
class ConnectorConfig:
    endpoint: str
    access_key: str
    secret_key: str
    bucket: str = "kv-cache"
    region: str = "us-east-1"
    transport: str = "auto"
    namespace: str = ""          # "" → derived from the model, KV dtype and parallel ranks (see :func:`namespace`)
    load_timeout_s: float = 60.0  # a layer not in place after this long fails the load (the request recomputes)
    mode: str = "auto"            # kv-get assembly: the storage server's choice, or always layer by layer / chunk by chunk
    load_budget_s: float = 0.0    # a step's load not in place this long after it started is abandoned (recomputed); 0: none
    # When attention may start: "layerwise" (layer ℓ computes once ℓ is in place, while ℓ+1.. move), "whole" (the step's
    # load is all in place first) or "auto": whole where the KV cache is in host memory (the copies and the forward
    # share the CPU's cores), layerwise elsewhere (see WorkerSide.register).
    overlap: str = "auto"

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> "ConnectorConfig":
        env = os.environ if environ is None else environ
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(extra) - known)
        if unknown:
            raise ValueError(f"kv_connector_extra_config: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        values: dict[str, Any] = {k: v for k, v in extra.items() if v is not None}
        for field, var in ENV.items():
            if field not in values and env.get(var):
                values[field] = env[var]
        missing = [f for f in ("endpoint", "access_key", "secret_key") if not values.get(f)]
        if missing:
            raise ValueError("kv_connector_extra_config: " + ", ".join(f"{f} is not set (nor {ENV[f]})" for f in missing))
        if values.get("transport", "auto") not in TRANSPORTS:
            raise ValueError(f"kv_connector_extra_config: transport must be one of {', '.join(TRANSPORTS)}, not {values['transport']!r}")
        if values.get("mode", "auto") not in MODES:
            raise ValueError(f"kv_connector_extra_config: mode must be one of {', '.join(MODES)}, not {values['mode']!r}")
        if values.get("overlap", "auto") not in OVERLAPS:
            raise ValueError(f"kv_connector_extra_config: overlap must be one of {', '.join(OVERLAPS)}, not {values['overlap']!r}")
        values["load_timeout_s"] = _seconds("load_timeout_s", values.get("load_timeout_s", cls.load_timeout_s))
        if values["load_timeout_s"] <= 0:
            raise ValueError("kv_connector_extra_config: load_timeout_s must be > 0")
        values["load_budget_s"] = _seconds("load_budget_s", values.get("load_budget_s", cls.load_budget_s))
        return cls(**{k: v if k in SECONDS else str(v) for k, v in values.items()})


SECONDS = ("load_timeout_s", "load_budget_s")
REQUEST_BUDGET = "objectcache_load_budget_s"  # the key in a request's kv_transfer_params


def _seconds(name: str, value: Any, where: str = "kv_connector_extra_config") -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {name} must be a number, not {value!r}") from None
    if seconds < 0 or seconds != seconds:
        raise ValueError(f"{where}: {name} must be >= 0, not {value!r}")
    return seconds


def request_budget(kv_transfer_params: Mapping[str, Any] | None) -> float | None:
    """A request's own load budget (``kv_transfer_params["objectcache_load_budget_s"]``), or None; 0 means none."""
    if not kv_transfer_params or kv_transfer_params.get(REQUEST_BUDGET) is None:
        return None
    return _seconds(REQUEST_BUDGET, kv_transfer_params[REQUEST_BUDGET], "kv_transfer_params") or None


def namespace(config: ConnectorConfig, model: str, kv_dtype: str, tp_rank: int, tp_size: int, pp_rank: int = 0, pp_size: int = 1, *,
              revision: str | None = None, block_size: int | None = None, layout: str | None = None) -> str:
    """The chunk-key namespace of one KV shard.

    KV bytes depend on the model and its weights revision, the KV cache dtype, the block size (one
    block is one chunk), the chunk layout (K/V pairs or MLA's latent vector) and which heads
    (tensor-parallel rank) and layers (pipeline stage) a worker holds, so all of them are in the
    namespace: different models, revisions and shards never share keys. A configured
    ``namespace`` replaces the model part (use it when the same weights are served from different
    paths); the revision and everything else are always appended. The connector passes every keyword; a request's
    ``cache_salt`` goes into the hash (:func:`client_sdk.chunk_keys`), not here.
    """
    base = (config.namespace or f"vllm/{model.rstrip('/')}") + (f"@{revision}" if revision else "")
    ns = f"{base}/{kv_dtype}" + (f"/b{block_size}" if block_size else "") + (f"/{layout}" if layout else "")
    ns += f"/tp{tp_rank}of{tp_size}" + (f"/pp{pp_rank}of{pp_size}" if pp_size > 1 else "")
    if "\n" in ns or len(ns.encode()) > MAX_NAMESPACE_BYTES:
        raise ValueError(f"the chunk namespace {ns[:80]!r}... is not a single line of at most {MAX_NAMESPACE_BYTES} bytes; "
                         "set kv_connector_extra_config.namespace")
    return ns
