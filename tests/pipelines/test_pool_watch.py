"""The launcher's bound on a lost worker pool (pipelines/run/pool_watch.py) and its exit past a runner thread
that outlived its job (pipelines/cli.py leave). Real sockets on loopback; the lost pool is a port that was
listening and is closed."""
from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pipelines.run.pool_watch import PoolWatch, WorkerPoolLost, parse_address, reachable, wait_for_job, watched_address

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


@pytest.mark.parametrize(("flags", "address"), [
    (["--environment_config=worker:50000"], ("worker", 50000)),
    (["--environment_options=external_service_address=10.0.0.2:50001"], ("10.0.0.2", 50001)),  # Beam's other spelling
    (["--environment_config=worker:50000", "--job_endpoint=localhost:8099"], None)])
def test_the_watched_address_comes_from_the_runs_pipeline_options(flags: list[str], address) -> None:
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines.run.pool_watch import pool_address

    base = ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=EXTERNAL"]
    assert pool_address(PipelineOptions(base + flags)) == address
    assert pool_address(PipelineOptions(["--runner=DirectRunner"])) is None


def _listening() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    return server


class Answering:
    """A pool that answers: a listening socket whose thread accepts every connection (and hangs up)."""

    def __init__(self) -> None:
        self.server = _listening()
        self.server.settimeout(0.05)  # to see `stop` (closing a socket does not wake a blocked accept)
        self.address = self.server.getsockname()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)
        self.server.close()


class Script:
    """The watch's probe and clock as the test says: each probe answers the next of `answers` (after them: the
    pool answers, and `done` is set) and moves the clock on by `step_s`, so what the watch decides depends on
    the answers alone, not on how fast the machine polls."""

    def __init__(self, answers: list[bool] | None = None, step_s: float = 0.1,
                 probe: Callable[[tuple[str, int]], bool] | None = None, polls: int = 0) -> None:
        self.answers, self.step_s, self.real, self.now = list(answers or []), step_s, probe, 0.0
        self.polls, self.seen, self.done = polls or len(self.answers), [], threading.Event()

    def clock(self) -> float:
        return self.now

    def probe(self, address: tuple[str, int]) -> bool:
        self.now += self.step_s
        answer = self.real(address) if self.real else (self.answers[len(self.seen)]
                                                        if len(self.seen) < len(self.answers) else True)
        self.seen.append(answer)
        if len(self.seen) >= self.polls:
            self.done.set()
        return answer


def watch_script(script: Script, address: tuple[str, int], lost_after_s: float, cancelled: list[int]) -> PoolWatch:
    def cancel() -> None:
        cancelled.append(1)
        script.done.set()

    with PoolWatch(address, cancel, poll_s=0.001, lost_after_s=lost_after_s, probe=script.probe,
                   clock=script.clock) as watch:
        assert script.done.wait(60), "the watch stopped polling"
    return watch


def test_a_pool_that_answers_is_never_lost() -> None:
    """A real pool on loopback that accepts every connection, polled 40 times over 4 s of the watch's clock
    (13 times its 0.3 s bound): never lost. (A socket that listens and never accepts fills its backlog and
    stops answering: that was this test's pool once.)"""
    pool, cancelled = Answering(), []
    try:
        script = Script(probe=reachable, polls=40)
        watch = watch_script(script, pool.address, 0.3, cancelled)
    finally:
        pool.close()
    assert script.seen[:40] == [True] * 40 and script.now >= 4.0
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
    """Silences shorter than the bound do not add up: a pool restarting in place is not lost. Polls 0.1 s apart
    on the watch's clock, the bound 0.25 s: two missed polls are a silence of 0.1 s (from the first miss to the
    second), twenty such silences 2 s in all."""
    cancelled: list[int] = []
    script = Script([False, False, True] * 10)
    watch = watch_script(script, ("worker", 1), 0.25, cancelled)
    assert len(script.seen) >= 30 and watch.lost is None and cancelled == []


def test_a_silence_as_long_as_the_bound_is_lost_at_that_poll() -> None:
    """The same clock: an answer at 0.1 s, then misses at 0.2, 0.3 and 0.4 s are a silence of 0.2 s (< 0.25: not
    lost); the next miss, at 0.5 s, makes it 0.3 s: lost there, cancelled once, and no poll after it."""
    cancelled: list[int] = []
    script = Script([True, False, False, False, False, False, False], polls=99)
    watch = watch_script(script, ("worker", 1), 0.25, cancelled)
    assert cancelled == [1] and script.seen == [True, False, False, False, False]
    assert watch.lost and "worker:1" in watch.lost and "for 0 s" in watch.lost  # 0.3 s, rounded


def test_a_cancelled_job_that_returns_normally_is_a_lost_pool() -> None:
    """Not every runner raises when its job is cancelled: a wait that returns normally after the cancel still
    fails the wave with WorkerPoolLost (otherwise the wave would be marked done without its rows)."""
    server = _listening()
    address = server.getsockname()
    server.close()

    class ReturnsWhenCancelled:
        def __init__(self) -> None:
            self.cancelled = threading.Event()

        def wait_until_finish(self) -> str:
            assert self.cancelled.wait(120), "never cancelled"
            return "CANCELLED"

        def cancel(self) -> None:
            self.cancelled.set()

    job = ReturnsWhenCancelled()
    with pytest.raises(WorkerPoolLost, match=f"worker pool at 127.0.0.1:{address[1]}"):
        wait_for_job(job, address, poll_s=0.01, lost_after_s=0.0)  # the first refused connection is the bound
    assert job.cancelled.is_set()


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


def test_a_cancel_that_fails_is_logged_with_its_error_and_the_pool_is_still_lost(caplog) -> None:
    def cancel() -> None:
        raise RuntimeError("the job service is gone too")

    script = Script([False], polls=1)
    with caplog.at_level("WARNING", logger="pipelines.run.pool_watch"):
        with PoolWatch(("worker", 1), cancel, poll_s=0.001, lost_after_s=0.0, probe=script.probe,
                       clock=script.clock) as watch:
            assert script.done.wait(60)
    assert watch.lost and "worker:1" in watch.lost
    assert [r.getMessage() for r in caplog.records] == [
        "cancelling the job of a lost worker pool: the job service is gone too"]


def test_leaving_the_watch_waits_for_its_poll_in_flight() -> None:
    """The watch's thread is joined on the way out: a poll that is still connecting when the wave ends has
    returned by the time the `with` is left (nothing of the watch outlives its wave)."""
    inside, release, returned = threading.Event(), threading.Event(), threading.Event()

    def slow_probe(address: tuple[str, int]) -> bool:
        inside.set()
        release.wait(60)
        returned.set()
        return True

    with PoolWatch(("worker", 1), lambda: None, poll_s=0.001, lost_after_s=30.0, probe=slow_probe):
        assert inside.wait(60)
        threading.Timer(0.05, release.set).start()  # the poll ends a little after the wave does
    assert returned.is_set()
