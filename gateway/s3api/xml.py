"""S3 XML documents: building responses and parsing request bodies."""

from __future__ import annotations

import re
import time
import xml.etree.ElementTree as ET
from email.utils import formatdate
from typing import Any

import defusedxml.ElementTree as defused
from defusedxml import DefusedXmlException

from protocol.errors import ErrorCode, S3Error

S3_NS = "http://s3.amazonaws.com/doc/2006-03-01/"
MAX_REQUEST_XML = 2 * 1024 * 1024

Node = tuple[str, Any] | tuple[str, Any, dict[str, str]]  # (tag, text | list[Node] | None[, attributes])


# Characters XML 1.0 cannot carry (not even as references): a key or parameter holding one could only
# produce a listing that is not well-formed.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def check_text(name: str, value: str) -> str:
    """``value`` if XML can carry it; InvalidArgument naming ``name`` if not."""
    if _NOT_XML.search(value):
        raise S3Error(ErrorCode.InvalidArgument, f"{name} contains a control character XML cannot carry.", extra={"ArgumentName": name})
    return value


def iso8601(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts * 1000) % 1000:03d}Z"


def http_date(ts: float) -> str:
    return formatdate(ts, usegmt=True)


def _fill(parent: ET.Element, children: list[Node]) -> None:
    for node in children:
        tag, value = node[0], node[1]
        if value is None:
            continue
        el = ET.SubElement(parent, tag, node[2] if len(node) > 2 else {})  # type: ignore[misc]
        if isinstance(value, list):
            _fill(el, value)
        elif isinstance(value, bool):
            el.text = "true" if value else "false"
        else:
            el.text = _NOT_XML.sub("\ufffd", str(value))  # never emit a document that is not well-formed


def _serialise(el: ET.Element) -> bytes:
    # A raw CR in text would reach the client as LF (XML end-of-line normalisation): send it as a reference,
    # so keys and echoed parameters come back exactly as sent. ElementTree already escapes CR in attributes.
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(el, encoding="utf-8").replace(b"\r", b"&#13;")


def document(root: str, children: list[Node], namespace: bool = True) -> bytes:
    """Serialise ``(tag, value)`` trees; ``None`` values are omitted."""
    el = ET.Element(root, {"xmlns": S3_NS} if namespace else {})
    _fill(el, children)
    return _serialise(el)


def text_document(root: str, text: str) -> bytes:
    el = ET.Element(root, {"xmlns": S3_NS})
    el.text = text or None
    return _serialise(el)


def error_document(err: S3Error, request_id: str) -> bytes:
    children: list[Node] = [("Code", err.code.name), ("Message", err.message)]
    children += list(err.extra.items())
    children += [("Resource", err.resource), ("RequestId", request_id)]
    return document("Error", children, namespace=False)


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def parse(body: bytes, root: str) -> ET.Element:
    """Parse a request document, checking the root element (namespace optional)."""
    if not body:
        raise S3Error(ErrorCode.MalformedXML, f"Missing <{root}> request body.")
    try:
        el = defused.fromstring(body, forbid_dtd=True)
    except ET.ParseError as e:
        raise S3Error(ErrorCode.MalformedXML, f"The XML you provided was not well-formed: {e}") from None
    except DefusedXmlException as e:  # entities, DTDs, external references: never expanded
        raise S3Error(ErrorCode.MalformedXML, f"The XML you provided uses a forbidden construct ({e.__class__.__name__}).") from None
    if _local(el.tag) != root:
        raise S3Error(ErrorCode.MalformedXML, f"Expected root element <{root}>, got <{_local(el.tag)}>.")
    return el


def children(el: ET.Element, tag: str) -> list[ET.Element]:
    return [c for c in el if _local(c.tag) == tag]


def child_text(el: ET.Element, tag: str, default: str | None = None) -> str | None:
    for c in el:
        if _local(c.tag) == tag:
            return c.text or ""
    return default
