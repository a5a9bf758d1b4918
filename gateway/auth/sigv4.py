"""AWS Signature Version 4 verification (headers and presigned URLs).

The canonical request is rebuilt from what arrived on the wire: the path is
decoded and re-encoded with S3's rules (S3 does not double-encode), query
parameters are decoded, encoded again and sorted, and signed headers are
trimmed and joined. Only the HMAC chain depends on the secret.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from calendar import timegm
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from urllib.parse import quote, unquote

from multidict import CIMultiDictProxy

from protocol.errors import ErrorCode, S3Error

from . import dates, sigv2

ALGORITHM = "AWS4-HMAC-SHA256"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
MAX_PRESIGN_EXPIRES = 7 * 24 * 3600
_SPACES = re.compile(r"\s+")
_AUTH_RE = re.compile(
    r"AWS4-HMAC-SHA256\s+Credential=(?P<cred>[^,\s]+)\s*,\s*SignedHeaders=(?P<signed>[^,\s]+)\s*,\s*Signature=(?P<sig>[0-9a-f]{64})\s*$"
)


class PayloadMode(Enum):
    """How the request body is protected (value of ``x-amz-content-sha256``)."""

    SIGNED = "signed"  # hex SHA-256 of the whole body
    UNSIGNED = "UNSIGNED-PAYLOAD"
    STREAMING_SIGNED = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
    STREAMING_SIGNED_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
    STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"

    @property
    def is_streaming(self) -> bool:
        return self.value.startswith("STREAMING-")


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str
    tenant: str
    owner: str = ""  # the tenant's owner id (protocol.config.Tenant.owner_id): what bucket records name


@dataclass(frozen=True)
class AuthResult:
    """Who signed the request, and what the body decoder needs to keep verifying."""

    tenant: str
    access_key: str
    payload_mode: PayloadMode
    payload_sha256: str | None  # for SIGNED
    signing_key: bytes
    seed_signature: str
    amz_date: str
    scope: str
    owner: str = ""  # the tenant's owner id, as bucket records name it


# An unsigned request: it names no tenant, so it may read only what an object's canned ACL makes public.
ANONYMOUS = AuthResult("", "", PayloadMode.UNSIGNED, None, b"", "", "", "")


def carries_credentials(headers: Mapping[str, str], raw_query: str) -> bool:
    """Whether a request tries to authenticate (header or presigned URL, either signature version)."""
    if "Authorization" in headers:
        return True
    return bool(_query_names(raw_query) & (PRESIGN_V4_PARAMS | {"Signature", "AWSAccessKeyId"}))


# A query naming any of these is a SigV4 presigned request, complete or not: one missing the others is
# malformed (400 AuthorizationQueryParametersError, as S3 answers), never an anonymous request.
PRESIGN_V4_PARAMS = frozenset({"X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires", "X-Amz-SignedHeaders", "X-Amz-Signature"})


def _query_names(raw_query: str) -> set[str]:
    return {item.partition("=")[0] for item in raw_query.split("&")}


def uri_encode(s: str, safe: str = "-_.~") -> str:
    return quote(s, safe=safe)


@lru_cache(maxsize=1024)
def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    k = hmac.new(("AWS4" + secret).encode(), date.encode(), hashlib.sha256).digest()
    for part in (region, service, "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    return k


def hmac_hex(key: bytes, msg: str) -> str:
    return hmac.new(key, msg.encode(), hashlib.sha256).hexdigest()


def parse_query(raw_query: str) -> list[tuple[str, str]]:
    """Decode ``a=1&b`` into pairs, keeping order and blanks (``+`` is literal in S3)."""
    pairs = []
    for item in raw_query.split("&"):
        if not item:
            continue
        k, _, v = item.partition("=")
        try:
            pairs.append((unquote(k, errors="strict"), unquote(v, errors="strict")))
        except UnicodeDecodeError:
            raise S3Error(ErrorCode.InvalidURI, f"The query parameter {k[:40]!r} is not valid UTF-8 once percent-decoded.") from None
    return pairs


def canonical_query(pairs: list[tuple[str, str]], exclude: str | None = None) -> str:
    enc = sorted((uri_encode(k), uri_encode(v)) for k, v in pairs if k != exclude)
    return "&".join(f"{k}={v}" for k, v in enc)


def header_text(value: str) -> str:
    """A header value as the text its client signed: aiohttp decodes header bytes as UTF-8 with surrogate
    escapes for bytes that are not UTF-8 (a client that sent Latin-1); those are read as Latin-1 instead."""
    raw = value.encode("utf-8", "surrogateescape")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def canonical_headers(headers: CIMultiDictProxy[str] | Mapping[str, str], signed: list[str]) -> str:
    lines = []
    for name in signed:
        values = headers.getall(name, []) if hasattr(headers, "getall") else [headers.get(name, "")]
        if not values:
            raise S3Error(ErrorCode.AccessDenied, f"Header {name!r} is signed but missing from the request.")
        lines.append(f"{name}:{','.join(_SPACES.sub(' ', header_text(v).strip()) for v in values)}\n")
    return "".join(lines)


def string_to_sign(amz_date: str, scope: str, canonical_request: str) -> str:
    return "\n".join([ALGORITHM, amz_date, scope, hashlib.sha256(canonical_request.encode()).hexdigest()])


def parse_amz_date(s: str) -> float:
    try:
        return float(timegm(time.strptime(s, dates.AMZ_FORMAT)))
    except ValueError:
        raise S3Error(ErrorCode.AccessDenied, f"Invalid X-Amz-Date {s!r}; expected format YYYYMMDD'T'HHMMSS'Z'.") from None


def _parse_scope(credential: str, amz_date: str, error: ErrorCode) -> tuple[str, str, str, str]:
    parts = credential.split("/")
    if len(parts) != 5 or parts[4] != "aws4_request":
        raise S3Error(error, f"Credential {credential!r} is not of the form AK/date/region/s3/aws4_request.")
    access_key, date, region, service, _ = parts
    if service != "s3":
        raise S3Error(error, f"Credential should be scoped to the 's3' service, not {service!r}.")
    if date != amz_date[:8]:
        raise S3Error(error, f"Credential date {date!r} does not match X-Amz-Date {amz_date[:8]!r}.")
    return access_key, date, region, "/".join(parts[1:])


class RequestVerifier:
    """Authenticates requests (SigV4, and SigV2 for legacy presigned URLs) against a credentials lookup."""

    def __init__(self, lookup, max_skew_s: float = 900.0, clock=time.time) -> None:
        self._lookup = lookup  # access_key -> Credentials | None
        self.max_skew_s = max_skew_s
        self._clock = clock

    def _credentials(self, access_key: str) -> Credentials:
        creds = self._lookup(access_key)
        if creds is None:
            raise S3Error(ErrorCode.InvalidAccessKeyId, extra={"AWSAccessKeyId": access_key})
        return creds

    def verify(self, method: str, raw_path: str, raw_query: str, headers: CIMultiDictProxy[str], v2_resource: str | None = None) -> AuthResult:
        """``v2_resource``: the path-style resource (``/bucket/key``) that SigV2 signs."""
        auth = headers.get("Authorization")
        if auth is not None:
            if auth.startswith("AWS "):
                return self._verify_v2(method, raw_query, headers, v2_resource or raw_path, auth[4:], None)
            return self._verify_header(method, raw_path, raw_query, headers, auth)
        if _query_names(raw_query) & PRESIGN_V4_PARAMS:
            return self._verify_presigned(method, raw_path, raw_query, headers)
        if "Signature=" in raw_query and "AWSAccessKeyId=" in raw_query:
            q = dict(parse_query(raw_query))
            cred = f"{q.get('AWSAccessKeyId', '')}:{q.get('Signature', '')}"
            return self._verify_v2(method, raw_query, headers, v2_resource or raw_path, cred, q.get("Expires", ""))
        raise S3Error(ErrorCode.AccessDenied, "Anonymous access is not allowed; sign the request with SigV4.")

    def _verify_v2(self, method, raw_query, headers, resource_path: str, credential: str, expires: str | None) -> AuthResult:
        access_key, _, sig = credential.partition(":")
        creds = self._credentials(access_key)
        now = self._clock()
        if expires is None:
            ts, date_lines = sigv2.request_time(headers)
            if abs(now - ts) > self.max_skew_s:
                raise S3Error(ErrorCode.RequestTimeTooSkewed)
        else:
            if not expires.isdigit():
                raise S3Error(ErrorCode.AccessDenied, "Expires must be an integer (seconds since the epoch).")
            if now > int(expires):
                raise S3Error(ErrorCode.AccessDenied, "Request has expired", extra={"Expires": expires})
            date_lines = (expires,)
        resource = sigv2.canonical_resource(resource_path, parse_query(raw_query))
        expected = (sigv2.signature(creds.secret_key, sigv2.string_to_sign(method, headers, line, resource)) for line in date_lines)
        if not any(hmac.compare_digest(e, sig) for e in expected):
            raise S3Error(ErrorCode.SignatureDoesNotMatch, extra={"AWSAccessKeyId": access_key})
        return AuthResult(creds.tenant, access_key, PayloadMode.UNSIGNED, None, b"", "", "", "", creds.owner)

    @staticmethod
    def _canonical_uri(raw_path: str) -> str:
        return uri_encode(unquote(raw_path), safe="/-_.~")

    def _verify_header(self, method, raw_path, raw_query, headers, auth: str) -> AuthResult:
        m = _AUTH_RE.match(auth.strip())
        if m is None:
            raise S3Error(ErrorCode.AuthorizationHeaderMalformed, f"The authorization header is malformed: {auth[:120]!r}")
        # X-Amz-Date, else Date (botocore signs with Date alone when the request has one), in either form.
        raw_date = headers.get("x-amz-date") or headers.get("Date") or ""
        if not raw_date:
            raise S3Error(ErrorCode.AccessDenied, "AWS authentication requires a valid Date or x-amz-date header")
        request_time = dates.parse(raw_date)
        if request_time is None:
            raise S3Error(ErrorCode.AccessDenied, f"Invalid date {raw_date[:40]!r}: expected YYYYMMDD'T'HHMMSS'Z' or an HTTP date (RFC 1123).")
        amz_date = dates.amz(request_time)
        access_key, date, region, scope = _parse_scope(m["cred"], amz_date, ErrorCode.AuthorizationHeaderMalformed)
        creds = self._credentials(access_key)
        if abs(self._clock() - request_time) > self.max_skew_s:
            raise S3Error(
                ErrorCode.RequestTimeTooSkewed,
                extra={"RequestTime": amz_date, "ServerTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._clock()))},
            )
        content_sha = headers.get("x-amz-content-sha256")
        if content_sha is None:
            raise S3Error(ErrorCode.InvalidRequest, "Missing required header for this request: x-amz-content-sha256")
        mode, payload_hash = _payload_mode(content_sha)
        signed = m["signed"].split(";")
        if "host" not in signed:
            raise S3Error(ErrorCode.AccessDenied, "The host header must be signed.")
        creq = "\n".join(
            [method, self._canonical_uri(raw_path), canonical_query(parse_query(raw_query)),
             canonical_headers(headers, signed), m["signed"], content_sha]
        )
        return _signed_by(creds, access_key, date, region, scope, amz_date, creq, m["sig"], mode, payload_hash)

    def _verify_presigned(self, method, raw_path, raw_query, headers) -> AuthResult:
        pairs = parse_query(raw_query)
        q = dict(pairs)
        missing = [p for p in ("X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires", "X-Amz-SignedHeaders", "X-Amz-Signature") if p not in q]
        if missing:
            raise S3Error(ErrorCode.AuthorizationQueryParametersError, f"Query-string authentication requires {', '.join(missing)}.")
        if q["X-Amz-Algorithm"] != ALGORITHM:
            raise S3Error(ErrorCode.AuthorizationQueryParametersError, "X-Amz-Algorithm only supports \"AWS4-HMAC-SHA256\"")
        amz_date = q["X-Amz-Date"]
        access_key, date, region, scope = _parse_scope(q["X-Amz-Credential"], amz_date, ErrorCode.AuthorizationQueryParametersError)
        creds = self._credentials(access_key)
        try:
            expires = int(q["X-Amz-Expires"])
        except ValueError:
            raise S3Error(ErrorCode.AuthorizationQueryParametersError, "X-Amz-Expires should be a number") from None
        if not 0 <= expires <= MAX_PRESIGN_EXPIRES:
            # 403, as S3 and Ceph RGW answer: a URL that can never be valid is refused like an expired one.
            raise S3Error(ErrorCode.AccessDenied, f"X-Amz-Expires must be between 0 and {MAX_PRESIGN_EXPIRES} seconds", extra={"X-Amz-Expires": str(expires)})
        request_time = parse_amz_date(amz_date)
        now = self._clock()
        if now > request_time + expires:
            raise S3Error(ErrorCode.AccessDenied, "Request has expired", extra={"X-Amz-Expires": str(expires)})
        if request_time - now > self.max_skew_s:
            raise S3Error(ErrorCode.AccessDenied, "Request is not valid yet")
        signed = q["X-Amz-SignedHeaders"].split(";")
        content_sha = q.get("X-Amz-Content-Sha256") or headers.get("x-amz-content-sha256") or PayloadMode.UNSIGNED.value
        mode, payload_hash = _payload_mode(content_sha)
        creq = "\n".join(
            [method, self._canonical_uri(raw_path), canonical_query(pairs, exclude="X-Amz-Signature"),
             canonical_headers(headers, signed), q["X-Amz-SignedHeaders"], content_sha]
        )
        return _signed_by(creds, access_key, date, region, scope, amz_date, creq, q["X-Amz-Signature"], mode, payload_hash)


def _signed_by(creds: Credentials, access_key: str, date: str, region: str, scope: str, amz_date: str, creq: str, given: str,
               mode: PayloadMode, payload_hash: str | None) -> AuthResult:
    """The request as authenticated, if ``given`` is the signature the tenant's secret gives its canonical request."""
    key = signing_key(creds.secret_key, date, region, "s3")
    if not hmac.compare_digest(hmac_hex(key, string_to_sign(amz_date, scope, creq)), given):
        raise S3Error(ErrorCode.SignatureDoesNotMatch, extra={"AWSAccessKeyId": access_key})
    return AuthResult(creds.tenant, access_key, mode, payload_hash, key, given, amz_date, scope, creds.owner)


def _payload_mode(content_sha: str) -> tuple[PayloadMode, str | None]:
    if re.fullmatch(r"[0-9a-f]{64}", content_sha):
        return PayloadMode.SIGNED, content_sha
    try:
        return PayloadMode(content_sha), None
    except ValueError:
        raise S3Error(ErrorCode.InvalidArgument, f"x-amz-content-sha256 must be a SHA-256 hex digest or a known streaming mode, not {content_sha[:80]!r}") from None
