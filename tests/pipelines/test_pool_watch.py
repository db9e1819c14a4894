"""The launcher's bound on a lost worker pool (pipelines/run/pool_watch.py) and its exit past a runner thread
that outlived its job (pipelines/cli.py leave). Real sockets on loopback; the lost pool is a port that was
listening and is closed."""
from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pipelines.run.pool_watch import PoolWatch, WorkerPoolLost, parse_address, wait_for_job, watched_address

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("config", "address"), [
    ("worker:50000", ("worker", 50000)), ("10.0.0.2:1", ("10.0.0.2", 1)), ("[::1]:50000", ("::1", 50000)),
    ("worker", None), ("worker:0", None), ("worker:65536", None), ("", None), (None, None),
    ('{"command": "/opt/boot"}', None), ("host:50000:1", None)])
def test_parse_address(config: str | None, address: tuple[str, int] | None) -> None:
    assert parse_address(config) == address


@pytest.mark.parametrize(("runner", "endpoint", "kind", "watched"), [
    ("PortableRunner", "embed", "EXTERNAL", True),
    ("portable", "embed", "beam:env:external:v1", True),  # Beam resolves `--runner portable` and takes the URN
    ("apache_beam.runners.portability.portable_runner.PortableRunner", "embed", "external", True),
    ("PortableRunner", "localhost:8099", "EXTERNAL", False),  # a Flink/Spark job server: the runner's own bound
    ("FlinkRunner", "embed", "EXTERNAL", False),
    ("PortableRunner", "embed", "LOOPBACK", False),
    ("DirectRunner", None, None, False)])
def test_only_the_embedded_job_services_external_pool_is_watched(runner, endpoint, kind, watched) -> None:
    assert (watched_address(runner, endpoint, kind, "worker:50000") is not None) is watched


def _listening() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    return server


def test_a_pool_that_answers_is_never_lost() -> None:
    server, cancelled = _listening(), []
    try:
        with PoolWatch(server.getsockname(), lambda: cancelled.append(1), poll_s=0.05, lost_after_s=0.3) as watch:
            time.sleep(1.0)
    finally:
        server.close()
    assert watch.lost is None and cancelled == []


def test_a_pool_that_stops_answering_cancels_the_job_once_and_says_where() -> None:
    server = _listening()
    address = server.getsockname()
    server.close()  # the pool's host died: nothing listens there any more
    cancelled = threading.Event()
    calls = []

    def cancel() -> None:
        calls.append(time.monotonic())
        cancelled.set()

    started = time.monotonic()
    with PoolWatch(address, cancel, poll_s=0.05, lost_after_s=0.3) as watch:
        assert cancelled.wait(60), "the job was never cancelled"
        time.sleep(0.3)  # more polls: still one cancel
    assert len(calls) == 1 and calls[0] - started >= 0.3
    assert watch.lost and f"127.0.0.1:{address[1]}" in watch.lost


def test_a_pool_back_within_the_bound_is_not_lost() -> None:
    """Silences shorter than the bound do not add up: a pool restarting in place is not lost."""
    answers = iter([False, False, True] * 20)
    cancelled = []
    with PoolWatch(("worker", 1), lambda: cancelled.append(1), poll_s=0.01, lost_after_s=0.5,
                   probe=lambda address: next(answers, True)) as watch:
        time.sleep(0.7)
    assert watch.lost is None and cancelled == []


def test_the_launcher_leaves_past_a_runner_thread_that_never_ends() -> None:
    """What a cancelled embedded job leaves behind: a non-daemon thread that never ends. Without `leave`, the
    interpreter would wait for it at exit forever."""
    code = ("import threading, time\n"
            "threading.Thread(target=time.sleep, args=(3600,), name='stuck-job').start()\n"
            "from pipelines.cli import leave\n"
            "leave(3, grace_s=0.5)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert "stuck-job" in done.stderr


def test_the_launcher_waits_for_a_thread_that_ends_within_the_grace() -> None:
    code = ("import threading, time\n"
            "threading.Thread(target=lambda: (time.sleep(0.5), print('finished', flush=True))).start()\n"
            "from pipelines.cli import leave\n"
            "leave(0, grace_s=60)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "finished" in done.stdout and "did not end" not in done.stderr


class StuckJob:
    """The fault: a job whose runner lost its worker and never fails it; only a cancel ends the wait (as
    Beam's PortableRunner result does: the CANCELLED state ends its state stream, and it raises)."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()

    def wait_until_finish(self) -> None:
        if not self.cancelled.wait(120):
            raise AssertionError("never cancelled")
        raise RuntimeError("Pipeline job-1 failed in state CANCELLED: ")

    def cancel(self) -> None:
        self.cancelled.set()


def test_a_stuck_job_of_a_lost_pool_fails_the_wave_with_the_reason() -> None:
    server = _listening()
    address = server.getsockname()
    server.close()
    job = StuckJob()
    with pytest.raises(WorkerPoolLost, match=f"worker pool at 127.0.0.1:{address[1]}"):
        wait_for_job(job, address, poll_s=0.05, lost_after_s=0.3)
    assert job.cancelled.is_set()


def test_a_job_that_fails_on_its_own_keeps_its_error() -> None:
    class Failing:
        def wait_until_finish(self) -> None:
            raise RuntimeError("a DoFn raised")

        def cancel(self) -> None:
            raise AssertionError("a failed job is not cancelled")

    server = _listening()
    try:
        with pytest.raises(RuntimeError, match="a DoFn raised"):
            wait_for_job(Failing(), server.getsockname(), poll_s=0.05, lost_after_s=0.3)
    finally:
        server.close()


def test_the_run_failure_line_names_the_lost_pool_not_the_cancel() -> None:
    from pipelines.run.failure import run_failure

    try:
        try:
            raise RuntimeError("Pipeline job-1 failed in state CANCELLED: ")
        except RuntimeError as err:
            raise WorkerPoolLost("the worker pool at worker:50000 has not accepted a connection for 30 s") from err
    except WorkerPoolLost as lost:
        line = run_failure(lost)
    assert line.startswith("WorkerPoolLost: the worker pool at worker:50000") and "CANCELLED" not in line
