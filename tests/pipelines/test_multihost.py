"""Workers on another host that shares nothing with the launcher but object storage (issue 35).

Three hosts of their own (tests/support/hosts.py: network namespaces on a bridge, each its own address and
name): `storage` runs a real S3 server (moto); `worker` runs Beam's worker pool (`worker_pool_main`, the way
Flink and Spark task managers run Python SDK workers), the tiny vLLM model and the machine engine, in a mount
namespace of its own where /tmp, /var/tmp and the launcher's caches are private tmpfs (the test's folders,
the launcher's temp files and the model's original folder are not there); `launcher` runs `pagemill run
--runner PortableRunner --job_endpoint embed --environment_type EXTERNAL --environment_config worker:PORT`.
The worker has what an image gives it (the checkout and its virtualenv) and the model folder as a mounted
volume at the same path (no weights downloaded at run time); inputs and outputs are s3:// on `storage`.

Two drills in one run: the worker host dies mid-run (kill -9 of everything it runs) and a resume on a new pool
extracts only what was not on S3; the storage host's cable is unplugged for 10 s mid-resume and the run carries
through with one row per key. What the remote run left is then compared, row by row, with a one-machine run over
the same objects."""
from __future__ import annotations

import io
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from schemas.kept_row import SPEND
from tests.conftest import vllm_available
from tests.support import docmaker, hosts
from tests.support.raw import one_row_per

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto")
REPO = Path(__file__).resolve().parents[2]
BOOT = Path(__file__).resolve().parents[1] / "support" / "sdk_boot.py"
S3_PORT, POOL_PORT = 5000, 50000
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
KEYS = {"documents": ("source_uri",), "pages": ("source_uri", "page_index"), "ledger": ("source_uri", "page_index")}
# What differs between two runs over the same objects by design: the run, its clocks and what the engine's
# state made of the same page (time, cost, prefix-cache hits, the attempt's sequence number).
RUN_COLUMNS = {"run_id", "created_at", "rendered_at", "extracted_at", "gpu_seconds", "cost_usd",
               "cached_prompt_tokens", "attempt_seq"}
# Text PDFs, their hints from the text layer: the model is the work; nothing here needs OCR or NudeNet.
FLAGS = ["--hints", "text_layer", "--nsfw-classifier", "none", "--kv-cache-gib", "0.25", "--progress-every-s", "0",
         "--s3-endpoint-url", f"http://storage:{S3_PORT}", "--s3-region", CREDENTIALS["AWS_DEFAULT_REGION"]]
REMOTE = ["--runner", "PortableRunner", "--job_endpoint", "embed", "--environment_type", "EXTERNAL",
          "--environment_config", f"worker:{POOL_PORT}", "--engine-service", "machine"]

# The test starts three engines on a busy 2-core machine: minutes, not the suite's default 300 s a test.
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (scripts/setup_venv.sh)"),
              pytest.mark.skipif(hosts.unavailable() is not None, reason=str(hosts.unavailable()))]


def documents(n: int, pages: int, title: str) -> dict[str, bytes]:
    return {f"in/{title.lower()}-{i:02d}.pdf": docmaker.multipage_pdf(pages, title=f"{title} {i}") for i in range(n)}


@dataclass
class Site:
    cluster: hosts.Cluster
    model: Path
    logs: Path
    s3: Any  # a boto3 client of the storage host, from this machine
    cpu_s: float = 0.0  # CPU seconds of the hosts' processes that were killed (nobody waits for them)

    def kill(self, host: str) -> None:
        self.cpu_s += hosts.kill_host(self.cluster, host)

    def env(self) -> dict[str, str]:
        """What an image sets: the venv first on PATH (the pool starts SDK workers as `python -c ...`), pagemill
        importable, no hub access, vLLM's stdout logging short (the pool pipes it and never reads it)."""
        return {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                "PYTHONPATH": str(REPO), "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8",
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING", **CREDENTIALS}

    def remote(self) -> list[str]:
        """The runner's flags; the model folder is a volume the worker host mounts at the same path."""
        return [*REMOTE, "--shared-filesystem", str(self.model)]

    def log(self, name: str) -> Path:
        return self.logs / f"{name}-{time.monotonic_ns()}.log"


def private_folders(basetemp: Path) -> list[str]:
    """What the worker host must not see: this machine's temp folders (the test's and the launcher's files,
    the model's original folder) and the caches a launcher may have filled (hub, vLLM, torch)."""
    found = ["/tmp", "/var/tmp", str(Path.home() / ".cache")]
    if not str(basetemp).startswith("/tmp/"):
        found.append(str(basetemp))
    return [f for f in found if Path(f).is_dir() and not str(REPO).startswith(f.rstrip("/") + "/")]


def wait_for(what: str, check: Any, timeout_s: float, interval_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(interval_s)
    raise AssertionError(f"{what}: not after {timeout_s:g} s")


def reachable(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, test_model_dir: Path) -> Iterator[Site]:
    cluster = hosts.create(("launcher", "worker", "storage"))
    here = None
    try:
        logs = tmp_path_factory.mktemp("multihost")
        s3 = boto3.client("s3", endpoint_url=f"http://{cluster.ip('storage')}:{S3_PORT}",
                          aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                          region_name=CREDENTIALS["AWS_DEFAULT_REGION"])
        here = Site(cluster, test_model_dir, logs, s3)
        hosts.spawn(cluster, "storage", [sys.executable, "-m", "moto.server", "-H", "0.0.0.0", "-p", str(S3_PORT)],
                    here.env(), here.log("moto"))
        wait_for("the S3 server on the storage host", lambda: reachable(cluster.ip("storage"), S3_PORT), 60)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        yield here
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        here.cpu_s += after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    finally:
        spent = hosts.destroy(cluster)
    # The suite's budget is CPU on 2 cores: what this module cost, the launchers and every host's processes.
    if here is not None:
        print(f"\nmultihost: {here.cpu_s + spent:.0f} CPU seconds in the hosts' processes")


def start_pool(site: Site) -> Any:
    """Beam's worker pool on the worker host, starting each SDK worker through a boot as the images do
    (tests/support/sdk_boot.py: a bare pool's workers cannot use s3://)."""
    argv = [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main", f"--service_port={POOL_PORT}",
            f"--container_executable={BOOT}"]
    pool = hosts.spawn(site.cluster, "worker", argv, site.env(), site.log("pool"),
                       hide=private_folders(Path(site.logs).parent), volumes=[str(site.model)], cwd=str(REPO))
    wait_for("the worker pool", lambda: reachable(site.cluster.ip("worker"), POOL_PORT), 60)
    return pool


def launch(site: Site, bucket: str, output: str, run_id: str, *extra: str) -> tuple[Any, Path]:
    """`pagemill run` on the launcher host over s3://bucket/in/ (the keys in its environment, as preferred)."""
    log = site.log(f"launch-{run_id}")
    argv = [sys.executable, "-m", "pipelines.cli", "run", "--input", f"s3://{bucket}/in/", "--output",
            f"s3://{bucket}/{output}", "--run-id", run_id, "--model", str(site.model), *FLAGS, *extra]
    return hosts.spawn(site.cluster, "launcher", argv, site.env(), log, cwd=str(REPO)), log


def finish(proc: Any, log: Path, timeout_s: float = 240) -> tuple[int, str]:
    """The launcher's exit code and output; a run that has not ended in `timeout_s` fails the test (a hang)."""
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        tail = log.read_text(errors="replace")[-4000:]
        raise AssertionError(f"the run did not end in {timeout_s:g} s: {tail}") from None
    return code, log.read_text(errors="replace")


def make_bucket(site: Site, bucket: str, objects: dict[str, bytes]) -> None:
    site.s3.create_bucket(Bucket=bucket)
    for key, body in objects.items():
        site.s3.put_object(Bucket=bucket, Key=key, Body=body)


def part_files(site: Site, bucket: str, prefix: str) -> list[str]:
    pages = site.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", []) if o["Key"].endswith(".parquet")]


def rows(site: Site, bucket: str, output: str, table: str) -> list[dict[str, Any]]:
    """Every raw row of `table` under the output (not the views, which would hide a duplicate)."""
    found = []
    for key in part_files(site, bucket, f"{output}/{table}/"):
        body = site.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        found += pq.read_table(io.BytesIO(body)).to_pylist()
    return found


def comparable(row: dict[str, Any], bucket: str) -> dict[str, Any]:
    """A row without its run's own columns; source URIs relative to the bucket."""
    kept = {k: v for k, v in row.items() if k not in RUN_COLUMNS}
    if kept.get("source_uri"):
        kept["source_uri"] = kept["source_uri"].removeprefix(f"s3://{bucket}/")
    return kept


def without(row: dict[str, Any], columns: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in columns}


def table(site: Site, bucket: str, output: str, name: str) -> dict[Any, dict[str, Any]]:
    return {k: comparable(r, bucket) for k, r in one_row_per(rows(site, bucket, output, name), *KEYS[name]).items()}


def page_keys(rows_: list[dict[str, Any]], statuses: tuple[str, ...] = ("ok", "cached", "duplicate")) -> set[tuple]:
    return {(r["source_uri"], r["page_index"]) for r in rows_ if r["status"] in statuses}


def wait_for_parts(site: Site, bucket: str, prefix: str, proc: Any, log: Path, known: frozenset[str] = frozenset(),
                   timeout_s: float = 240) -> None:
    """Until the run's first part files (beyond `known`) are on S3: a mid-run trigger that does not guess at times."""
    def found() -> bool:
        assert proc.poll() is None, f"the run ended before its first part file: {log.read_text()[-3000:]}"
        return bool(set(part_files(site, bucket, prefix)) - known)

    wait_for(f"part files under s3://{bucket}/{prefix}", found, timeout_s)


def test_worker_host_dies_the_resume_rides_out_a_storage_outage_and_equals_a_one_machine_run(site: Site) -> None:
    """kill -9 of the worker pool's process group (and of what it left on its host) mid-run: the launcher ends
    with a clear line and exit 1, in bounded time. A resume on a new pool extracts exactly the pages that were
    not on S3; its storage host's cable is unplugged for 10 s once the resume writes: one row per key. What the
    two remote invocations left equals, key by key, a one-machine run over the same objects (one test: every
    remote run costs an engine start and a job on the 2-core machine)."""
    # Files every 2 rows: the kill finds some on S3. Waves of 1 and 8 objects: each wave a job through the
    # embedded job service; the kill lands as the second starts, where Beam once left the launcher waiting.
    bucket, run_id, flush = "drill", "k1", ["--flush-rows", "2", "--wave-objects", "8"]
    objects = {**documents(6, 2, "Drill"), "in/invoice.pdf": docmaker.invoice_pdf(),
               "in/again.pdf": docmaker.invoice_pdf(), "in/bad.pdf": docmaker.truncated_pdf()}
    make_bucket(site, bucket, objects)
    pool = start_pool(site)
    proc, log = launch(site, bucket, "out", run_id, *site.remote(), *flush)
    try:
        wait_for_parts(site, bucket, "out/pages/", proc, log)
        os.killpg(pool.pid, signal.SIGKILL)
        site.kill("worker")  # the engine service runs in a session of its own
        code, text = finish(proc, log, timeout_s=180)  # bounded: a launcher waiting forever fails here
    finally:
        site.kill("worker")
    assert code == 1, text[-4000:]
    assert f"pagemill: run {run_id} failed:" in text and f"--run-id {run_id} to resume" in text, text[-4000:]
    before = rows(site, bucket, "out", "pages")
    done_before, first_attempt = page_keys(before), {r["created_at"] for r in before}

    pool = start_pool(site)
    proc, log = launch(site, bucket, "out", run_id, *site.remote(), *flush)
    try:
        wait_for_parts(site, bucket, "out/pages/", proc, log, frozenset(part_files(site, bucket, "out/pages/")))
        hosts.set_link(site.cluster, "storage", up=False)
        assert proc.poll() is None, "the resume ended before the outage: nothing was drilled"
        time.sleep(10)  # the outage's length, not a wait for a result
        hosts.set_link(site.cluster, "storage", up=True)
        code, text = finish(proc, log)
    finally:
        hosts.set_link(site.cluster, "storage", up=True)
        site.kill("worker")
    assert code == 0, text[-4000:]
    manifest = site.s3.get_object(Bucket=bucket, Key=f"out/runs/tenant=default/{run_id}.json")["Body"].read()
    assert json.loads(manifest)["exit_code"] == 0

    # The one-machine run over the same objects: the pages it has are what the remote run had to have.
    code, text = finish(*launch(site, bucket, "local", "local", "--workers", "1"))
    assert code == 0, text[-4000:]
    for name in ("documents", "pages", "ledger"):
        remote, local = table(site, bucket, "out", name), table(site, bucket, "local", name)
        assert set(remote) == set(local), name
        for key in local:
            ours, theirs = remote[key], local[key]
            if name == "ledger" and ours["attempts"] > theirs["attempts"]:
                # The kill fell between a page's ledger file and its pages file (the ledger's is written first):
                # the resume answered the page again and its kept row sums both invocations' spend.
                ours, theirs = without(ours, SPEND), without(theirs, SPEND)
            assert ours == theirs, (name, key)
    outcomes = sorted(d["outcome"] for d in table(site, bucket, "local", "documents").values())
    assert outcomes == sorted(["extracted"] * 7 + ["duplicate", "rejected"])
    every_page = set(table(site, bucket, "local", "pages"))
    assert done_before and done_before < page_keys(rows(site, bucket, "out", "pages"))  # the premise: killed mid-run
    ledger = one_row_per(rows(site, bucket, "out", "ledger"), "source_uri", "page_index")
    modelled = {k for k, r in ledger.items() if r["route"] == "model"}
    extracted_by_resume = {k for k in modelled if ledger[k]["created_at"] not in first_attempt}
    assert extracted_by_resume == modelled - done_before, (len(extracted_by_resume), len(modelled - done_before))
    assert set(ledger) <= every_page
    print(f"resume extracted {len(extracted_by_resume)} of {len(modelled)} model pages; {len(done_before)} were on S3")
