"""The launcher's own bound on a lost worker pool, for a remote run it executes itself.

With `--job_endpoint embed --environment_type EXTERNAL`, the job service runs inside the launcher and the SDK
workers come from a worker pool on another host. When that host dies, Beam's embedded job service can lose the
control stream in a reader thread and never fail the job (seen with a one-object first wave: the launcher
waited past any bound, docs/runners.md). Nothing else watches the pool there, so the launcher does: it connects
to the pool's address every POLL_S while a wave's job runs; when the pool has not accepted a connection for
LOST_AFTER_S, the job is cancelled and the wave fails with WorkerPoolLost (exit 1, rows kept for the resume).

Only the embedded job service is watched: behind a Flink or Spark job server, the EXTERNAL address is the task
manager's own (`localhost:50000` seen from there), and those runners bound a lost worker themselves.
"""
from __future__ import annotations

import logging
import re
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from pipelines.run.option_checks import environment_kind, runner_name

log = logging.getLogger(__name__)

POLL_S = 5.0
LOST_AFTER_S = 30.0  # six missed polls: a pool restarting in place (a rolling update) is not lost
CONNECT_TIMEOUT_S = 3.0
_ADDRESS = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_.-]+)):(?P<port>\d{1,5})$")


class WorkerPoolLost(RuntimeError):
    """The worker pool of a remote run stopped accepting connections: its job was cancelled."""


def parse_address(config: str | None) -> tuple[str, int] | None:
    """Pure: `host:port` (or `[v6]:port`) of an EXTERNAL environment, or None for anything else."""
    found = _ADDRESS.match((config or "").strip())
    if found is None or not 0 < int(found["port"]) < 65536:
        return None
    return found["v6"] or found["host"], int(found["port"])


def watched_address(runner: str | None, job_endpoint: str | None, environment_type: str | None,
                    environment_config: str | None) -> tuple[str, int] | None:
    """Pure: the pool address the launcher watches, or None (not a remote run it executes itself)."""
    if runner_name(runner) != "portablerunner" or (job_endpoint or "") != "embed":
        return None
    if environment_kind(environment_type) != "EXTERNAL":
        return None
    return parse_address(environment_config)


def pool_address(options: Any) -> tuple[str, int] | None:
    """The watched address from a run's PipelineOptions."""
    from apache_beam.options.pipeline_options import PortableOptions, StandardOptions

    portable = options.view_as(PortableOptions)
    config = portable.environment_config or portable.lookup_environment_option("external_service_address")
    return watched_address(options.view_as(StandardOptions).runner, portable.job_endpoint,
                           portable.environment_type, config)


def reachable(address: tuple[str, int], timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    try:
        with socket.create_connection(address, timeout=timeout_s):
            return True
    except OSError:
        return False


class PoolWatch:
    """While the `with` block runs, polls `address`; after `lost_after_s` without an answer calls `on_lost`
    (the job's cancel) once and keeps why in `lost`. A None address watches nothing. `clock` measures the
    silence (a test's own clock makes it deterministic)."""

    def __init__(self, address: tuple[str, int] | None, on_lost: Callable[[], Any], poll_s: float = POLL_S,
                 lost_after_s: float = LOST_AFTER_S, probe: Callable[[tuple[str, int]], bool] = reachable,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.address, self.on_lost, self.poll_s, self.lost_after_s, self.probe, self.clock = (
            address, on_lost, poll_s, lost_after_s, probe, clock)
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PoolWatch:
        if self.address is not None:
            self._thread = threading.Thread(target=self._watch, name="pagemill-pool-watch", daemon=True)
            self._thread.start()
        return self

    def _watch(self) -> None:
        assert self.address is not None
        silent_since: float | None = None
        while not self._stop.wait(self.poll_s):
            if self.probe(self.address):
                silent_since = None
                continue
            now = self.clock()
            silent_since = now if silent_since is None else silent_since
            if now - silent_since >= self.lost_after_s:
                host, port = self.address
                self.lost = (f"the worker pool at {host}:{port} has not accepted a connection for "
                             f"{now - silent_since:.0f} s: its host is down or unreachable; the job was cancelled")
                try:
                    self.on_lost()
                except Exception as err:  # noqa: BLE001 - the wave fails on `lost` whatever the cancel said
                    log.warning("cancelling the job of a lost worker pool: %s", err)
                return

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def wait_for_job(result: Any, address: tuple[str, int] | None, poll_s: float = POLL_S,
                 lost_after_s: float = LOST_AFTER_S) -> None:
    """`result.wait_until_finish()`, bounded by the pool at `address` (None: unbounded, as Beam waits):
    WorkerPoolLost when the pool was lost and the job cancelled, whatever the runner then said."""
    with PoolWatch(address, result.cancel, poll_s, lost_after_s) as watch:
        try:
            result.wait_until_finish()
        except Exception as err:
            if watch.lost:
                raise WorkerPoolLost(watch.lost) from err
            raise
    if watch.lost:  # cancelled, yet the runner reported no failure
        raise WorkerPoolLost(watch.lost)
