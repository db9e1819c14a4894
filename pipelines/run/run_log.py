"""A run's log file and the screen. pagemill's own lines (progress, its warnings and errors, the summary) go to the
screen; everything else a run's processes write (vLLM and its engine core process, torch, triton, Beam's workers,
tqdm bars, Python warnings of dependencies) goes to a log file of the run, beside its manifest
(`runs/tenant=<t>/<run_id>.log`); `--verbose` shows it on the screen too.

Set up once at the start of a run, from its options, and undone at its end (tests run several runs in one process):
- the process's file descriptors 1 and 2 point at the log, so every child process started during the run (vLLM's
  engine core, Beam's SDK workers, the machine's engine service when it is given no file of its own) writes
  there, and so does C code;
- `sys.stdout` and `sys.stderr` are the log as well (tqdm, print, `warnings`), and so are the logging handlers
  that wrote to the screen (vLLM's own handler, the root logger's);
- pagemill's lines go through `Screen`, which keeps the screen's streams as they were when the run began (a copy
  of the terminal's descriptors), and its loggers' warnings and errors (`pipelines`, `transforms`, `schemas`) are
  shown there once each.
No environment variable is written: a child process inherits the descriptors.
"""
from __future__ import annotations

import io
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from schemas import layout

PAGEMILL_LOGGERS = ("pipelines", "transforms", "schemas")
HEADER = "=== pagemill"  # each invocation's first line in the log: a tail reads from the last one
TAIL_LINES = 15
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_file(output: str, tenant: str, run_id: str) -> Path:
    """Where a run's log goes: beside its manifest when the output is a local folder; for an object store (a file
    there cannot be appended to as the run goes), a private folder of this machine's temp dir, named in the summary."""
    manifest = layout.manifest_path(output, tenant, run_id)
    if "://" not in manifest:
        return Path(manifest[: -len(".json")] + ".log")
    return Path(tempfile.mkdtemp(prefix=f"pagemill-{run_id}-")) / f"{run_id}.log"  # 0700, unguessable


def publish(log: Path, manifest_uri: str) -> str:
    """Where the summary says the log is: beside a local manifest already; for an object store, a copy of the local
    log written beside the manifest once the run is finished (a file there cannot be appended to as the run goes)."""
    if "://" not in manifest_uri:
        return str(log)
    from apache_beam.io.filesystems import FileSystems

    uri = manifest_uri[: -len(".json")] + ".log"
    try:
        with open(log, "rb") as source, FileSystems.create(uri) as target:
            shutil.copyfileobj(source, target)
    except Exception as err:  # noqa: BLE001 - the tables and the manifest are written: the log stays local
        print(f"pagemill: warning: the log was not copied to {uri} ({type(err).__name__}: {err})", file=screen_err())
        return str(log)
    return f"{uri} (and {log})"


class Screen:
    """pagemill's own output: the stdout and stderr the run began with. A status line (progress) on a terminal is
    redrawn in place (`\\r`); any other line first ends it, so nothing is written over it."""

    def __init__(self, out: IO[str], err: IO[str]) -> None:
        self.lock = threading.RLock()
        self.log: Path | None = None  # the log file of the block (run_log)
        self.status_open: IO[str] | None = None  # the stream whose last line is an unfinished status line
        self.out, self.err = ScreenStream(self, out), ScreenStream(self, err)

    def end_status(self) -> None:
        with self.lock:
            if self.status_open is not None:
                self.status_open.write("\n")
                self.status_open.flush()
                self.status_open = None


class ScreenStream(io.TextIOBase):
    """One of the screen's streams, for `print(..., file=...)`; a write that starts with `\\r` is a status line."""

    def __init__(self, screen: Screen, target: IO[str]) -> None:
        super().__init__()
        self.screen, self.target = screen, target

    def write(self, text: str) -> int:
        with self.screen.lock:
            if text.startswith("\r"):
                self.screen.status_open = None if text.endswith("\n") else self.target
            elif text:
                self.screen.end_status()
            self.target.write(text)
            if text.startswith("\r"):
                self.target.flush()
        return len(text)

    def flush(self) -> None:
        self.target.flush()

    def isatty(self) -> bool:
        try:
            return bool(self.target.isatty())
        except (AttributeError, ValueError):
            return False


class _Once(logging.Filter):
    """Each warning or error once on the screen (a stage's warning can come from every bundle)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[int, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.levelno, record.getMessage())
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


class _Levelled(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        level = "error" if record.levelno >= logging.ERROR else "warning"
        return f"pagemill: {level}: {record.getMessage()}"


_ACTIVE: list[Screen] = []  # the screen of the run under way in this process (run_log), for `screen_err`


def screen_err() -> IO[str]:
    """Where a line of pagemill's goes from code that is not handed the run's Screen (pipelines/run/batches.py): the
    screen's stderr while a run is under way, else sys.stderr."""
    return _ACTIVE[-1].err if _ACTIVE else sys.stderr


def _kept(stream: IO[str], fd: int) -> tuple[IO[str], IO[str] | None]:
    """The screen's stream as it is now: when it writes to `fd` (about to point at the log), a copy of that
    descriptor; else (a test's capture) the stream itself. The second value is what to close at the end."""
    try:
        same = stream.fileno() == fd
    except (AttributeError, OSError, ValueError):
        same = False
    if not same:
        return stream, None
    stream.flush()
    copy = open(os.dup(fd), "w", buffering=1, encoding=getattr(stream, "encoding", None) or "utf-8",
                errors="backslashreplace")
    return copy, copy


def _pump(read_fd: int, log_fd: int, screen: IO[str]) -> None:
    """--verbose: what the run's processes write goes to the log and to the screen."""
    with open(read_fd, "rb", buffering=0) as pipe:
        for chunk in iter(lambda: pipe.read(65536), b""):
            os.write(log_fd, chunk)
            try:
                screen.write(chunk.decode(errors="replace"))
                screen.flush()
            except (OSError, ValueError):
                pass  # a closed screen loses the copy, not the log


@contextmanager
def run_log(path: Path, verbose: bool = False, title: str = "") -> Iterator[Screen]:
    """For the block: the library and child-process output goes to `path` (appended: a resume adds to it), and the
    Screen for pagemill's own lines. Everything is put back at the end."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError as err:  # the run may still write its tables (another user's runs/ folder, a full disk)
        fallback = Path(tempfile.mkdtemp(prefix="pagemill-log-")) / path.name
        print(f"pagemill: warning: cannot write the log {path} ({err}); it goes to {fallback}", file=sys.stderr)
        path = fallback
        log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %z")
    os.write(log_fd, f"{HEADER} {title} {stamp} (pid {os.getpid()})\n".encode())
    old_out, old_err = sys.stdout, sys.stderr
    out, close_out = _kept(old_out, 1)
    err, close_err = _kept(old_err, 2)
    screen = Screen(out, err)
    screen.log = path
    pump: threading.Thread | None = None
    target = log_fd
    if verbose:
        read_fd, target = os.pipe()
        pump = threading.Thread(target=_pump, args=(read_fd, log_fd, screen.err), name="pagemill-log", daemon=True)
        pump.start()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    for fd in (1, 2):
        os.dup2(target, fd)
    # Python's own writers: 1 and 2 now hold the log. Not closed at the end: a handler made during the run (vLLM's,
    # at its import) may keep one, and then writes wherever 1 and 2 point again.
    log_out = open(1, "w", buffering=1, closefd=False, errors="backslashreplace")
    log_err = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")
    sys.stdout, sys.stderr = log_out, log_err
    undo = _route_logging({old_out: log_out, old_err: log_err}, log_err, screen, verbose)
    _ACTIVE.append(screen)
    try:
        yield screen
    finally:
        _ACTIVE.remove(screen)
        undo()
        for stream in (log_out, log_err):
            stream.flush()
        sys.stdout, sys.stderr = old_out, old_err
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        if target != log_fd:
            os.close(target)  # the pump ends once the run's child processes have closed their copies too
        if pump is not None:
            pump.join(timeout=5.0)
        if pump is None or not pump.is_alive():
            os.close(log_fd)
        screen.end_status()
        for stream in (close_out, close_err):
            if stream is not None:
                stream.close()


def _route_logging(moved: dict[Any, IO[str]], log: IO[str], screen: Screen, verbose: bool) -> Any:
    """Handlers that wrote to the screen write to the log, and so does the root logger (pagemill's loggers from INFO
    up); pagemill's warnings and errors are shown on the screen once each. Returns what undoes it."""
    root = logging.getLogger()
    loggers = [root] + [lg for lg in root.manager.loggerDict.values() if isinstance(lg, logging.Logger)]
    repointed: list[tuple[logging.StreamHandler[Any], Any]] = []
    removed: list[logging.Handler] = []
    for logger in loggers:
        for handler in list(logger.handlers):
            if type(handler) is logging.StreamHandler and handler.stream in moved:
                if logger is root:  # the run's own handler below writes the root's records
                    root.removeHandler(handler)
                    removed.append(handler)
                else:
                    repointed.append((handler, handler.stream))
                    handler.setStream(moved[handler.stream])
    to_log = logging.StreamHandler(log)
    to_log.setFormatter(logging.Formatter(LOG_FORMAT))
    root.addHandler(to_log)
    # pagemill's own INFO lines (an engine's start, its time) in the log; the libraries' at their own levels (Beam's
    # INFO is hundreds of lines a run; vLLM's handler has its own level).
    levels = {name: logging.getLogger(name).level for name in PAGEMILL_LOGGERS}
    for name in PAGEMILL_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO)
    shown = logging.StreamHandler(screen.err)
    shown.setLevel(logging.WARNING)
    shown.addFilter(_Once())
    shown.setFormatter(_Levelled())
    if not verbose:  # verbose: the log itself is on the screen
        for name in PAGEMILL_LOGGERS:
            logging.getLogger(name).addHandler(shown)

    def undo() -> None:
        for name in PAGEMILL_LOGGERS:
            logging.getLogger(name).removeHandler(shown)
        root.removeHandler(to_log)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        for handler in removed:
            root.addHandler(handler)
        for handler, stream in repointed:
            handler.setStream(stream)
        for logger in [root] + [lg for lg in root.manager.loggerDict.values() if isinstance(lg, logging.Logger)]:
            for handler in logger.handlers:  # made during the run (vLLM's, at its import): back to the screen
                if type(handler) is logging.StreamHandler and handler.stream in moved.values():
                    handler.setStream(moved_back(moved, handler.stream))

    return undo


def moved_back(moved: dict[Any, IO[str]], stream: IO[str]) -> Any:
    return next(old for old, new in moved.items() if new is stream)


@contextmanager
def command_log(command: str) -> Iterator[Screen]:
    """A command without a run (`pagemill estimate`): the libraries' lines go to a log of its own in a private temp
    folder, named on the screen when anything was written there, else removed."""
    folder = Path(tempfile.mkdtemp(prefix=f"pagemill-{command}-"))
    path = folder / f"{command}.log"
    try:
        with run_log(path, False, command) as screen:
            yield screen
    finally:
        if tail(path):
            print(f"pagemill {command}: the libraries' lines are in {path}", file=sys.stderr)
        else:
            shutil.rmtree(folder, ignore_errors=True)


def tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    """The last `lines` lines this invocation wrote to the log (after its header), for a failure's cause."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - 65536))
            text = handle.read().decode(errors="replace")
    except OSError:
        return []
    found = text.rsplit(HEADER, 1)
    body = found[1].split("\n", 1)[1] if len(found) == 2 and "\n" in found[1] else text
    kept = [line.rstrip()[-300:] for line in body.replace("\r", "\n").splitlines() if line.strip()]
    return kept[-lines:]


def print_tail(path: Path, err: IO[str], why: str) -> None:
    """A failure's cause on the screen: the log's last lines and where the rest is."""
    lines = tail(path)
    if not lines:
        return
    print(f"pagemill: {why}; the last lines of the log {path}:", file=err)
    for line in lines:
        print(f"pagemill:   | {line}", file=err)
