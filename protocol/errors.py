"""The one error catalogue: every failure is a value with an S3 error code.

Backends, the gateway and the storage-server daemon all raise :class:`S3Error`;
the gateway renders it as the S3 XML error body, the daemon sends it over RPC
as ``{code, message, resource}``, and the client SDK re-raises it. HTTP status
and default message live here and nowhere else.
"""

from __future__ import annotations

import errno
import sqlite3
from dataclasses import dataclass, field
from enum import Enum


class ErrorCode(Enum):
    """S3 error codes with their HTTP status and default message."""

    def __new__(cls, status: int, message: str) -> "ErrorCode":
        obj = object.__new__(cls)
        obj._value_ = len(cls.__members__) + 1
        obj.status = status
        obj.default_message = message
        return obj

    status: int
    default_message: str

    AccessDenied = (403, "Access Denied")
    AuthorizationHeaderMalformed = (400, "The authorization header is malformed.")
    AuthorizationQueryParametersError = (400, "Error parsing the X-Amz-Credential parameter.")
    BadDigest = (400, "The Content-MD5 or checksum you specified did not match what we received.")
    BucketAlreadyExists = (409, "The requested bucket name is not available.")
    BucketAlreadyOwnedByYou = (409, "Your previous request to create the named bucket succeeded and you already own it.")
    BucketNotEmpty = (409, "The bucket you tried to delete is not empty")
    ConditionalRequestConflict = (409, "A conflicting operation occurred. If using PutObject you can retry the request. "
                                       "If using multipart upload you should initiate another CreateMultipartUpload request and re-upload each part.")
    EntityTooLarge = (400, "Your proposed upload exceeds the maximum allowed object size.")
    EntityTooSmall = (400, "Your proposed upload is smaller than the minimum allowed object size.")
    IncompleteBody = (400, "You did not provide the number of bytes specified by the Content-Length HTTP header.")
    InsufficientStorage = (507, "The store does not have enough free space for this request.")
    InternalError = (500, "We encountered an internal error. Please try again.")
    InvalidAccessKeyId = (403, "The AWS Access Key Id you provided does not exist in our records.")
    InvalidArgument = (400, "Invalid Argument")
    InvalidBucketName = (400, "The specified bucket is not valid.")
    InvalidDigest = (400, "The Content-MD5 or checksum you specified is not valid.")
    InvalidLocationConstraint = (400, "The specified location-constraint is not valid.")
    InvalidPart = (400, "One or more of the specified parts could not be found.")
    InvalidPartOrder = (400, "The list of parts was not in ascending order.")
    InvalidPartNumber = (416, "The requested partnumber is not satisfiable")
    InvalidRange = (416, "The requested range is not satisfiable")
    InvalidRequest = (400, "Invalid Request")
    InvalidStorageClass = (400, "The storage class you specified is not valid.")
    InvalidTag = (400, "The tag provided was not a valid tag.")
    InvalidURI = (400, "Couldn't parse the specified URI.")
    KeyTooLongError = (400, "Your key is too long.")
    MalformedXML = (400, "The XML you provided was not well-formed or did not validate against our published schema.")
    MetadataTooLarge = (400, "Your metadata headers exceed the maximum allowed metadata size.")
    MethodNotAllowed = (405, "The specified method is not allowed against this resource.")
    MissingContentLength = (411, "You must provide the Content-Length HTTP header.")
    NoSuchBucket = (404, "The specified bucket does not exist")
    NoSuchBucketPolicy = (404, "The bucket policy does not exist")
    NoSuchKey = (404, "The specified key does not exist.")
    NoSuchVersion = (404, "The specified version does not exist.")
    NoSuchTagSet = (404, "The TagSet does not exist.")
    NoSuchLifecycleConfiguration = (404, "The lifecycle configuration does not exist.")
    NoSuchUpload = (404, "The specified upload does not exist. The upload ID may be invalid, or the upload may have been aborted or completed.")
    NotImplemented = (501, "A header you provided implies functionality that is not implemented.")
    NotModified = (304, "Not Modified")
    PreconditionFailed = (412, "At least one of the pre-conditions you specified did not hold")
    RequestTimeout = (400, "Your socket connection to the server was not read from or written to within the timeout period.")
    RequestTimeTooSkewed = (403, "The difference between the request time and the server's time is too large.")
    ServiceUnavailable = (503, "Please reduce your request rate.")
    SignatureDoesNotMatch = (403, "The request signature we calculated does not match the signature you provided. Check your key and signing method.")
    # KV extensions (ObjectCache): each names the offending field or key.
    KVChunkSizeMismatch = (400, "A chunk object's size is not num_layers * per_layer_chunk_bytes.")
    KVCodecNotAllowed = (400, "The chunk's codec is not allowed in this bucket ([compression] configuration).")
    KVInvalidCompressedChunk = (400, "A compressed chunk object's header, offsets or lengths are inconsistent.")
    KVInvalidDescriptor = (400, "The KV descriptor is malformed.")
    KVLoadBudgetExceeded = (503, "The load cannot be in place within its load budget; the engine recomputes it.")
    KVNoSuchRegion = (404, "The registered memory region does not exist (re-register it).")
    KVTargetTooSmall = (400, "The delivery target is smaller than the payload.")
    KVTooManyKeys = (400, "The descriptor names more chunk keys than this server accepts.")
    KVUnknownKeyList = (404, "The session holds no key list by this reference (send the keys again).")
    KVUnsupportedVersion = (400, "The descriptor version is not supported by this server.")
    XAmzContentSHA256Mismatch = (400, "The provided 'x-amz-content-sha256' header does not match what was computed.")


@dataclass
class S3Error(Exception):
    """An S3-style failure. ``extra`` adds fields to the XML body (e.g. ``Key``); ``headers`` are HTTP
    headers its response carries (a 304's ``ETag`` and ``Last-Modified``). Neither crosses the RPC
    envelope but ``extra``."""

    code: ErrorCode
    message: str = ""
    resource: str = ""
    extra: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.message:
            self.message = self.code.default_message
        super().__init__(f"{self.code.name}: {self.message}")

    @property
    def status(self) -> int:
        return self.code.status

    def to_dict(self) -> dict[str, object]:
        return {"code": self.code.name, "message": self.message, "resource": self.resource, "extra": self.extra}

    @classmethod
    def from_dict(cls, d: dict) -> "S3Error":
        code = ErrorCode.__members__.get(str(d.get("code")), ErrorCode.InternalError)
        return cls(code, str(d.get("message", "")), str(d.get("resource", "")), dict(d.get("extra") or {}))


DISK_FULL = "The store's disk is full; nothing of this request was stored."
_SQLITE_FULL = 13  # the primary result code (an extended code's low byte)


def storage_full(exc: BaseException) -> S3Error | None:
    """The 507 a full disk is, or None: ENOSPC / EDQUOT from any file call, SQLITE_FULL from the index.

    Pure, so every layer that can meet a full disk (the blob writer, the index, the gateway's and the daemon's
    last-resort handlers) answers the same 507 instead of a 500 that clients would retry."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return S3Error(ErrorCode.InsufficientStorage, DISK_FULL)
    if isinstance(exc, sqlite3.OperationalError) and (
            (getattr(exc, "sqlite_errorcode", 0) & 0xFF) == _SQLITE_FULL or "database or disk is full" in str(exc)):
        return S3Error(ErrorCode.InsufficientStorage, DISK_FULL)
    return None
