"""botocore's exceptions as the SDK's own: plain S3 calls go through aiobotocore, yet the SDK
promises only ``ObjectCacheError``, naming what went wrong (a key that signs wrong, a gateway
nobody answers at)."""

from __future__ import annotations

import aiohttp
from botocore.exceptions import BotoCoreError, ClientError, ConnectionError, HTTPClientError

from protocol.errors import ErrorCode, S3Error

# What a bodiless answer (HEAD) means when its status is all there is.
_BY_STATUS = {400: ErrorCode.InvalidRequest, 403: ErrorCode.AccessDenied,
              404: ErrorCode.NoSuchBucket, 409: ErrorCode.BucketAlreadyExists, 503: ErrorCode.ServiceUnavailable}
_HINTS = {
    ErrorCode.SignatureDoesNotMatch: "the secret key does not match the access key (check both)",
    ErrorCode.InvalidAccessKeyId: "the gateway knows no tenant with this access key",
    ErrorCode.RequestTimeTooSkewed: "this host's clock is too far from the gateway's",
}


def client_error_code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def from_botocore(endpoint: str, what: str, e: BaseException) -> S3Error:
    """``e`` (raised by an aiobotocore call) as an ``ObjectCacheError`` saying what failed and why."""
    if isinstance(e, ClientError):
        err = e.response.get("Error", {})
        status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        code = ErrorCode.__members__.get(str(err.get("Code", ""))) or _BY_STATUS.get(status, ErrorCode.InternalError)
        detail = err.get("Message") or f"HTTP {status}"
        hint = _HINTS.get(code)
        return S3Error(code, f"{what}: {detail}" + (f" ({hint})" if hint else ""))
    if isinstance(e, (ConnectionError, HTTPClientError, aiohttp.ClientError, OSError)):
        return S3Error(ErrorCode.ServiceUnavailable, f"{what}: the gateway at {endpoint} is unreachable ({type(e).__name__}: {e})")
    if isinstance(e, BotoCoreError):
        return S3Error(ErrorCode.InvalidRequest, f"{what}: {type(e).__name__}: {e}")
    raise TypeError(f"not a botocore error: {e!r}")


S3_CALL_ERRORS = (BotoCoreError, ClientError, aiohttp.ClientError, OSError)
