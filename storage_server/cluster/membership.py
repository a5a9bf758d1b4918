"""Who is in the cluster: static peers, and heartbeat records in the upstream store (no coordinator to deploy).

With ``cluster.registry_bucket`` set, every ``heartbeat_s`` a node writes its :class:`~protocol.cluster.Heartbeat`
to ``.objectcache/cluster/nodes/<node_id>.json`` in that bucket (ObjectCache's reserved prefix: tenants can
neither list nor write it) and reads the others'. A record's ``seq`` grows with every beat, so readers judge
liveness by their own clock: a node whose record has not changed for ``missed_heartbeats`` of its intervals
is gone (a record first seen counts as alive if its ``sent_at`` is that recent). A node that stops cleanly
deletes its record. Cost per node and interval: one PUT, one LIST and one GET per other node's record
(N nodes: N² small GETs per interval in all). Static peers (``cluster.peers``) are always candidates; a dead
one costs a failed lookup within ``lookup_timeout_s``, never wrong bytes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from protocol.cluster import NODES_PREFIX, Heartbeat, NodeInfo
from protocol.config import ClusterConfig
from protocol.errors import ErrorCode, S3Error

from ..store.s3.upstream import Upstream

log = logging.getLogger("objectcache.cluster")


@dataclass
class Seen:
    beat: Heartbeat
    changed_at: float  # this node's monotonic clock when its seq last changed


class Membership:
    def __init__(self, cfg: ClusterConfig, me: NodeInfo, up: Upstream | None) -> None:
        self.cfg, self.me, self.up = cfg, me, up
        self.static = [NodeInfo(node_id, addr) for node_id, addr in cfg.static_peers() if node_id != me.node_id]
        self.seen: dict[str, Seen] = {}
        self.seq = 0
        self.errors = 0
        self.refreshed_at = 0.0  # when this node last read the registry (its own clock)

    @property
    def record_key(self) -> str:
        return f"{NODES_PREFIX}{self.me.node_id}.json"

    def alive(self, s: Seen) -> bool:
        """Silence is measured up to this node's last reading of the registry, so a reader whose own rounds were
        delayed (a busy loop) never takes its lateness for the peers' silence."""
        return self.refreshed_at - s.changed_at <= self.cfg.missed_heartbeats * max(s.beat.interval_s, 0.001)

    def live(self) -> list[NodeInfo]:
        """The peers to ask now (never this node): registry members alive, and static peers (the registry's labels win)."""
        nodes = {n.node_id: n for n in self.static}
        for node_id, s in self.seen.items():
            if self.alive(s):
                nodes[node_id] = s.beat.node
        nodes.pop(self.me.node_id, None)
        return sorted(nodes.values(), key=lambda n: n.node_id)

    # -- the registry ----------------------------------------------------------------
    async def start(self) -> None:
        """Create the registry bucket if missing and beat once, so peers see this node before it serves."""
        if self.up is None or not self.cfg.registry_bucket:
            return
        try:
            try:
                await self.up.call("create_bucket", Bucket=self.cfg.registry_bucket, resource=f"/{self.cfg.registry_bucket}")
            except S3Error as e:
                if e.code not in (ErrorCode.BucketAlreadyOwnedByYou, ErrorCode.BucketAlreadyExists):
                    raise
            await self.round()
        except S3Error as e:  # an upstream outage must not keep the node from serving: the heartbeat rounds retry
            self.errors += 1
            log.warning("cluster: cannot reach the registry bucket %r yet (%s); retrying every %g s",
                        self.cfg.registry_bucket, e.message, self.cfg.heartbeat_s)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.heartbeat_s)
            try:
                await self.round()
            except Exception as e:  # an upstream hiccup: the next round tries again; peers keep their last view
                self.errors += 1
                log.warning("cluster heartbeat round failed: %s", e)

    async def round(self) -> None:
        if self.up is None or not self.cfg.registry_bucket:
            return
        await self.beat()
        await self.refresh()

    async def beat(self) -> None:
        assert self.up is not None
        self.seq += 1
        body = Heartbeat(self.me, self.seq, time.time(), self.cfg.heartbeat_s).encode()
        await self.up.call("put_object", Bucket=self.cfg.registry_bucket, Key=self.record_key, Body=body,
                           ContentType="application/json", resource=f"/{self.cfg.registry_bucket}/{self.record_key}")

    async def refresh(self) -> None:
        assert self.up is not None
        bucket = self.cfg.registry_bucket
        listed = await self.up.call("list_objects_v2", Bucket=bucket, Prefix=NODES_PREFIX, MaxKeys=1000, resource=f"/{bucket}")
        keys = [o["Key"] for o in listed.get("Contents", []) if o["Key"] != self.record_key]
        beats = await asyncio.gather(*(self._read(bucket, k) for k in keys))
        now, wall = time.monotonic(), time.time()
        present = set()
        for beat in beats:
            if beat is None:
                continue
            present.add(beat.node.node_id)
            old = self.seen.get(beat.node.node_id)
            if old is None:
                age = max(0.0, wall - beat.sent_at)
                self.seen[beat.node.node_id] = Seen(beat, now - age)
            elif beat.seq != old.beat.seq:
                self.seen[beat.node.node_id] = Seen(beat, now)
        for gone in set(self.seen) - present:  # its record was deleted: it left
            del self.seen[gone]
        self.refreshed_at = now

    async def _read(self, bucket: str, key: str) -> Heartbeat | None:
        try:
            resp = await self.up.get(bucket, key, resource=f"/{bucket}/{key}")  # type: ignore[union-attr]
            async with resp["Body"] as body:
                return Heartbeat.decode(await body.read())
        except S3Error as e:
            if e.code != ErrorCode.NoSuchKey:
                log.warning("cluster: cannot read heartbeat %s: %s", key, e.message)
            return None

    async def leave(self) -> None:
        """Delete this node's record (a clean stop: peers stop asking at once)."""
        if self.up is None or not self.cfg.registry_bucket:
            return
        try:
            await self.up.call("delete_object", Bucket=self.cfg.registry_bucket, Key=self.record_key)
        except S3Error as e:
            log.warning("cluster: could not delete this node's heartbeat record: %s", e.message)

    def status(self) -> list[dict[str, object]]:
        now = time.monotonic()
        rows = [{**n.to_json(), "source": "static"} for n in self.static]
        rows += [{**s.beat.node.to_json(), "source": "registry", "alive": self.alive(s),
                  "silent_s": round(now - s.changed_at, 3)} for s in self.seen.values()]
        return rows
