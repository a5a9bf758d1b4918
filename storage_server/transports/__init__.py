"""Delivery transports, one registry keyed by the descriptor's transport kind."""

from protocol.wire import TransportKind

from .base import FrameSink, OpenRequest, Transport
from .http import HttpTransport
from .rdma import RdmaTransport
from .shm import ShmTransport

TRANSPORTS: dict[TransportKind, type[Transport]] = {
    TransportKind.HTTP: HttpTransport,
    TransportKind.SHM: ShmTransport,
    TransportKind.RDMA: RdmaTransport,
}


def transport_class(kind: TransportKind) -> type[Transport]:
    return TRANSPORTS[kind]


def open_transport(request: OpenRequest) -> Transport:
    return TRANSPORTS[request.descriptor.target.transport].open(request)


__all__ = ["FrameSink", "OpenRequest", "TRANSPORTS", "Transport", "open_transport", "transport_class"]
