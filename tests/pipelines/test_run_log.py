"""The run's log file and the screen (pipelines/run/run_log.py): what child processes, libraries' loggers and prints
write goes to the log; pagemill's own lines and its loggers' warnings (once each) to the screen; `--verbose` shows
the log too; everything is put back afterwards. No engine: a child Python process and loggers stand in for vLLM."""
from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pipelines.run.run_log import log_file, print_tail, run_log, screen_err, tail

CHILD = ("import os, sys\n"
         "print('child stdout', flush=True)\n"
         "print('child stderr', file=sys.stderr, flush=True)\n"
         "os.write(2, b'child fd 2\\n')\n")


@contextmanager
def library_logger() -> Iterator[logging.Logger]:
    """A library's logger with its own handler on the screen and no propagation, as vLLM configures its own (made in
    the test itself: the screen's stream is the test's capture)."""
    logger = logging.getLogger("a_library")
    handler = logging.StreamHandler(sys.stdout)
    logger.addHandler(handler)
    logger.propagate, level = False, logger.level
    logger.setLevel(logging.INFO)
    try:
        yield logger
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
        logger.setLevel(level)


def test_children_libraries_and_prints_go_to_the_log_and_pagemills_lines_to_the_screen(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with library_logger() as library:
        screen_and_log(tmp_path / "runs" / "tenant=t" / "r.log", library, capsys)


def screen_and_log(log: Path, library: logging.Logger, capsys: pytest.CaptureFixture[str]) -> None:
    fds_before = [os.fstat(fd).st_ino for fd in (1, 2)]
    stdout_before, stderr_before = sys.stdout, sys.stderr
    with run_log(log, False, "run r") as screen:
        subprocess.run([sys.executable, "-c", CHILD], check=True)
        print("a library's print")
        sys.stderr.write("a progress bar of a library\r")
        library.info("a library's info line")
        for _ in range(3):  # e.g. once a bundle: shown once
            logging.getLogger("transforms.some_stage").warning("a pagemill warning")
        logging.getLogger("pipelines.run.x").error("a pagemill error")
        logging.getLogger("transforms.some_stage").info("a pagemill info line")
        print("pagemill: a line of pagemill's", file=screen.err)
        assert screen_err() is screen.err  # for code that is not handed the screen
        print("pagemill: the summary", file=screen.out)
    out, err = capsys.readouterr()
    assert out == "pagemill: the summary\n"
    assert err == ("pagemill: warning: a pagemill warning\npagemill: error: a pagemill error\n"
                   "pagemill: a line of pagemill's\n")
    text = log.read_text()
    for line in ("child stdout", "child stderr", "child fd 2", "a library's print", "a progress bar of a library",
                 "a library's info line", "a pagemill warning", "a pagemill error", "a pagemill info line"):
        assert line in text, line
    assert text.startswith("=== pagemill run r ")
    # Put back: the streams, the descriptors, the library's handler.
    assert screen_err() is sys.stderr
    assert (sys.stdout, sys.stderr) == (stdout_before, stderr_before)
    assert [os.fstat(fd).st_ino for fd in (1, 2)] == fds_before
    library.info("after the run")
    out, err = capsys.readouterr()
    assert "after the run" in out, err
    assert "after the run" not in log.read_text()


def test_a_handler_made_during_the_run_writes_to_the_screen_after_it(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM makes its handler at its import, which comes during the run: it holds the run's stream."""
    logger = logging.getLogger("imported_during_the_run")
    logger.propagate = False
    try:
        with run_log(tmp_path / "r.log"):
            logger.addHandler(logging.StreamHandler(sys.stdout))
            logger.warning("during")
        logger.warning("after")
    finally:
        logger.handlers.clear()
        logger.propagate = True
    assert capsys.readouterr().out == "after\n"
    assert "during" in (tmp_path / "r.log").read_text()


def test_verbose_shows_the_log_on_the_screen_and_keeps_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "r.log"
    with run_log(log, True, "run r"):
        subprocess.run([sys.executable, "-c", CHILD], check=True)
        logging.getLogger("transforms.some_stage").warning("a pagemill warning")
    err = capsys.readouterr().err
    text = log.read_text()
    for line in ("child stdout", "child stderr", "child fd 2", "a pagemill warning"):
        assert line in err and line in text, line
    assert err.count("a pagemill warning") == 1  # the log's copy only, not a second line of the screen's


def test_the_tail_is_this_invocations_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "r.log"
    with run_log(log, False, "run r"):
        print("the killed invocation's line")
    with run_log(log, False, "run r"):
        for n in range(30):
            print(f"line {n}")
    assert tail(log, 3) == ["line 27", "line 28", "line 29"]
    assert "the killed invocation's line" not in "\n".join(tail(log, 100))
    screen = io.StringIO()
    print_tail(log, screen, "the model could not be used")
    lines = screen.getvalue().splitlines()
    assert lines[0] == f"pagemill: the model could not be used; the last lines of the log {log}:"
    assert lines[-1] == "pagemill:   | line 29" and len(lines) == 16
    assert tail(tmp_path / "none.log") == []


def test_the_log_lies_beside_the_manifest(tmp_path: Path) -> None:
    from schemas.layout import manifest_path

    manifest = Path(manifest_path(str(tmp_path), "acme", "r1"))
    assert log_file(str(tmp_path), "acme", "r1") == manifest.parent / "r1.log"
    remote = log_file("s3://bucket/out", "acme", "r1")  # not appendable there: a private local folder
    assert remote.name == "r1.log" and remote.parent.is_dir() and oct(remote.parent.stat().st_mode)[-3:] == "700"
    remote.parent.rmdir()


def test_a_log_that_cannot_be_written_goes_to_a_private_temp_folder(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    blocked = tmp_path / "runs"
    blocked.write_text("a file where the runs folder would be")
    with run_log(blocked / "tenant=t" / "r.log") as screen:
        print("a library's line")
    assert screen.log is not None and screen.log.name == "r.log" and screen.log.parent != blocked / "tenant=t"
    assert "a library's line" in screen.log.read_text()
    err = capsys.readouterr().err
    assert err.startswith(f"pagemill: warning: cannot write the log {blocked / 'tenant=t' / 'r.log'}") and \
        str(screen.log) in err
    screen.log.unlink()
    screen.log.parent.rmdir()
