"""What two ObjectCache processes must agree on, defined once.

* :mod:`protocol.errors`    — the error catalogue (S3 codes, HTTP status, messages).
* :mod:`protocol.wire`      — the binary KV wire format: descriptor, key lists, put batches, frames.
* :mod:`protocol.kv_http`   — the KV extensions' HTTP contract: operations, headers, JSON bodies.
* :mod:`protocol.rpc`       — the gateway ↔ storage-server RPC envelope and its operations.
* :mod:`protocol.shm`       — shared-memory constants of the ``shm`` transport.
* :mod:`protocol.checksums` — S3 checksum algorithms and their encodings.
* :mod:`protocol.config`    — the configuration schema every process reads.

This package imports nothing of the project, so the client SDK can use it
without importing the server.
"""
