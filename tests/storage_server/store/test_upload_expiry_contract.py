"""Abandoned multipart uploads are aborted by housekeeping on every backend (issue 23 item 6, issue 22 item 15)."""

from __future__ import annotations

import time

from storesupport import body, code_of

from protocol.errors import ErrorCode
from storage_server.store import PutSpec, UploadInfo
from storage_server.upload_expiry import UploadSweep, abort_expired, expired, sweep_interval

SPEC = PutSpec()


def _upload(initiated: float) -> UploadInfo:
    return UploadInfo(f"u{initiated}", "b", "k", initiated, "alice", SPEC)


def test_only_uploads_older_than_the_expiry_are_chosen_and_zero_means_never():
    uploads = [_upload(100.0), _upload(150.0), _upload(199.0)]
    assert [u.initiated for u in expired(uploads, now=200.0, after_s=60)] == [100.0]
    assert [u.initiated for u in expired(uploads, now=200.0, after_s=0.5)] == [100.0, 150.0, 199.0]
    assert expired(uploads, now=1e12, after_s=0) == []
    assert sweep_interval(7 * 86400, 10) == 3600 and sweep_interval(1, 0.2) == 0.25 and sweep_interval(0.1, 10) == 10


def test_expired_uploads_of_every_bucket_and_owner_are_aborted_and_nothing_else(opened):
    async def scenario(store, _):
        await store.create_bucket("exp-a", "alice", "us-east-1")
        await store.create_bucket("exp-b", "bob", "us-east-1")
        assert {"exp-a", "exp-b"} <= set(await store.bucket_names())
        await store.put_object("exp-a", "plain", body(b"kept"), SPEC, "alice")
        ua = await store.create_upload("exp-a", "cut/off", SPEC, "alice")
        await store.upload_part(ua, 1, body(b"p" * 1000), SPEC)
        ub = await store.create_upload("exp-b", "other", SPEC, "bob")
        # Not yet expired: a day's expiry keeps uploads begun just now.
        assert await abort_expired(store, time.time(), 86400) == 0
        assert len(await store.list_uploads("exp-a")) == 1 and len(await store.list_uploads("exp-b")) == 1
        # An hour later with a 10-minute expiry both are aborted, whoever owns them.
        assert await abort_expired(store, time.time() + 3600, 600) == 2
        assert await store.list_uploads("exp-a") == [] and await store.list_uploads("exp-b") == []
        assert await code_of(store.get_upload("exp-a", "cut/off", ua.upload_id)) == ErrorCode.NoSuchUpload
        assert await code_of(store.get_upload("exp-b", "other", ub.upload_id)) == ErrorCode.NoSuchUpload
        assert (await store.head_object("exp-a", "plain")).size == 4
        # The sweep runs at most once per interval.
        clock = [time.time() + 7200]
        sweep = UploadSweep(store, 600, 10, clock=lambda: clock[0])
        await store.create_upload("exp-a", "again", SPEC, "alice")
        assert await sweep.maybe_run() == 1
        await store.create_upload("exp-a", "again2", SPEC, "alice")
        assert await sweep.maybe_run() == 0  # within its interval
        clock[0] += sweep.interval
        assert await sweep.maybe_run() == 1

    opened(scenario)
