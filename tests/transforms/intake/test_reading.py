"""Reading input objects: which errors are the store failing (storage_error, after the retries) and which
are refusals (unreadable); the retry configuration is what the options say. The retries themselves against a
real S3 server behind a fault injector: tests/pipelines/test_s3_faults.py. A local file is checked once it is
open: a regular file, and inside the listed folder (issue 22: a file swapped for a link after listing)."""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
)

from pipelines.config.options import PagemillOptions
from pipelines.run.settings import run_settings
from schemas.reasons import UNREADABLE
from transforms.intake.listing import list_matching, local_roots
from transforms.intake.reading import ObjectReader, ReadConfig, ReadFailed, is_storage_failure


def client_error(status: int, code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "GetObject")


@pytest.mark.parametrize(("err", "storage"), [
    (client_error(500, "InternalError"), True), (client_error(503, "SlowDown"), True),
    (client_error(400, "Throttling"), True), (client_error(429, "TooManyRequests"), True),
    (EndpointConnectionError(endpoint_url="http://x"), True), (ReadTimeoutError(endpoint_url="http://x"), True),
    (ParamValidationError(report="bad"), False),
    (client_error(404, "NoSuchKey"), False), (client_error(403, "AccessDenied"), False),
    (NoCredentialsError(), False)])
def test_store_failures_and_refusals(err: Exception, storage: bool) -> None:
    assert is_storage_failure(err) is storage


def test_retry_config_counts_every_attempt() -> None:
    retries = ReadConfig(max_attempts=3).botocore_config().retries
    assert retries == {"mode": "standard", "total_max_attempts": 3}


def test_local_file_that_vanished_is_unreadable(tmp_path: Path) -> None:
    with pytest.raises(ReadFailed) as failed:
        ObjectReader(ReadConfig()).read(str(tmp_path / "gone.pdf"), 10)
    assert failed.value.reason_code == UNREADABLE and "read failed" in str(failed.value)


def test_reader_pickles_without_its_client_or_printing_keys() -> None:
    reader = ObjectReader(ReadConfig(s3_access_key_id="AKIA-SECRET", s3_secret_access_key="shh"))
    reader._client = object()  # a live client is never shipped to another worker
    copy = pickle.loads(pickle.dumps(reader))
    assert copy._client is None and copy.cfg == reader.cfg
    assert "shh" not in repr(reader.cfg) and "AKIA-SECRET" not in repr(reader.cfg)


def test_a_file_swapped_for_an_outside_link_after_listing_is_not_read(tmp_path: Path) -> None:
    # Fails before the fix: the reader opened the path and followed the new link to the secret.
    uploads, outside = tmp_path / "uploads", tmp_path / "home"
    (uploads / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.pdf").write_bytes(b"%PDF-secret")
    (uploads / "a.pdf").write_bytes(b"%PDF-a")
    (uploads / "sub" / "b.pdf").write_bytes(b"%PDF-b")
    (uploads / "inside-link.pdf").symlink_to(uploads / "sub" / "b.pdf")  # a link within the folder: followed
    listed = {Path(o.uri).name: o for o in list_matching([str(uploads)])}
    assert set(listed) == {"a.pdf", "b.pdf", "inside-link.pdf"}
    reader = ObjectReader(ReadConfig(local_roots=local_roots([str(uploads)])))
    (uploads / "a.pdf").unlink()
    (uploads / "a.pdf").symlink_to(outside / "secret.pdf")  # the swap, after the listing
    with pytest.raises(ReadFailed) as refused:
        reader.read(listed["a.pdf"].uri, 100)
    assert refused.value.reason_code == "outside_input" and "secret" not in str(refused.value)
    assert reader.read(listed["inside-link.pdf"].uri, 100) == b"%PDF-b"
    assert reader.read(listed["b.pdf"].uri, 3) == b"%PDF"  # limit + 1, as before
    # A file named on its own is the caller's choice, link or not; and no roots: no check.
    assert ObjectReader(ReadConfig()).read(listed["a.pdf"].uri, 100) == b"%PDF-secret"


def test_a_file_swapped_for_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "a.pdf")  # opened without blocking, then refused: not a regular file
    with pytest.raises(ReadFailed, match="not a regular file"):
        ObjectReader(ReadConfig()).read(str(tmp_path / "a.pdf"), 100)


def test_the_run_reader_knows_the_listed_folders(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    link = tmp_path / "via-link"
    link.symlink_to(tmp_path / "in")
    options = PagemillOptions(["--input", str(link), "--input", str(tmp_path / "one.pdf"), "--output", "o"])
    assert run_settings(options.view_as(PagemillOptions)).read.local_roots == ((str(link), str(tmp_path / "in")),)
