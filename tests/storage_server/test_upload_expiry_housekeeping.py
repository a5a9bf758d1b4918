"""The storage server's housekeeping aborts an abandoned multipart upload (issue 23 item 6)."""

from __future__ import annotations

import time

from support import boto_client, serving


def test_an_abandoned_upload_is_aborted_by_housekeeping(tmp_path):
    with serving(tmp_path, abort_incomplete_uploads_s=1, housekeeping_s=0.2) as (proc, tenant, _):
        s3 = boto_client(proc.endpoint, tenant)
        s3.create_bucket(Bucket="abandoned")
        up = s3.create_multipart_upload(Bucket="abandoned", Key="cut-by-ctrl-c")
        s3.upload_part(Bucket="abandoned", Key="cut-by-ctrl-c", UploadId=up["UploadId"], PartNumber=1, Body=b"x" * 1024)
        deadline = time.monotonic() + 30
        while s3.list_multipart_uploads(Bucket="abandoned").get("Uploads") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not s3.list_multipart_uploads(Bucket="abandoned").get("Uploads")
        err = None
        try:
            s3.list_parts(Bucket="abandoned", Key="cut-by-ctrl-c", UploadId=up["UploadId"])
        except s3.exceptions.NoSuchUpload as e:
            err = e
        assert err is not None
