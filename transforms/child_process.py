"""A long-lived child process that does work a deadline must be able to stop: the plumbing shared by the render
worker (transforms/pages/timed.py: a document's pages) and the intake worker (transforms/intake/timed.py:
opening a document to count its pages).

pdfium and Pillow cannot be interrupted inside a call, and a thread cannot be killed; only a process can. The
child is a fresh interpreter, not a fork (the Beam worker that owns it has gRPC threads, which `fork` would
copy half-way), and not multiprocessing's `spawn` (which re-imports the launching script as `__main__`). This
module imports nothing heavy, so a child whose work is light (intake) starts in a tenth of a second; the work
function's own module is imported when it is unpickled in the child.

Protocol: the parent sends the work function once (pickled by reference, or an object with `prepare()`),
the child answers READY; then, per request, the parent sends a tuple of arguments and the child sends every
item `work(*args)` yields, then DONE. The child gets no credentials (its environment is minimal) and does no
storage I/O.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from multiprocessing.connection import Connection
from typing import Any

DONE, READY = "done", "ready"
STARTUP_TIMEOUT_S = 120.0  # a child that cannot import its modules in this long is broken, not slow
TIMEOUT, CRASHED = "timeout", "worker_crashed"  # why ChildWorker.ask stopped short

CHILD_ENV_KEYS = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "TESSDATA_PREFIX")
# A --safety-check that needs a key of its own (a vendor service) reads it from a variable named so.
CHILD_ENV_PREFIXES = ("PAGEMILL_CHECK_",)
CHILD_COMMAND = "from transforms.child_process import child_main; child_main()"
Work = Callable[..., Iterator[Any]]


def python_argv(*args: str) -> list[str]:
    """Pure: the command line of a pagemill child interpreter. `-P` keeps the current folder (often a folder of
    uploads) off `sys.path`, so only the import path handed over in PYTHONPATH (see child_env) can supply code."""
    return [sys.executable, "-P", *args]


def child_env(environ: Mapping[str, str], path: list[str]) -> dict[str, str]:
    """Pure: the child's environment: what Python needs, and this process's import path; no credentials
    (the worker's environment holds Beam's PIPELINE_OPTIONS, storage keys among them)."""
    env = {k: v for k, v in environ.items() if k in CHILD_ENV_KEYS or k.startswith(CHILD_ENV_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    return env


def serve(requests: Connection, replies: Connection, work: Work) -> None:
    """The child's loop: a tuple of arguments in, each item out as it is finished, then DONE."""
    while True:
        try:
            args = requests.recv()
        except (EOFError, OSError):  # the parent is gone: so is this child's reason to live
            return
        for item in work(*args):
            replies.send(item)
        replies.send(DONE)


def child_main() -> None:
    """Entry point of the child: requests on stdin, replies on the original stdout. fd 1 is pointed at
    stderr, so that a library that prints cannot corrupt the reply stream."""
    replies = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)
    requests = Connection(os.dup(0), writable=False)
    work = requests.recv()  # the work function (pickled by reference), or an object with prepare()
    try:
        getattr(work, "prepare", lambda: None)()  # e.g. the classifier and checks: once, off any clock
    except Exception as err:  # noqa: BLE001 - told to the parent, which stops the run with it
        replies.send(("error", f"{type(err).__name__}: {err}"))
        return
    replies.send(READY)
    serve(requests, replies, work)


def _wait_s(now: float, doc_deadline: float, page_deadline: float) -> float | None:
    """Pure: how long to wait for the next item before a deadline passes (never negative; None: forever)."""
    deadline = min(doc_deadline, page_deadline)
    return None if deadline == float("inf") else max(0.0, deadline - now)


class ChildWorker:
    """One child process that runs `work` on one request at a time; killed and restarted on a deadline."""

    name = "worker process"
    prepare_failed = "the worker process could not prepare its work"

    def __init__(self, work: Work) -> None:
        self.work = work
        self.proc: subprocess.Popen[bytes] | None = None
        self.requests: Connection | None = None
        self.replies: Connection | None = None
        self.started = 0  # child processes started (a restart after a kill counts)
        self.reported = 0  # of those, already counted in a metric (new_starts)
        self.booted = False

    def new_starts(self) -> int:
        """Children started since the last call: a metric's increment (restarts after a kill show here)."""
        count, self.reported = self.started - self.reported, self.started
        return count

    def spawn(self) -> None:
        """Start a child if none is alive, without waiting for it (it boots while the caller works on)."""
        if self.proc is not None and self.proc.poll() is None:
            return
        self.stop()
        proc = subprocess.Popen(python_argv("-c", CHILD_COMMAND), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, env=child_env(os.environ, sys.path), close_fds=True)
        assert proc.stdin is not None and proc.stdout is not None
        self.requests = Connection(os.dup(proc.stdin.fileno()), readable=False)
        self.replies = Connection(os.dup(proc.stdout.fileno()), writable=False)
        proc.stdin.close()
        proc.stdout.close()
        self.proc, self.booted = proc, False
        self.started += 1
        self.requests.send(self.work)

    def _boot(self) -> float:
        """Spawn if needed and wait until the child is ready; the seconds waited (a child's start is not
        its request's time). Raises EOFError/OSError if it cannot start."""
        self.spawn()
        assert self.requests is not None and self.replies is not None
        if self.booted:
            return 0.0
        waited = time.monotonic()
        reply = self.replies.recv() if self.replies.poll(STARTUP_TIMEOUT_S) else None
        if isinstance(reply, tuple):  # its work could not be prepared: a configuration error, not this document's
            self.stop()
            raise RuntimeError(f"{self.prepare_failed}: {reply[1]}")
        if reply != READY:
            raise EOFError(f"the {self.name} did not start within {STARTUP_TIMEOUT_S:g} s")
        self.booted = True
        return time.monotonic() - waited

    def stop(self) -> None:
        """Kill the child (it may be deep inside pdfium: no polite way exists) and forget it."""
        for conn in (self.requests, self.replies):
            if conn is not None:
                conn.close()
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(timeout=30)
        self.proc = self.requests = self.replies = None

    def exit_code(self) -> int | None:
        """The child's exit status once it has died (the pipe closes a moment before it is there)."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None

    def ask(self, args: tuple[Any, ...], timeout_s: float) -> tuple[list[Any], str | None, str]:
        """Everything `work(*args)` yields in the child, within `timeout_s` of the child being ready (0: no
        limit), and why it stopped short: None (it did not), TIMEOUT (the child was killed and a new one
        is booting) or CRASHED (the child died; the next call starts another), with a detail."""
        try:
            self._boot()
            assert self.requests is not None and self.replies is not None
            conn = self.replies
            self.requests.send(args)
        except (EOFError, OSError) as err:  # the child could not start, or died between requests
            code = self.exit_code()
            self.stop()
            return [], CRASHED, f"the {self.name} is unavailable: {err} (exit code {code})"
        deadline = time.monotonic() + timeout_s if timeout_s > 0 else float("inf")
        items: list[Any] = []
        while True:
            try:
                ready = conn.poll(_wait_s(time.monotonic(), deadline, float("inf")))
                message = conn.recv() if ready else None
            except (EOFError, OSError):
                code = self.exit_code()
                self.stop()
                return items, CRASHED, f"the {self.name} died on this document (exit code {code})"
            if message is None:
                self.stop()
                self.spawn()  # the next request's child boots while this one's row goes downstream
                return items, TIMEOUT, f"the {self.name} was stopped after {timeout_s:g} s"
            if isinstance(message, str) and message == DONE:
                return items, None, ""
            items.append(message)
