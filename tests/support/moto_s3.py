"""A real S3 server (moto) and a run's flags for it: start_moto, make_bucket, docs.
Moved from tests/pipelines/test_s3.py, which other test files imported."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

import pytest

from pipelines.config.storage import StorageConfig
from pipelines.tables import sql

boto3 = pytest.importorskip("boto3")


def start_moto(extra_env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """A real S3 server (moto) on 127.0.0.1, port 0, in its own process: flask must not be imported
    into the test process, where vLLM's in-process engine trips over flask's context proxies."""
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
                            env={**os.environ, **(extra_env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        found = re.search(r"Running on (http://127\.0\.0\.1:\d+)", proc.stdout.readline())
        if found:
            # Keep reading its request log, or the pipe fills and the server blocks.
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, found.group(1)
    proc.kill()
    raise RuntimeError("moto server did not start")


def stop_moto(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=10)


def client(s3: dict[str, str]):
    return boto3.client("s3", endpoint_url=s3["endpoint"], aws_access_key_id=s3["key"],
                        aws_secret_access_key=s3["secret"], region_name=s3["region"])


def flags(s3: dict[str, str]) -> list[str]:
    return ["--s3-endpoint-url", s3["endpoint"], "--s3-access-key-id", s3["key"], "--s3-secret-access-key",
            s3["secret"], "--s3-region", s3["region"]]


def storage(s3: dict[str, str]) -> StorageConfig:
    return StorageConfig(s3_endpoint_url=s3["endpoint"], s3_region=s3["region"], s3_access_key_id=s3["key"],
                         s3_secret_access_key=s3["secret"])


def make_bucket(s3: dict[str, str], name: str, objects: dict[str, bytes]) -> None:
    c = client(s3)
    c.create_bucket(Bucket=name)
    for key, body in objects.items():
        c.put_object(Bucket=name, Key=key, Body=body)


def docs(output: str, s3: dict[str, str], where: str = "true") -> list[dict]:
    columns, values = sql.query(output, f"SELECT * FROM documents WHERE {where}", storage(s3))
    return [dict(zip(columns, v, strict=True)) for v in values]
