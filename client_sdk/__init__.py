"""ObjectCache client SDK: chunk hashing, put/lookup/fetch, and the layer-ready iterator.

```python
from client_sdk import ObjectCacheClient, KVLayout, chunk_keys
layout = KVLayout(num_layers=32, chunk_tokens=16, kv_heads=8, head_dim=128, dtype="bfloat16")
keys = chunk_keys(token_ids, chunk_tokens=16, namespace="llama-3.1-8b")
async with ObjectCacheClient(endpoint, access_key, secret_key, bucket="kv-cache") as c:
    await c.put_chunks(keys, chunks)
    hit = await c.lookup(keys)
    async with c.fetch_layers(keys[:hit], layout, transport="shm") as layers:
        async for idx, view in layers:
            ...
```
"""

from protocol.errors import S3Error as ObjectCacheError

from .client import ObjectCacheClient
from .hashing import chunk_keys
from .layout import PRESETS, KVLayout
from .stream import FetchStats, LayerStream

__all__ = ["FetchStats", "KVLayout", "LayerStream", "ObjectCacheClient", "ObjectCacheError", "PRESETS", "chunk_keys"]
