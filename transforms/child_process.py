"""A long-lived child process that does work a deadline must be able to stop: the plumbing shared by the render
worker (transforms/document_work/timed.py: a document's pages) and the intake worker (transforms/intake/timed.py:
opening a document to count its pages).

pdfium and Pillow cannot be interrupted inside a call, and a thread cannot be killed; only a process can. The
child is a fresh interpreter, not a fork (the Beam worker that owns it has gRPC threads, which `fork` would
copy half-way), and not multiprocessing's `spawn` (which re-imports the launching script as `__main__`). This
module imports nothing heavy, so a child whose work is light (intake) starts in a tenth of a second; the work
function's own module is imported when it is unpickled in the child.

Protocol: the parent sends the work function once (pickled by reference, or an object with `prepare()`),
the child answers READY; then, per request, the parent sends a tuple of arguments and the child sends every
item `work(*args)` yields, then DONE. The child gets no credentials (its environment is minimal) and does no
storage I/O; its first act is `child_sandbox.isolate()`, and its parent is non-dumpable while it lives
(`child_sandbox.UNDUMPABLE`), so it cannot read the credentials in its ancestors' environments either.

The child runs pdfium and Pillow on untrusted bytes, so the parent trusts its replies no more than it must:
they are unpickled by `load_reply`, which builds only the record classes the worker declares (`reply_types`)
and plain values, never an arbitrary class or callable. A child that cannot start (its imports or its work
fail before READY) is not a document's fault: `ChildStartError` stops the run with the child's error.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import io
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from multiprocessing.connection import Connection
from typing import Any

from schemas.reasons import TIMEOUT, WORKER_CRASHED
from transforms.child_sandbox import UNDUMPABLE, isolate

DONE, READY = "done", "ready"
STARTUP_TIMEOUT_S = 120.0  # a child that cannot import its modules in this long is broken, not slow

CHILD_ENV_KEYS = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "TESSDATA_PREFIX")
# A --safety-check that needs a key of its own (a vendor service) reads it from a variable named so.
CHILD_ENV_PREFIXES = ("PAGEMILL_CHECK_",)
# The child's first line: an import that fails (a broken install) is told to the parent as an ("error", ...) reply.
CHILD_COMMAND = ("from multiprocessing.connection import Connection\n"
                 "try:\n"
                 "    from transforms.child_process import child_main\n"
                 "except BaseException as err:\n"
                 "    why = f'importing pagemill: {type(err).__name__}: {err}'\n"
                 "    Connection(1, readable=False).send(('error', why))\n"
                 "    raise SystemExit(70) from err\n"
                 "child_main()")
Work = Callable[..., Iterator[Any]]
# What a reply may hold besides the worker's record classes: plain values (and datetimes, for timestamps).
PLAIN = (str, int, float, bool, bytes, type(None), dt.datetime)
_DATETIME = {("datetime", "datetime"): dt.datetime, ("datetime", "timezone"): dt.timezone,
             ("datetime", "timedelta"): dt.timedelta}


class ChildStartError(RuntimeError):
    """The child process could not start: a broken install or configuration, which stops the run."""


class BadReply(ValueError):
    """A reply that is not what the protocol allows (a class outside the worker's types, a bad field)."""


class _RepliesUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, types: tuple[type, ...]) -> None:
        super().__init__(io.BytesIO(data))
        self.allowed = {**_DATETIME, **{(t.__module__, t.__qualname__): t for t in types}}

    def find_class(self, module: str, name: str) -> Any:
        found = self.allowed.get((module, name))
        if found is None:
            raise BadReply(f"a reply named {module}.{name}, which the protocol does not allow")
        return found


def _plain(value: Any) -> bool:
    return isinstance(value, PLAIN) or (isinstance(value, tuple) and all(isinstance(v, PLAIN) for v in value))


def load_reply(data: bytes, types: tuple[type, ...]) -> Any:
    """Pure: one reply from the child, unpickled with no class but `types` (and datetime's), then checked:
    a protocol word, an ("error", text) tuple, a plain value, or an instance of `types` whose fields are plain
    values. Raises BadReply otherwise."""
    reply = _RepliesUnpickler(data, types).load()
    if dataclasses.is_dataclass(reply) and isinstance(reply, types):
        names = {f.name for f in dataclasses.fields(reply)}
        bad = sorted(n for n in names if not _plain(getattr(reply, n, None))) or sorted(set(vars(reply)) ^ names)
        if bad:
            raise BadReply(f"a {type(reply).__name__} reply with unexpected fields {bad}")
        return reply
    if _plain(reply):
        return reply
    raise BadReply(f"a reply of type {type(reply).__name__}, which the protocol does not allow")


def keep_cwd_off_python_paths(environ: MutableMapping[str, str]) -> None:
    """Every Python process the run starts (Beam's SDK workers start as `python -m`, which puts the current
    folder first on sys.path) leaves the current folder off its import path: PYTHONSAFEPATH is `-P`."""
    environ["PYTHONSAFEPATH"] = "1"


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
    isolate()  # before anything is read: out of reach of the parent's environment (transforms/child_sandbox.py)
    replies = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)
    requests = Connection(os.dup(0), writable=False)
    step = "loading its work"
    try:
        work = requests.recv()  # the work function (pickled by reference), or an object with prepare()
        step = "preparing its work"
        getattr(work, "prepare", lambda: None)()  # e.g. the classifier and checks: once, off any clock
    except Exception as err:  # noqa: BLE001 - told to the parent, which stops the run with it
        replies.send(("error", f"{step}: {type(err).__name__}: {err}"))
        return
    replies.send(READY)
    serve(requests, replies, work)


def wait_s(now: float, doc_deadline: float, page_deadline: float) -> float | None:
    """Pure: how long to wait for the next item before a deadline passes (never negative; None: forever)."""
    deadline = min(doc_deadline, page_deadline)
    return None if deadline == float("inf") else max(0.0, deadline - now)


class ChildWorker:
    """One child process that runs `work` on one request at a time; killed and restarted on a deadline."""

    name = "worker process"
    prepare_failed = "the worker process could not start"
    reply_types: tuple[type, ...] = ()  # the record classes a reply may hold (besides plain values)

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
        UNDUMPABLE.hold()  # this process's environ unreadable to its uid while the child lives (released in stop)
        try:
            proc = subprocess.Popen(python_argv("-c", CHILD_COMMAND), stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, env=child_env(os.environ, sys.path), close_fds=True)
        except BaseException:
            UNDUMPABLE.release()
            raise
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
        its request's time). Raises ChildStartError if it cannot start."""
        try:
            self.spawn()
        except OSError as err:  # no process at all (no memory, no file descriptors)
            raise ChildStartError(f"{self.prepare_failed}: {type(err).__name__}: {err}") from err
        assert self.requests is not None and self.replies is not None
        if self.booted:
            return 0.0
        waited = time.monotonic()
        answered, reply = self.replies.poll(STARTUP_TIMEOUT_S), None
        try:
            reply = self.receive() if answered else None
        except (EOFError, OSError, BadReply, pickle.UnpicklingError):
            pass
        if reply != READY:  # no document was sent yet: not a document's fault, so the run stops here
            code = self.exit_code() if answered else None
            self.stop()
            if isinstance(reply, tuple) and len(reply) == 2 and reply[0] == "error":
                raise ChildStartError(f"{self.prepare_failed}: {reply[1]}")
            why = (f"it exited with code {code} (its error is on stderr)" if answered
                   else f"it did not answer within {STARTUP_TIMEOUT_S:g} s")
            raise ChildStartError(f"{self.prepare_failed}: {why}")
        self.booted = True
        return time.monotonic() - waited

    def receive(self) -> Any:
        """The next reply (load_reply: only `reply_types` and plain values). Raises EOFError/OSError when the
        child is gone, BadReply on anything else."""
        assert self.replies is not None
        return load_reply(self.replies.recv_bytes(), self.reply_types)

    def stop(self) -> None:
        """Kill the child (it may be deep inside pdfium: no polite way exists) and forget it."""
        for conn in (self.requests, self.replies):
            if conn is not None:
                conn.close()
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(timeout=30)
            UNDUMPABLE.release()
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
        is booting) or WORKER_CRASHED (the child died; the next call starts another), with a detail."""
        try:
            self._boot()
            assert self.requests is not None and self.replies is not None
            conn = self.replies
            self.requests.send(args)
        except (EOFError, OSError) as err:  # the child died between requests
            code = self.exit_code()
            self.stop()
            return [], WORKER_CRASHED, f"the {self.name} is unavailable: {err} (exit code {code})"
        deadline = time.monotonic() + timeout_s if timeout_s > 0 else float("inf")
        items: list[Any] = []
        while True:
            try:
                ready = conn.poll(wait_s(time.monotonic(), deadline, float("inf")))
                message = self.receive() if ready else None
            except (EOFError, OSError):
                code = self.exit_code()
                self.stop()
                return items, WORKER_CRASHED, f"the {self.name} died on this document (exit code {code})"
            except (BadReply, pickle.UnpicklingError) as err:  # a child the document subverted: it is replaced
                self.stop()
                return items, WORKER_CRASHED, f"the {self.name} broke the protocol on this document: {err}"[:500]
            if message is None:
                self.stop()
                self.spawn()  # the next request's child boots while this one's row goes downstream
                return items, TIMEOUT, f"the {self.name} was stopped after {timeout_s:g} s"
            if isinstance(message, str) and message == DONE:
                return items, None, ""
            items.append(message)
