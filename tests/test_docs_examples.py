"""The examples a first-time user copies must work: every bucket they name is a valid S3 bucket name."""

from __future__ import annotations

import re

import pytest
from support import REPO

from gateway.s3api.context import validate_bucket_name
from protocol.errors import S3Error

# Files whose examples users copy: the README, the SDK's docstring, the runnable examples.
EXAMPLE_FILES = ["README.md", "client_sdk/__init__.py", *(str(p.relative_to(REPO)) for p in (REPO / "client_sdk" / "examples").glob("*.py"))]
BUCKET_ARG = re.compile(r"""\b[Bb]ucket\s*=\s*["']([^"']*)["']|\bs3://([^/\s"'`]+)|--bucket(?:\s+|=)([A-Za-z0-9.-]+)|--bucket",\s*default=["']([^"']*)["']""")


def bucket_names(text: str) -> list[str]:
    return [next(g for g in m.groups() if g is not None) for m in BUCKET_ARG.finditer(text)]


def test_the_pattern_finds_what_it_should():
    assert bucket_names('s3.create_bucket(Bucket="kv")\nbucket="kv-cache"\naws s3 mb s3://demo\n--bucket demo') == ["kv", "kv-cache", "demo", "demo"]


@pytest.mark.parametrize("path", EXAMPLE_FILES)
def test_every_example_bucket_name_is_valid(path):
    names = bucket_names((REPO / path).read_text())
    bad = []
    for name in names:
        try:
            validate_bucket_name(name)
        except S3Error:
            bad.append(name)
    assert not bad, f"{path} names invalid S3 bucket(s) {bad}: 3-63 characters of a-z, 0-9, '.' and '-'"


def test_the_readme_examples_name_buckets_at_all():
    assert {"kv-cache", "demo"} <= set(bucket_names((REPO / "README.md").read_text()))
