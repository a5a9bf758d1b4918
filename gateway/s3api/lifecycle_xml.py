"""A ``LifecycleConfiguration`` document as :class:`~storage_server.store.LifecycleRule` records, and back.

Only ``AbortIncompleteMultipartUpload`` is applied, so a rule with any other action (``Expiration``,
``Transition``, ``NoncurrentVersion*``, ``ExpiredObjectDeleteMarker``) or filter (``Tag``, ``And``,
object sizes) is 501 NotImplemented naming that element, rather than accepted and silently not
applied. Malformed documents are MalformedXML, bad values InvalidArgument naming the field, as S3
answers them.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from protocol.errors import ErrorCode, S3Error
from storage_server.store import LifecycleRule
from storage_server.store.lifecycle import MAX_RULES

from . import xml

_RULE_ELEMENTS = {"ID", "Filter", "Prefix", "Status", "AbortIncompleteMultipartUpload"}
_NOT_APPLIED = ("Expiration", "Transition", "NoncurrentVersionExpiration", "NoncurrentVersionTransition")


def _local(el: ET.Element) -> str:
    return el.tag.rsplit("}", 1)[-1]


def _not_implemented(element: str) -> S3Error:
    return S3Error(ErrorCode.NotImplemented, f"Lifecycle rules with <{element}> are not implemented: ObjectCache applies only "
                   "<AbortIncompleteMultipartUpload>.", extra={"Element": element})


def _invalid(field: str, why: str) -> S3Error:
    return S3Error(ErrorCode.InvalidArgument, why, extra={"ArgumentName": field})


def _prefix(rule: ET.Element) -> tuple[str, bool]:
    """The rule's key prefix and whether it came as the bare (older) <Prefix> element."""
    filters, bare = xml.children(rule, "Filter"), xml.child_text(rule, "Prefix")
    if filters and bare is not None:
        raise S3Error(ErrorCode.MalformedXML, "A rule has <Filter> or <Prefix>, not both.")
    if not filters:
        return bare or "", bare is not None
    inner = list(filters[0])
    for el in inner:
        if _local(el) != "Prefix":
            raise _not_implemented(f"Filter/{_local(el)}")
    return (xml.child_text(filters[0], "Prefix") or ""), False


def parse_lifecycle(body: bytes) -> tuple[LifecycleRule, ...]:
    doc = xml.parse(body, "LifecycleConfiguration")
    rules_el = xml.children(doc, "Rule")
    if not rules_el:
        raise S3Error(ErrorCode.MalformedXML, "A lifecycle configuration needs at least one <Rule>.")
    if len(rules_el) > MAX_RULES:
        raise _invalid("Rule", f"At most {MAX_RULES} rules are allowed in one lifecycle configuration.")
    rules: list[LifecycleRule] = []
    for n, rule in enumerate(rules_el, 1):
        names = {_local(el) for el in rule}
        for element in _NOT_APPLIED + ("ExpiredObjectDeleteMarker",):
            if element in names:
                raise _not_implemented(element)
        unknown = sorted(names - _RULE_ELEMENTS)
        if unknown:
            raise S3Error(ErrorCode.MalformedXML, f"Rule {n}: unknown element <{unknown[0]}>.")
        rule_id = xml.child_text(rule, "ID") or f"rule-{n}"
        if len(rule_id) > 255:
            raise _invalid("ID", "A rule's ID is at most 255 characters.")
        status = xml.child_text(rule, "Status")
        if status not in ("Enabled", "Disabled"):
            raise S3Error(ErrorCode.MalformedXML, f"Rule {rule_id!r}: <Status> must be Enabled or Disabled.")
        aborts = xml.children(rule, "AbortIncompleteMultipartUpload")
        if not aborts:
            raise S3Error(ErrorCode.MalformedXML, f"Rule {rule_id!r}: at least one action needs to be specified in a rule.")
        days_text = xml.child_text(aborts[0], "DaysAfterInitiation")
        if days_text is None:
            raise S3Error(ErrorCode.MalformedXML, f"Rule {rule_id!r}: <AbortIncompleteMultipartUpload> needs <DaysAfterInitiation>.")
        try:
            days = int(days_text)
        except ValueError:
            raise _invalid("DaysAfterInitiation", f"Rule {rule_id!r}: DaysAfterInitiation must be a whole number of days.") from None
        if days <= 0:
            raise _invalid("DaysAfterInitiation", f"Rule {rule_id!r}: DaysAfterInitiation must be a positive integer.")
        prefix, legacy = _prefix(rule)
        rules.append(LifecycleRule(rule_id, prefix, status == "Enabled", days, legacy))
    ids = [r.id for r in rules]
    if len(set(ids)) != len(ids):
        raise _invalid("ID", "Rule IDs must be unique within a lifecycle configuration.")
    return tuple(rules)


def lifecycle_nodes(rules: tuple[LifecycleRule, ...]) -> list[xml.Node]:
    out: list[xml.Node] = []
    for r in rules:
        where: xml.Node = ("Prefix", r.prefix) if r.legacy_prefix else ("Filter", [("Prefix", r.prefix)])
        out.append(("Rule", [("ID", r.id), where, ("Status", "Enabled" if r.enabled else "Disabled"),
                             ("AbortIncompleteMultipartUpload", [("DaysAfterInitiation", r.abort_after_days)])]))
    return out
