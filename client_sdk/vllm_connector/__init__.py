"""ObjectCache as a vLLM KV connector (``KVConnectorBase_V1``).

vLLM loads it from its KV-transfer configuration::

    kv_transfer_config={"kv_connector": "ObjectCacheConnector",
                        "kv_connector_module_path": "client_sdk.vllm_connector",
                        "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                        "kv_connector_extra_config": {"endpoint": ..., "bucket": ..., "transport": "auto"}}

The modules: :mod:`.config` (settings, namespace), :mod:`.plan` (token blocks → chunk keys, which
blocks to load and save: pure), :mod:`.blocks` (paged blocks ↔ KV_L2TD chunk layers),
:mod:`.scheduler` and :mod:`.worker` (the two halves), :mod:`.connector` (the class vLLM loads).
Only :mod:`.connector`, :mod:`.worker` and :mod:`.blocks` need vLLM or torch; importing this package
does not, so the pure parts are usable (and tested) without them.
"""

from typing import Any

__all__ = ["ObjectCacheConnector", "ObjectCacheConnectorMetadata"]


def __getattr__(name: str) -> Any:
    # vLLM does ``getattr(importlib.import_module(module_path), kv_connector)``: import vLLM only then.
    if name in __all__:
        from . import connector

        return getattr(connector, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
