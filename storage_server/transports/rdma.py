"""``rdma``: RDMA WRITE into a client memory region over an RC queue pair (pyverbs).

This is the named place for the RDMA transport; it is a separate issue. The
plan: the client registers an MR and sends (remote address, rkey) as the
capability (compatible with the ``x-amz-rdma-token`` convention); the server
posts RDMA WRITEs of each layer's slices and a WRITE_WITH_IMM whose immediate
value is the layer index as the notification.
"""

from __future__ import annotations

from ..errors import ErrorCode, S3Error


def rdma_available() -> tuple[bool, str]:
    """Whether an RDMA device can be used here, and why not."""
    try:
        import pyverbs.device as d  # type: ignore[import-not-found]
    except ImportError:
        return False, "pyverbs is not installed (pip install 'objectcache[rdma]')"
    try:
        devices = d.get_device_list()
    except Exception as e:  # pragma: no cover - depends on the host
        return False, f"cannot list RDMA devices: {e}"
    if not devices:
        return False, "no RDMA device on this host"
    return True, ""


def open_rdma_transport(*_args, **_kwargs):
    raise S3Error(ErrorCode.NotImplemented, "The rdma transport is not implemented yet; use shm or http.", extra={"Field": "target.transport"})
