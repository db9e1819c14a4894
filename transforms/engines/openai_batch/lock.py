"""One launcher per run's batches: `launcher_lock(folder)` is held by the launcher (pipelines/run/batches.py) and by
`pagemill cancel` for as long as they read and write the run's batch state (files.py), so that two launchers of one
run never both turn the same spool into batches, nor overwrite each other's state. A second one is refused at once
(LauncherBusy: the caller exits 75 with the holder's host, pid and time), never made to wait.

- A local folder: `launcher.lock`, held with flock(LOCK_EX | LOCK_NB) on an open descriptor. The kernel drops it
  when the holder's process ends in any way (kill -9 included), so there is no stale lock to judge; the file keeps
  the holder's host/pid/time only to name it. (flock on NFS is as good as the NFS server's locking.)
- Object storage (s3://, gs://): no conditional create through Beam's FileSystems, so the rule is "one launcher
  per run id", kept by a lease: `launcher.lease` holding {host, pid, at, token}, renewed every `lease_s / 3`
  while held (a thread) and deleted at the end. A lease is stale (taken over) when it was not renewed for
  `lease_s`, or when it names this host and a pid that no longer runs. Taking one is a write and a read back of
  our token; two launchers started within the same instant could both write, and the later write wins the read
  back of both only when the store is read-after-write consistent (S3 and GCS are): the loser sees a foreign token
  and is refused.
"""
from __future__ import annotations

import datetime as dt
import errno
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from schemas import layout
from transforms.store.listing_file import read_whole, write_whole

LOCK, LEASE = "launcher.lock", "launcher.lease"
LEASE_S = 600.0  # object storage: a lease not renewed for this long is stale


class LauncherBusy(Exception):
    """Another launcher holds the run's batches."""

    def __init__(self, holder: dict[str, Any]) -> None:
        self.holder = holder
        super().__init__(f"another launcher holds this run's batches (host {holder.get('host', '?')}, pid "
                         f"{holder.get('pid', '?')}, since {holder.get('at', '?')})")


def is_local(folder: str) -> bool:
    return "://" not in folder or folder.startswith("file://")


def me(now: float, token: str) -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "token": token,
            "at": dt.datetime.fromtimestamp(now, dt.UTC).isoformat(timespec="seconds"), "t": now}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it runs
        return True
    return True


def stale(holder: dict[str, Any], now: float, lease_s: float) -> bool:
    """Whether a lease may be taken over: not renewed for `lease_s`, or its process on this host is gone."""
    if now - float(holder.get("t") or 0) >= lease_s:
        return True
    return holder.get("host") == socket.gethostname() and not pid_alive(int(holder.get("pid") or 0))


class FileLock:
    """A local folder's flock (see the module's text)."""

    def __init__(self, folder: str) -> None:
        self.path = os.path.join(folder.removeprefix("file://"), LOCK)
        self.fd: int | None = None

    def acquire(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        import fcntl

        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            text = os.pread(fd, 4096, 0)
            os.close(fd)
            if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
            raise LauncherBusy(_parse(text)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me(time.time(), uuid.uuid4().hex)).encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)  # not unlinked: a waiting opener of the old file would lock a ghost
            os.close(self.fd)  # closing drops the flock
            self.fd = None


class Lease:
    """An object store's lease (see the module's text); works on any FileSystems path."""

    def __init__(self, folder: str, lease_s: float = LEASE_S, clock: Callable[[], float] = time.time) -> None:
        self.uri, self.lease_s, self.clock = layout.join_uri(folder, LEASE), lease_s, clock
        self.token = uuid.uuid4().hex
        self.held = False

    def _holder(self) -> dict[str, Any] | None:
        data = read_whole(self.uri)
        return None if data is None else _parse(data)

    def acquire(self) -> None:
        holder = self._holder()
        now = self.clock()
        if holder is not None and holder.get("token") != self.token and not stale(holder, now, self.lease_s):
            raise LauncherBusy(holder)
        write_whole(self.uri, json.dumps(me(now, self.token)).encode())
        back = self._holder() or {}
        if back.get("token") != self.token:  # another launcher wrote after us: it holds the run
            raise LauncherBusy(back)
        self.held = True

    def renew(self) -> None:
        """Write the lease's time again; LauncherBusy when another launcher took it over meanwhile."""
        holder = self._holder() or {}
        if holder.get("token") != self.token:
            self.held = False
            raise LauncherBusy(holder)
        write_whole(self.uri, json.dumps(me(self.clock(), self.token)).encode())

    def release(self) -> None:
        if self.held and (self._holder() or {}).get("token") == self.token:
            from apache_beam.io.filesystems import FileSystems

            FileSystems.delete([self.uri])
        self.held = False


def _parse(data: bytes) -> dict[str, Any]:
    try:
        found = json.loads(data or b"{}")
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


@contextmanager
def launcher_lock(folder: str, lease_s: float = LEASE_S) -> Iterator[None]:
    """Hold the run's batches for the block, or raise LauncherBusy at once."""
    if is_local(folder):
        lock = FileLock(folder)
        lock.acquire()
        try:
            yield
        finally:
            lock.release()
        return
    lease = Lease(folder, lease_s)
    lease.acquire()
    done = threading.Event()

    def renew() -> None:  # the pipeline's pass may outlast a lease: renewed beside it
        while not done.wait(lease_s / 3):
            try:
                lease.renew()
            except LauncherBusy:
                return
            except Exception:  # noqa: BLE001 - a failed renewal is tried again at the next beat
                continue

    beat = threading.Thread(target=renew, name="batch-lease", daemon=True)
    beat.start()
    try:
        yield
    finally:
        done.set()
        beat.join(timeout=5)
        lease.release()
