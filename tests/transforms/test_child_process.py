"""The killable child process: every item a request yields comes back in order; a request past its deadline
kills the child and a new one serves the next; a child that dies is reported with its exit code. A child
imports nothing from the folder it is started in; one that cannot start stops the run; its replies are
unpickled as the declared records and plain values only."""
from __future__ import annotations

import datetime as dt
import importlib
import os
import pickle
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pipelines import cli
from schemas.reasons import TIMEOUT, WORKER_CRASHED
from schemas.records import DocumentRow, PageRow
from tests.support import docmaker
from tests.support.raw import raw_rows
from transforms import child_process
from transforms.child_process import BadReply, ChildStartError, ChildWorker, load_reply


def echo(*args: object) -> Iterator[object]:
    """Work (runs in the child): each argument back, one reply each."""
    yield from args


def sleeps(seconds: float) -> Iterator[float]:
    time.sleep(seconds)
    yield seconds


def exits(code: int) -> Iterator[int]:
    os._exit(code)
    yield code


def test_ask_returns_every_item_in_order_and_reuses_the_child() -> None:
    worker = ChildWorker(echo)
    try:
        assert worker.ask((1, "two", b"3" * 200_000), 30) == ([1, "two", b"3" * 200_000], None, "")
        assert worker.ask((), 30) == ([], None, "")
        assert worker.started == 1
    finally:
        worker.stop()


def test_a_request_past_its_deadline_kills_the_child_and_the_next_is_served() -> None:
    worker = ChildWorker(sleeps)
    try:
        replies, stopped, detail = worker.ask((3600,), 1)
        assert (replies, stopped) == ([], TIMEOUT) and "1 s" in detail
        assert worker.ask((0,), 30) == ([0], None, "")
        assert worker.started == 2
    finally:
        worker.stop()


def test_a_child_that_dies_is_reported_and_replaced() -> None:
    worker = ChildWorker(exits)
    try:
        replies, stopped, detail = worker.ask((7,), 30)
        assert (replies, stopped) == ([], WORKER_CRASHED) and "exit code 7" in detail, detail
        assert worker.proc is None  # forgotten: the next request starts another
    finally:
        worker.stop()


def plant(folder: Path, marker: Path) -> None:
    """A hostile upload folder: packages named like pagemill's, whose import leaves `marker` behind."""
    for package in ("transforms", "schemas", "tests", "pipelines"):
        (folder / package).mkdir(parents=True)
        (folder / package / "__init__.py").write_text(
            f"import pathlib\npathlib.Path({str(marker)!r}).write_text('planted {package} ran')\n")


def test_a_child_imports_nothing_from_the_current_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Fails with the child started as `python -c ...` (no -P): the current folder comes first on its sys.path.
    uploads, marker = tmp_path / "uploads", tmp_path / "planted-code-ran"
    plant(uploads, marker)
    monkeypatch.chdir(uploads)
    worker = ChildWorker(echo)
    try:
        assert worker.ask((1, "two"), 60) == ([1, "two"], None, "")
    finally:
        worker.stop()
    assert not marker.exists(), marker.read_text()


def gone_module(folder: Path) -> Callable[..., Iterator[object]]:
    """Work from a module that the parent imported and that is then deleted: the child cannot unpickle it."""
    name = f"vanishing_{uuid.uuid4().hex}"
    (folder / f"{name}.py").write_text("def work(*args):\n    yield from args\n")
    sys.path.insert(0, str(folder))
    try:
        module = importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))
    (folder / f"{name}.py").unlink()
    return module.work  # type: ignore[no-any-return]


def test_a_child_that_cannot_start_stops_the_run_with_its_error(tmp_path: Path) -> None:
    # Fails before the fix: the child's failed import was a `worker_crashed` row per document, and the run exit 0.
    worker = ChildWorker(gone_module(tmp_path))
    try:
        with pytest.raises(ChildStartError, match=r"could not start: loading its work: ModuleNotFoundError"):
            worker.ask((1,), 60)
        assert worker.proc is None
    finally:
        worker.stop()


def test_replies_are_only_the_declared_records_and_plain_values() -> None:
    row = DocumentRow(source_uri="s3://b/k", bytes=3, outcome="rejected")
    assert load_reply(pickle.dumps(row), (DocumentRow,)) == row
    assert load_reply(pickle.dumps(("error", "x")), ()) == ("error", "x")
    when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert load_reply(pickle.dumps(when), ()) == when
    with pytest.raises(BadReply, match=r"posix\.system"):  # the classic: a reduce to a callable runs nothing
        load_reply(pickle.dumps(Reduces()), (DocumentRow,))
    with pytest.raises(BadReply, match="DocumentRow"):  # a record the worker did not declare
        load_reply(pickle.dumps(row), (PageRow,))
    with pytest.raises(BadReply, match="unexpected fields"):  # a declared record holding another object
        load_reply(pickle.dumps(DocumentRow(source_uri=("a", ["nested"]), bytes=3, outcome="x")),  # type: ignore[arg-type]
                   (DocumentRow,))
    with pytest.raises(BadReply, match="dict"):
        load_reply(pickle.dumps({"a": 1}), (DocumentRow,))


class Reduces:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("true",))


def test_a_child_that_sends_an_object_is_a_crash_of_that_request_only() -> None:
    worker = ChildWorker(sends_a_callable)
    try:
        replies, stopped, detail = worker.ask((), 60)
        assert (replies, stopped) == ([], WORKER_CRASHED) and "posix.system" in detail, detail
        assert worker.ask((), 60)[1] == WORKER_CRASHED and worker.started == 2  # each request gets a fresh child
    finally:
        worker.stop()


def sends_a_callable() -> Iterator[object]:
    """Work (runs in the child): a child taken over by a document answers with a pickle that calls os.system."""
    yield Reduces()


@pytest.mark.parametrize("workers", [1, 2], ids=["in_process", "beam_worker_processes"])
def test_a_run_started_in_an_upload_folder_runs_none_of_its_code(tmp_path: Path, workers: int) -> None:
    # Fails with `python -c` children (workers 1: the intake and render children import the planted packages)
    # and without PYTHONSAFEPATH (workers 2: Beam's SDK worker processes start as `python -m`, cwd first).
    uploads, marker = tmp_path / "uploads", tmp_path / "planted-code-ran"
    plant(uploads, marker)
    (uploads / "scan.pdf").write_bytes(docmaker.multipage_pdf(2))
    pagemill = Path(sys.executable).parent / "pagemill"
    run = subprocess.run([str(pagemill), "run", "--input", ".", "--output", str(tmp_path / "out"), "--run-id", "r",
                          "--extract", "false", "--hints", "none", "--workers", str(workers)],
                         cwd=uploads, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert not marker.exists(), marker.read_text()
    docs = {Path(r["source_uri"]).name: r for r in raw_rows(tmp_path / "out", "documents", "r")}
    assert docs["scan.pdf"]["outcome"] == "rendered", docs["scan.pdf"]


def test_a_run_whose_children_cannot_start_fails_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    # Fault injection: a child whose first line fails, as a broken install's import would (in-memory runner:
    # the DoFns run in this process). Before the fix: `worker_crashed` rows and exit 0.
    monkeypatch.setattr(child_process, "CHILD_COMMAND", "raise ImportError('no pagemill here')")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.pdf").write_bytes(docmaker.multipage_pdf(1))
    code = cli.main(["run", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--run-id", "r",
                     "--extract", "false", "--hints", "none", "--workers", "1", "--progress-every-s", "0"])
    err = capsys.readouterr().err
    assert code == 1, err[-3000:]
    said = "run r failed: ChildStartError: the intake process could not start: it exited with code 1"
    assert said in err, err[-3000:]


def test_the_childrens_work_modules_import_neither_beam_nor_the_model() -> None:
    """A render or intake child starts per worker and again after every timeout, in a fresh interpreter: its
    modules' imports are paid each time. Beam's (~1 s of CPU) was, through the DoFns that sat beside the render,
    hint and gate functions (they now live in each stage's stage.py)."""
    from transforms.child_process import child_env

    heavy = ("apache_beam", "torch", "vllm", "pyarrow", "boto3")
    code = ("import sys\n"
            "import transforms.document_work.work, transforms.pages.render, transforms.intake.inspection\n"
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-P", "-c", code], env=child_env(os.environ, sys.path),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
