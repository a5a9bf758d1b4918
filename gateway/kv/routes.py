"""The KV extensions' route rows, declared beside the S3 table and combined with it by the router.

Each KV operation is selected by its sub-resource (:class:`protocol.kv_http.KVOp`).
"""

from __future__ import annotations

from protocol.kv_http import KVOp

from ..s3api.router import Level, Route
from . import handlers

ROUTES: tuple[Route, ...] = (
    Route("POST", Level.BUCKET, "KVLookup", handlers.kv_lookup, query=(KVOp.LOOKUP,)),
    Route("POST", Level.BUCKET, "KVPut", handlers.kv_put, query=(KVOp.PUT,)),
    Route("POST", Level.BUCKET, "KVGet", handlers.kv_get, query=(KVOp.GET,)),
    Route("POST", Level.BUCKET, "KVEstimate", handlers.kv_estimate, query=(KVOp.ESTIMATE,)),
    Route("POST", Level.BUCKET, "KVSession", handlers.kv_session, query=(KVOp.SESSION,)),
    Route("POST", Level.SERVICE, "KVRegister", handlers.kv_register, query=(KVOp.REGISTER,)),
    Route("POST", Level.SERVICE, "KVUnregister", handlers.kv_unregister, query=(KVOp.UNREGISTER,)),
    Route("POST", Level.SERVICE, "KVRegisterRdma", handlers.kv_register_rdma, query=(KVOp.REGISTER_RDMA,)),
    Route("GET", Level.SERVICE, "KVStatus", handlers.kv_status, query=(KVOp.STATUS,)),
)
