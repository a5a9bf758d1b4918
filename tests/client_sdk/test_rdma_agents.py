"""Client NIXL agents learnt through kv-register-rdma are forgotten with their last region, so they are
bounded per tenant (storage_server.max_regions_per_tenant) and expire when idle; an agent's name is
its registering tenant's. Before, every distinct name stayed loaded forever (3,000 names: +124 MB).

Real NIXL agents in this process; distinct names are one agent's metadata with its name rewritten
(the same length), as an attacker would send them."""

from __future__ import annotations

import base64
import json
import secrets
import time

import numpy as np
import pytest
from kvsupport import rpc
from rawhttp import signed
from support import ServerProcess, make_tenants, write_config

from client_sdk.rdma import NixlClient, rdma_available

pytestmark = pytest.mark.skipif(not rdma_available()[0], reason=f"rdma transport unavailable here: {rdma_available()[1]}")


class Agent:
    """A NIXL agent of this process with a registered buffer; ``body(name)`` registers it, renamed if asked."""

    def __init__(self) -> None:
        self.nixl = NixlClient()
        self.buf = np.zeros(1 << 16, np.uint8)
        self.proof = secrets.token_bytes(16)
        self.buf[:16] = np.frombuffer(self.proof, np.uint8)  # read back by the server at registration
        self.handle = self.nixl.register(self.buf)
        self.metadata = self.nixl.metadata()
        self.name = self.nixl.agent.name.encode()

    def body(self, name: bytes | None = None) -> bytes:
        md = self.metadata if name is None else self.metadata.replace(self.name, name)
        return json.dumps({"engine": "nixl", "agent": base64.b64encode(md).decode(), "addr": self.buf.ctypes.data,
                           "size": self.buf.nbytes, "proof": self.proof.hex()}).encode()

    def renamed(self, i: int) -> bytes:
        tail = b"%08d" % i
        return self.name[: -len(tail)] + tail

    def close(self) -> None:
        self.nixl.deregister(self.handle)


@pytest.fixture(scope="module")
def agents():
    made = [Agent(), Agent()]
    assert len(made[0].name) == len(made[1].name)
    yield made
    for a in made:
        a.close()


@pytest.fixture
def node(request, tmp_path):
    """alice and bob on a node with at most 4 regions per tenant (and ``request.param`` more settings)."""
    people = {t.name: t for t in make_tenants("alice", "bob")}
    config = write_config(tmp_path / "c.toml", tmp_path / "data", list(people.values()),
                          extra=f'\n[storage_server]\nsocket = "{tmp_path / "ss.sock"}"\nmax_regions_per_tenant = 4\n'
                                + getattr(request, "param", ""))
    proc = ServerProcess(config).start()
    proc.rpc_socket = str(tmp_path / "ss.sock")
    yield proc, people
    proc.stop()


def register(proc, tenant, body: bytes):
    return signed(proc.endpoint, tenant, "POST", "/?kv-register-rdma", body=body)


def unregister(proc, tenant, reply: dict) -> None:
    r = signed(proc.endpoint, tenant, "POST", "/?kv-unregister", body=json.dumps({k: reply[k] for k in ("region_id", "token")}).encode())
    assert r.status == 200, r.body


def test_an_agent_is_forgotten_with_its_last_region(node, agents):
    proc, people = node
    a, b = agents
    alice = people["alice"]
    first, second = (register(proc, alice, a.body()) for _ in range(2))  # two regions, one agent
    assert first.status == second.status == 200
    assert rpc(proc.rpc_socket, "status")["rdma_agents"] == 1
    unregister(proc, alice, json.loads(first.body))
    assert rpc(proc.rpc_socket, "status")["rdma_agents"] == 1  # still used by the second region
    # NIXL itself still knows the name: another connection under it is refused.
    r = register(proc, alice, b.body(a.name))
    assert r.status == 400 and b"<ArgumentName>agent</ArgumentName>" in r.body, r.body
    unregister(proc, alice, json.loads(second.body))
    assert rpc(proc.rpc_socket, "status")["rdma_agents"] == 0
    # Forgotten by NIXL too: the name can now be loaded with another agent's connection.
    r = register(proc, alice, b.body(a.name))
    assert r.status == 200, r.body
    unregister(proc, alice, json.loads(r.body))


@pytest.mark.parametrize("node", ["region_idle_s = 0.5\nhousekeeping_s = 0.1\n"], indirect=True)
def test_distinct_agent_names_are_bounded_per_tenant_and_expire_when_idle(node, agents):
    proc, people = node
    a = agents[0]
    for i in range(40):
        r = register(proc, people["alice"], a.body(a.renamed(i)))
        assert r.status == 200, r.body
        status = rpc(proc.rpc_socket, "status")
        assert status["rdma_agents"] <= 4 and status["regions"] <= 4  # the least recently used idle region goes, with its agent
    deadline = time.monotonic() + 20
    while rpc(proc.rpc_socket, "status")["rdma_agents"] and time.monotonic() < deadline:
        time.sleep(0.05)
    status = rpc(proc.rpc_socket, "status")
    assert status["rdma_agents"] == 0 and status["regions"] == 0  # idle regions expired, their agents with them


def test_an_agent_name_is_its_registering_tenants(node, agents):
    proc, people = node
    a = agents[0]
    mine = register(proc, people["alice"], a.body())
    assert mine.status == 200, mine.body
    r = register(proc, people["bob"], a.body())  # alice's agent metadata, replayed by bob
    assert r.status == 403 and b"AccessDenied" in r.body and b"<ArgumentName>agent</ArgumentName>" in r.body, r.body
    assert rpc(proc.rpc_socket, "status")["rdma_agents"] == 1
    unregister(proc, people["alice"], json.loads(mine.body))
