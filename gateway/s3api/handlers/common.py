"""Small response helpers shared by the operation handlers."""

from __future__ import annotations

import base64

from aiohttp import web

from protocol.errors import ErrorCode, S3Error

from ..xml import Node, document

MAX_PART_NUMBER = 10000


def xml_response(root: str, children: list[Node], status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=document(root, children), content_type="application/xml", headers=headers)


def empty(status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, headers=headers)


def part_number(raw: str) -> int:
    """A ``partNumber`` parameter: an integer 1..10000 (InvalidArgument otherwise)."""
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_PART_NUMBER:
        raise S3Error(ErrorCode.InvalidArgument, f"Part number must be an integer between 1 and {MAX_PART_NUMBER}, inclusive",
                      extra={"ArgumentName": "partNumber", "ArgumentValue": raw})
    return int(raw)


def encode_token(marker: str) -> str:
    return base64.urlsafe_b64encode(marker.encode()).decode()


def decode_token(token: str) -> str:
    try:
        return base64.urlsafe_b64decode(token.encode()).decode()
    except (ValueError, UnicodeDecodeError):
        raise S3Error(ErrorCode.InvalidArgument, "The continuation token provided is incorrect", extra={"ArgumentName": "continuation-token"}) from None
