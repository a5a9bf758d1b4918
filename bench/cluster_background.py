"""``bench cluster``'s background tenant (case a) as a process of its own: kv-gets of one prefix through node A, back to back.

The tenant that saturates A's link is another engine. Run inside the bench's own event loop (as it
was), its clients' CPU delayed the measured engine's kv-get as no engine on another host could: a
py-spy profile of the bench process during the case had 57% of its samples in
``ObjectCacheClient.__aenter__`` (botocore parsing its S3 service model, about a second of CPU per
client, on the event loop) and the rest in both tenants' frame handling, all on the one loop the
measured kv-get's frames wait on. Here the background has its own process and loop, and the
measured engine's loop runs only its own kv-get.

Protocol with the bench: one JSON argument (endpoint, credentials, bucket, keys, layout, transport,
streams); it prints ``ready`` once each stream completed a kv-get, runs until its standard input
closes, then prints how many kv-gets completed.
"""

from __future__ import annotations

import asyncio
import json
import sys

from client_sdk import KVLayout, ObjectCacheClient


async def _stream(spec: dict, layout: KVLayout, stop: asyncio.Event, first: asyncio.Queue) -> int:
    done = 0
    async with ObjectCacheClient(spec["endpoint"], spec["access_key"], spec["secret_key"], bucket=spec["bucket"]) as c:
        while True:
            await c.fetch(spec["keys"], layout, spec["transport"], mode="layerwise")
            done += 1
            if done == 1:
                first.put_nowait(None)
            if stop.is_set():
                return done


async def main(spec: dict) -> None:
    layout = KVLayout(**spec["layout"])
    loop = asyncio.get_running_loop()
    stop, first = asyncio.Event(), asyncio.Queue()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    streams = [asyncio.ensure_future(_stream(spec, layout, stop, first)) for _ in range(spec["streams"])]
    for _ in streams:
        await first.get()
    print("ready", flush=True)
    await reader.read()  # the bench closes our standard input: the measured kv-gets are over
    stop.set()
    print(sum(await asyncio.gather(*streams)), flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
