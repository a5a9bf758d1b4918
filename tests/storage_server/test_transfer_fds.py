"""A kv-get of more distinct chunks than the storage server can hold open is refused cleanly, and the
descriptors transfers hold stay within half the file limit (security audit round two, item 13: a kv-get
of 65,536 existing chunks hit EMFILE, answered 500, and other requests got 503 meanwhile).

The storage server's file limit is lowered (prlimit) to 1,024 so a few thousand chunks show it.
"""

from __future__ import annotations

import asyncio
import resource

import numpy as np
import pytest
from kvsupport import client, keys_for, make_chunks, reference, rpc, run, tiny_layout
from support import boto_client, serving

from client_sdk import ObjectCacheError

LIMIT = 1024
N = 1100  # distinct chunks: more than the whole file limit


def test_a_kv_get_of_more_chunks_than_files_can_be_open_is_refused_and_others_are_served(tmp_path):
    layout = tiny_layout(16, num_layers=2)
    keys, chunks = keys_for(layout, N, "fds"), make_chunks(layout, N, seed=8)
    with serving(tmp_path) as (proc, tenant, sock):
        boto_client(proc.endpoint, tenant).create_bucket(Bucket="fds")
        pid = rpc(str(sock), "status")["pid"]

        async def scenario():
            async with client(proc, tenant, "fds") as c:
                await c.put_chunks(keys, chunks, layout)
                resource.prlimit(pid, resource.RLIMIT_NOFILE, (LIMIT, LIMIT))
                with pytest.raises(ObjectCacheError) as e:
                    await c.fetch(keys, layout, "http")
                assert e.value.code.name == "KVTooManyKeys" and "file limit" in e.value.message, e.value
                # What fits is served, several at once (they wait for each other's descriptors, never fail).
                most = LIMIT // 4 - 16
                done = await asyncio.gather(*(c.fetch(keys[i * 8:i * 8 + most], layout, "http") for i in range(3)))
                for i, (payload, _) in enumerate(done):
                    assert np.array_equal(payload, reference(layout, chunks[i * 8:i * 8 + most]))
                status = rpc(str(sock), "status")
                assert status["open_fds"] < LIMIT and status["transfer_fds"]["held_fds"] == 0, status

        run(scenario())
