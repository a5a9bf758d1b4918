"""Delivery transports: ``shm`` and ``http`` here, ``rdma`` reserved (see rdma.py)."""

from .base import FrameSink, Transport
from .http import HttpTransport
from .shm import ShmTransport

__all__ = ["FrameSink", "HttpTransport", "ShmTransport", "Transport"]
