"""One launcher per run's batches (transforms/engines/openai_batch/lock.py): a local folder's flock refuses a second
holder at once and is dropped when its process dies (kill -9); an object store's lease refuses a live holder, is
taken over when stale (not renewed, or its process on this host gone), and a launcher whose lease was taken over
learns it at its next renewal."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from transforms.engines.openai_batch.lock import LEASE, FileLock, LauncherBusy, Lease, launcher_lock

ROOT = Path(__file__).resolve().parents[4]


def test_a_second_local_launcher_is_refused_while_the_first_holds_and_admitted_after(tmp_path: Path) -> None:
    folder = str(tmp_path / "batches")
    with launcher_lock(folder):
        with pytest.raises(LauncherBusy) as busy, launcher_lock(folder):
            pytest.fail("a second launcher got the lock")
        assert busy.value.holder["pid"] == os.getpid()
        assert f"pid {os.getpid()}" in str(busy.value)
    with launcher_lock(folder):  # released: the next launcher holds it
        pass


def test_a_killed_holders_lock_is_dropped_by_the_kernel(tmp_path: Path) -> None:
    folder = str(tmp_path / "batches")
    code = ("import sys; from transforms.engines.openai_batch.lock import FileLock; "
            "FileLock(sys.argv[1]).acquire(); print('held', flush=True); sys.stdin.read()")
    child = subprocess.Popen([sys.executable, "-c", code, folder], cwd=ROOT, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        with pytest.raises(LauncherBusy) as busy:
            FileLock(folder).acquire()
        assert busy.value.holder["pid"] == child.pid
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    lock = FileLock(folder)
    lock.acquire()  # no stale file to judge: the holder's death dropped the lock
    lock.release()


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_lease_refuses_a_live_holder_and_is_taken_over_when_not_renewed(tmp_path: Path) -> None:
    folder, clock = str(tmp_path / "batches"), Clock()
    first, second = Lease(folder, 60, clock), Lease(folder, 60, clock)
    first.acquire()
    clock.now += 59
    with pytest.raises(LauncherBusy):
        second.acquire()
    first.renew()  # renewed: another 60 s
    clock.now += 59
    with pytest.raises(LauncherBusy):
        second.acquire()
    clock.now += 61  # not renewed for longer than the lease
    second.acquire()
    with pytest.raises(LauncherBusy):  # the first learns it lost the run at its next renewal
        first.renew()
    first.release()  # not its lease any more: left alone
    assert json.loads((Path(folder) / LEASE).read_text())["token"] == second.token
    second.release()
    assert not (Path(folder) / LEASE).exists()


def test_a_lease_naming_a_dead_process_of_this_host_is_stale(tmp_path: Path) -> None:
    folder, clock = str(tmp_path / "batches"), Clock()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    dead = Lease(folder, 600, clock)
    dead.acquire()
    holder = json.loads((Path(folder) / LEASE).read_text())
    (Path(folder) / LEASE).write_text(json.dumps({**holder, "pid": int(gone.stdout)}))
    Lease(folder, 600, clock).acquire()  # at once, not after 600 s
    alive = Lease(folder, 600, clock)
    with pytest.raises(LauncherBusy):  # the holder now is this very process: alive
        alive.acquire()
