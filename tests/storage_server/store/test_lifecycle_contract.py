"""A bucket's lifecycle rules (AbortIncompleteMultipartUpload) are kept by every backend and applied by
housekeeping's upload sweep, beside the configured expiry (issue 23 item 6)."""

from __future__ import annotations

import time

from storesupport import body, code_of

from protocol.errors import ErrorCode
from storage_server.store import LifecycleRule, PutSpec, UploadInfo, abort_after_s
from storage_server.upload_expiry import abort_expired, expired

SPEC = PutSpec()
DAY = 86400.0
RULES = (LifecycleRule("tmp", "tmp/", True, 2), LifecycleRule("off", "", False, 1))


def test_the_soonest_enabled_rule_whose_prefix_the_key_has_applies():
    assert abort_after_s("tmp/x", RULES, 0) == 2 * DAY
    assert abort_after_s("keep/x", RULES, 0) == 0  # the matching rule is disabled, the expiry off
    assert abort_after_s("keep/x", RULES, 7 * DAY) == 7 * DAY
    assert abort_after_s("tmp/x", RULES, 3600) == 3600  # the configured expiry comes first
    u = [UploadInfo("a", "b", "tmp/x", 0.0, "o", SPEC), UploadInfo("c", "b", "keep/y", 0.0, "o", SPEC)]
    assert [x.key for x in expired(u, now=3 * DAY, after_s=0, rules=RULES)] == ["tmp/x"]
    assert expired(u, now=1 * DAY, after_s=0, rules=RULES) == []


def test_rules_are_kept_with_the_bucket_and_the_sweep_applies_them(opened):
    async def scenario(store, _):
        await store.create_bucket("lc-bucket", "alice", "us-east-1")
        assert (await store.get_bucket("lc-bucket")).lifecycle == ()
        await store.set_bucket_lifecycle("lc-bucket", RULES)
        assert (await store.get_bucket("lc-bucket")).lifecycle == RULES
        doomed = await store.create_upload("lc-bucket", "tmp/cut-off", SPEC, "alice")
        await store.upload_part(doomed, 1, body(b"p" * 100), SPEC)
        kept = await store.create_upload("lc-bucket", "keep/it", SPEC, "alice")
        # A day on: nothing is due; three days on, only the upload under tmp/ (the expiry itself is off).
        assert await abort_expired(store, time.time() + DAY, 0) == 0
        assert await abort_expired(store, time.time() + 3 * DAY, 0) == 1
        assert await code_of(store.get_upload("lc-bucket", "tmp/cut-off", doomed.upload_id)) == ErrorCode.NoSuchUpload
        assert [u.upload_id for u in await store.list_uploads("lc-bucket")] == [kept.upload_id]
        await store.set_bucket_lifecycle("lc-bucket", ())
        assert (await store.get_bucket("lc-bucket")).lifecycle == ()
        assert await abort_expired(store, time.time() + 30 * DAY, 0) == 0

    opened(scenario)
