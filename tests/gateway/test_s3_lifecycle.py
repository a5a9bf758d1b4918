"""Bucket lifecycle configuration, the AbortIncompleteMultipartUpload subset (issue 23 item 6): stored per
bucket, read back as sent, deleted; every other rule type is 501 naming its element."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from gateway.s3api.lifecycle_xml import parse_lifecycle
from protocol.errors import ErrorCode, S3Error

RULES = [
    {"ID": "abandoned", "Filter": {"Prefix": "uploads/"}, "Status": "Enabled", "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 3}},
    {"ID": "everything", "Filter": {"Prefix": ""}, "Status": "Disabled", "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 30}},
]


def _error(e: pytest.ExceptionInfo) -> tuple[str, str]:
    return e.value.response["Error"]["Code"], e.value.response["Error"].get("Message", "")


def test_a_configuration_round_trips_and_is_deleted(s3, bucket):
    with pytest.raises(ClientError) as e:
        s3.get_bucket_lifecycle_configuration(Bucket=bucket)
    assert _error(e)[0] == "NoSuchLifecycleConfiguration"
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": RULES})
    assert s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"] == RULES
    s3.delete_bucket_lifecycle(Bucket=bucket)
    with pytest.raises(ClientError) as e:
        s3.get_bucket_lifecycle_configuration(Bucket=bucket)
    assert _error(e)[0] == "NoSuchLifecycleConfiguration"


@pytest.mark.parametrize(("rule", "element"), [
    ({"Expiration": {"Days": 1}}, "Expiration"),
    ({"Transitions": [{"Days": 1, "StorageClass": "GLACIER"}]}, "Transition"),
    ({"NoncurrentVersionExpiration": {"NoncurrentDays": 1}}, "NoncurrentVersionExpiration"),
    ({"Filter": {"Tag": {"Key": "k", "Value": "v"}}, "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}}, "Filter/Tag"),
    ({"Filter": {"ObjectSizeGreaterThan": 10}, "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}}, "Filter/ObjectSizeGreaterThan"),
])
def test_other_rule_types_are_not_implemented_naming_the_element(s3, bucket, rule, element):
    with pytest.raises(ClientError) as e:
        s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": [{"ID": "r", "Status": "Enabled", "Filter": {"Prefix": ""}, **rule}]})
    code, message = _error(e)
    assert code == "NotImplemented" and f"<{element}>" in message
    with pytest.raises(ClientError):
        s3.get_bucket_lifecycle_configuration(Bucket=bucket)  # nothing was stored


def test_another_tenant_may_not_read_or_set_it(s3, s3_bob, bucket):
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": RULES[:1]})
    for call in (lambda: s3_bob.get_bucket_lifecycle_configuration(Bucket=bucket),
                 lambda: s3_bob.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": RULES[1:]}),
                 lambda: s3_bob.delete_bucket_lifecycle(Bucket=bucket)):
        with pytest.raises(ClientError) as e:
            call()
        assert _error(e)[0] == "AccessDenied"
    assert s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"] == RULES[:1]


def _doc(rule: str) -> bytes:
    return f'<LifecycleConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Rule>{rule}</Rule></LifecycleConfiguration>'.encode()


def test_the_older_bare_prefix_form_is_kept_as_such():
    (rule,) = parse_lifecycle(_doc("<ID>x</ID><Prefix>a/</Prefix><Status>Enabled</Status>"
                                   "<AbortIncompleteMultipartUpload><DaysAfterInitiation>2</DaysAfterInitiation></AbortIncompleteMultipartUpload>"))
    assert (rule.id, rule.prefix, rule.enabled, rule.abort_after_days, rule.legacy_prefix) == ("x", "a/", True, 2, True)


@pytest.mark.parametrize(("rule", "code", "field"), [
    ("<ID>x</ID><Status>Enabled</Status>", ErrorCode.MalformedXML, None),  # no action
    ("<ID>x</ID><Status>On</Status><AbortIncompleteMultipartUpload><DaysAfterInitiation>1</DaysAfterInitiation></AbortIncompleteMultipartUpload>",
     ErrorCode.MalformedXML, None),
    ("<ID>x</ID><Status>Enabled</Status><AbortIncompleteMultipartUpload><DaysAfterInitiation>0</DaysAfterInitiation></AbortIncompleteMultipartUpload>",
     ErrorCode.InvalidArgument, "DaysAfterInitiation"),
    ("<ID>x</ID><Status>Enabled</Status><AbortIncompleteMultipartUpload><DaysAfterInitiation>1.5</DaysAfterInitiation></AbortIncompleteMultipartUpload>",
     ErrorCode.InvalidArgument, "DaysAfterInitiation"),
    ("<ID>x</ID><Status>Enabled</Status><Prefix>a</Prefix><Filter><Prefix>b</Prefix></Filter>"
     "<AbortIncompleteMultipartUpload><DaysAfterInitiation>1</DaysAfterInitiation></AbortIncompleteMultipartUpload>", ErrorCode.MalformedXML, None),
])
def test_bad_rules_are_refused_as_s3_refuses_them(rule, code, field):
    with pytest.raises(S3Error) as e:
        parse_lifecycle(_doc(rule))
    assert e.value.code is code and (field is None or e.value.extra.get("ArgumentName") == field)
