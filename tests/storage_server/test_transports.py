"""The transport registry: one transport class per descriptor transport kind."""

from __future__ import annotations

import pytest

from protocol.errors import ErrorCode, S3Error
from protocol.wire import Descriptor, Target, TransportKind
from storage_server.regions import RegionRegistry
from storage_server.transports import TRANSPORTS, HttpTransport, OpenRequest, open_transport


class NoFrames:
    """Opening a transport never sends a frame."""


def request(kind: TransportKind) -> OpenRequest:
    d = Descriptor(["k"], 2, 16, 64, Target(kind, length=128))
    return OpenRequest(d, "tenant", NoFrames(), RegionRegistry())  # type: ignore[arg-type]


def test_every_transport_kind_has_a_transport():
    assert set(TRANSPORTS) == set(TransportKind)


def test_http_stages_in_the_server_and_shm_does_not():
    assert TRANSPORTS[TransportKind.HTTP].staging.in_server
    assert not TRANSPORTS[TransportKind.SHM].staging.in_server


def test_http_opens_without_a_capability():
    t = open_transport(request(TransportKind.HTTP))
    assert isinstance(t, HttpTransport) and t.layer_bytes == 64 and t.num_layers == 2


def test_shm_refuses_a_region_nobody_registered():
    with pytest.raises(S3Error) as e:
        open_transport(request(TransportKind.SHM))
    assert e.value.code == ErrorCode.KVNoSuchRegion


def test_rdma_refuses_a_region_nobody_registered():
    with pytest.raises(S3Error) as e:
        open_transport(request(TransportKind.RDMA))
    assert e.value.code == ErrorCode.KVNoSuchRegion
