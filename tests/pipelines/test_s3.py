"""S3 in and out against a real S3 server on loopback (moto's ThreadedMotoServer, port 0)."""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines import cli
from pipelines.config.storage import configure
from pipelines.tables import sql
from schemas import tables
from tests.conftest import vllm_available
from tests.support import docmaker
from tests.support.moto_s3 import client, docs, flags, make_bucket, start_moto, stop_moto, storage
from transforms.store.write import write_rows

pytest.importorskip("moto")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, str]]:
    proc, endpoint = start_moto()
    yield {"endpoint": endpoint, "key": "testing", "secret": "testing", "region": "us-east-1"}
    stop_moto(proc)


def raw_keys(s3: dict[str, str], bucket: str, prefix: str, table: str, keys: tuple[str, ...]) -> Counter:
    """Every row's key in the raw Parquet files (not the deduplicating views)."""
    c = client(s3)
    found: Counter = Counter()
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/{table}/"):
        for obj in page.get("Contents", []):
            if obj["Key"].endswith(".parquet"):
                body = c.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
                for row in pq.read_table(io.BytesIO(body)).to_pylist():
                    found[tuple(row[k] for k in keys)] += 1
    return found


SAMPLE = {"in/invoice.pdf": docmaker.invoice_pdf(), "in/z/invoice.pdf": docmaker.invoice_pdf(),
          "in/report.pdf": docmaker.multipage_pdf(2), "in/scan.png": docmaker.scanned_png(),
          "in/bad.pdf": docmaker.truncated_pdf(), "in/notes.txt": b"not a document"}


@pytest.mark.parametrize("mode", [["--workers=1"], ["--direct_running_mode=multi_processing", "--direct_num_workers=2"],
                                  ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=LOOPBACK"]],
                         ids=["direct", "multiprocess", "portable"])
def test_s3_in_and_out(s3: dict[str, str], mode: list[str]) -> None:
    bucket = f"docs-{len(mode)}"
    make_bucket(s3, bucket, SAMPLE)
    client(s3).put_object(Bucket=bucket, Key="lists/some.txt",
                          Body=f"s3://{bucket}/in/scan.png\ns3://{bucket}/in/missing.pdf\n".encode())
    out = f"s3://{bucket}/out"
    code = cli.main(["run", "--input", f"s3://{bucket}/in/", "--input", f"@s3://{bucket}/lists/some.txt",
                     "--output", out, "--run-id", "s1", "--extract", "false", "--progress-every-s", "0",
                     *flags(s3), *mode])
    assert code == 0
    rows = {r["source_uri"].removeprefix(f"s3://{bucket}/"): r for r in docs(out, s3)}
    assert set(rows) == {*SAMPLE, "in/missing.pdf"}
    assert rows["in/z/invoice.pdf"]["outcome"] == "duplicate"
    assert rows["in/bad.pdf"]["reason_code"] == "unreadable"
    assert rows["in/missing.pdf"]["reason_code"] == "not_found"
    assert rows["in/notes.txt"]["reason_code"] == "unsupported_format"
    assert rows["in/report.pdf"]["page_count"] == 2
    manifest = json.loads(client(s3).get_object(Bucket=bucket, Key="out/runs/tenant=default/s1.json")["Body"].read())
    assert manifest["documents"] == len(rows)
    # The run's log, written locally as the run went, copied beside the manifest (pipelines/run/run_log.py).
    log = client(s3).get_object(Bucket=bucket, Key="out/runs/tenant=default/s1.log")["Body"].read()
    assert log.startswith(b"=== pagemill run s1 ")


def test_listing_over_a_thousand_keys(s3: dict[str, str]) -> None:
    objects = {f"many/{i:05d}.png": b"" for i in range(1050)} | {"many/real.png": docmaker.tiny_png()}
    make_bucket(s3, "many", objects)
    code = cli.main(["run", "--input", "s3://many/many/", "--output", "s3://many/out", "--run-id", "m1",
                     "--extract", "false", "--progress-every-s", "0", "--workers", "1", *flags(s3)])
    assert code == 0
    rows = docs("s3://many/out", s3)
    assert len(rows) == len(objects) == 1051
    assert Counter(r["reason_code"] for r in rows)["empty"] == 1050


def test_output_over_8_mib_is_written_in_parts(s3: dict[str, str]) -> None:
    make_bucket(s3, "big", {})
    configure(storage(s3))
    filler = os.urandom(9 * 2**20).hex()  # incompressible: the Parquet file stays over 8 MiB
    rows = [{"run_id": "b1", "tenant": "default", "source_uri": f"s3://x/{i}", "bytes": 1, "outcome": "rejected",
             "message": filler[i * 200_000:(i + 1) * 200_000]} for i in range(90)]
    # (in its tenant's and run's folders: a file elsewhere, or with other values, is read by no one: part_check.py)
    path = write_rows("s3://big/out/documents/tenant=default/run_id=b1", tables.DOCUMENTS, rows)
    head = client(s3).head_object(Bucket="big", Key=path.removeprefix("s3://big/"))
    assert head["ContentLength"] > 8 * 2**20
    assert "-" in head["ETag"]  # a multipart upload's ETag is "<md5>-<parts>"
    assert len(docs("s3://big/out", s3)) == 90


def run_cli(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def bare_env(tmp_path: Path) -> dict[str, str]:
    """No AWS settings at all: no keys, no profile files, no instance metadata."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_EC2_METADATA_DISABLED="true")
    return env


@pytest.fixture(scope="module")
def s3_with_auth() -> Iterator[str]:
    """A second server that checks credentials (moto accepts any key unless IAM checks are on)."""
    proc, endpoint = start_moto({"INITIAL_NO_AUTH_ACTION_COUNT": "0"})
    yield endpoint
    stop_moto(proc)


@pytest.mark.parametrize("case", ["missing_bucket", "wrong_credentials", "no_credentials"])
def test_storage_errors_are_one_clear_line(s3: dict[str, str], s3_with_auth: str, tmp_path: Path,
                                           case: str) -> None:
    bucket = f"ok-{case.replace('_', '-')}"
    make_bucket(s3, bucket, {"in/a.png": docmaker.tiny_png()})
    endpoint, key, secret, source = s3["endpoint"], s3["key"], s3["secret"], f"s3://{bucket}/in/"
    if case == "missing_bucket":
        source = "s3://no-such-bucket/in/"
        expect = "input s3://no-such-bucket/in/: the bucket does not exist"
    elif case == "wrong_credentials":
        endpoint, key, secret = s3_with_auth, "AKIAWRONGWRONGWRONG", "wrong"
        expect = f"input {source}: the access key is not known to this endpoint"
    else:
        key = secret = ""
        expect = f"input {source}: no AWS credentials found"
    args = ["run", "--input", source, "--output", f"s3://{bucket}/out", "--extract", "false",
            "--s3-endpoint-url", endpoint, "--s3-region", s3["region"]]
    if key:
        args += ["--s3-access-key-id", key, "--s3-secret-access-key", secret]
    proc = run_cli(args, bare_env(tmp_path), timeout=60)  # a hang fails here instead of blocking CI
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert expect in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


DOCS = 20  # two pages each


def test_killed_run_resumes_without_duplicates_or_losses(s3: dict[str, str], tmp_path: Path) -> None:
    objects = {f"in/doc-{i:03d}.pdf": docmaker.multipage_pdf(2, title=f"Report {i}") for i in range(DOCS)}
    make_bucket(s3, "resume", objects)
    args = ["run", "--input", "s3://resume/in/", "--output", "s3://resume/out", "--run-id", "k1", "--extract",
            "false", "--progress-every-s", "0", *flags(s3)]
    env = dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.cli", *args], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    c = client(s3)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        listed = c.list_objects_v2(Bucket="resume", Prefix="out/pages/").get("KeyCount", 0)
        if listed:
            os.killpg(proc.pid, signal.SIGKILL)  # killed as soon as the first rows are durable
            break
        time.sleep(0.02)
    proc.wait(timeout=30)
    # The premise: the run was killed mid-run. It did not exit by itself, some but not all of its rows are
    # durable, and it wrote no manifest (runs/tenant=<t>/<run_id>.json is the last thing a finished run writes). On the
    # DirectRunner today the kill lands with every pages row written and no documents or ledger rows.
    assert proc.returncode == -signal.SIGKILL, f"the run ended by itself (exit {proc.returncode}) before the kill"
    partial = {table: sum(raw_keys(s3, "resume", "out", table, keys).values()) for table, keys in
               (("documents", ("run_id", "source_uri")), ("pages", ("run_id", "doc_sha256", "page_index")),
                ("ledger", ("run_id", "doc_sha256", "page_index")))}
    assert partial["pages"] >= 1 and sum(partial.values()) < DOCS + 2 * DOCS + 2 * DOCS, partial
    assert c.list_objects_v2(Bucket="resume", Prefix="out/runs/").get("KeyCount", 0) == 0
    assert cli.main(args) == 0
    assert c.list_objects_v2(Bucket="resume", Prefix="out/runs/tenant=default/k1.json").get("KeyCount", 0) == 1
    page_keys = raw_keys(s3, "resume", "out", "pages", ("run_id", "doc_sha256", "page_index"))
    doc_keys = raw_keys(s3, "resume", "out", "documents", ("run_id", "source_uri"))
    assert len(doc_keys) == DOCS and set(doc_keys.values()) == {1}
    assert len(page_keys) == 2 * DOCS and set(page_keys.values()) == {1}
    ledger_keys = raw_keys(s3, "resume", "out", "ledger", ("run_id", "doc_sha256", "page_index"))
    assert ledger_keys == page_keys


@pytest.mark.vllm
@pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (scripts/setup_venv.sh)")
def test_second_run_makes_zero_model_calls(s3: dict[str, str], test_model_dir: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    make_bucket(s3, "cache", {"in/invoice.pdf": docmaker.invoice_pdf(), "in/report.pdf": docmaker.multipage_pdf(2),
                              "in/zz-dup.pdf": docmaker.invoice_pdf()})
    base = ["run", "--input", "s3://cache/in/", "--output", "s3://cache/out", "--model", str(test_model_dir),
            "--max-tokens", "384", "--kv-cache-gib", "0.25", "--max-side", "640", "--progress-every-s", "0",
            "--workers", "1", *flags(s3)]
    assert cli.main([*base, "--run-id", "first"]) == 0
    assert cli.main([*base, "--run-id", "second"]) == 0
    out = capsys.readouterr().out
    assert "model calls 0," in out.split("pagemill: 3 documents")[-1]
    second = {r["source_uri"].rsplit("/", 1)[-1]: r for r in docs("s3://cache/out", s3, "run_id = 'second'")}
    assert {k: v["outcome"] for k, v in second.items()} == {"invoice.pdf": "cached", "report.pdf": "cached",
                                                           "zz-dup.pdf": "duplicate"}
    _columns, values = sql.query("s3://cache/out", "SELECT run_id, route, count(*) FROM ledger GROUP BY ALL",
                                storage(s3))
    routes = {(r, route): n for r, route, n in values}
    assert routes[("second", "cache")] == 3 and ("second", "model") not in routes
    assert routes[("first", "model")] == 3
    extractions = sql.query("s3://cache/out", "SELECT count(DISTINCT extraction) FROM pages WHERE run_id = 'second' "
                            "AND extraction IN (SELECT extraction FROM pages WHERE run_id = 'first')", storage(s3))
    assert extractions[1][0][0] >= 1
    # --force recomputes.
    assert cli.main([*base, "--run-id", "third", "--force", "true"]) == 0
    third = sql.query("s3://cache/out", "SELECT route, count(*) FROM ledger WHERE run_id = 'third' GROUP BY 1",
                      storage(s3))[1]
    assert dict(third) == {"model": 3}
