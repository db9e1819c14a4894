"""Reading input objects: which errors are the store failing (storage_error, after the retries) and which
are refusals (unreadable); the retry configuration is what the options say. The retries themselves against a
real S3 server behind a fault injector: tests/pipelines/test_s3_faults.py."""
from __future__ import annotations

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

from transforms.intake.reading import UNREADABLE, ObjectReader, ReadConfig, ReadFailed, is_storage_failure


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
