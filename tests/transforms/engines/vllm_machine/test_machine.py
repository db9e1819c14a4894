"""The machine engine's worker side (engines/vllm_machine/engine.py) where the protocol tests do not look: how the
service process is started (its own session, its log, no stdin, its minimal environment, no inherited file
descriptors, a dead service's socket cleared, one that never listens), `abort` of a page no longer in flight, a
restart asked with an old start, a lost connection, a page over the frame limits or that cannot be sent, and the
worker's tokenizer. The service's loop: test_machine_service_loop.py; the protocol: test_machine_service.py."""
from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import threading
import types
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path

import pytest
from PIL import Image

from tests.support.feeding import vllm_request
from tests.support.machine_stubs import (
    SAMPLING,
    StubRemoteEngine,
    ThreadRemoteEngine,
    answer,
    failure_of,
    settings,
    wait_until,
)
from transforms.engines.base import (
    EngineDead,
    PageRequest,
    PageSource,
    PromptParts,
    RequestRejected,
    TokenBudget,
)
from transforms.engines.simulated import SimTokenizer
from transforms.engines.vllm_machine import engine as machine
from transforms.engines.vllm_machine import wire
from transforms.engines.vllm_machine.engine import SOCKET, VllmMachineEngine
from transforms.engines.vllm_machine.folder import prepare_folder, service_env
from transforms.model.prompt import json_prompt

IMG = Image.new("RGB", (4, 4))


class RecordingRemoteEngine(StubRemoteEngine):
    """The real `_spawn` of the stub's service process, its Popen kept for the test to look at."""

    proc: subprocess.Popen[bytes] | None = None

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.proc = super()._spawn()
        return self.proc


def fd_targets(pid: int) -> dict[int, str]:
    fds = Path(f"/proc/{pid}/fd")
    return {int(fd.name): os.readlink(fd) for fd in fds.iterdir()}


def test_the_service_process_is_detached_logs_to_its_file_and_inherits_nothing(folder: Path) -> None:
    """Its own session (a worker's process group being stopped does not stop the machine's engine), stdout and
    stderr in service.log, stdin /dev/null, the minimal environment, and none of the worker's descriptors: not
    even one the worker made inheritable."""
    leak_r, leak_w = os.pipe()
    os.set_inheritable(leak_r, True)
    saved_stdin, (stdin_r, stdin_w) = os.dup(0), os.pipe()
    os.dup2(stdin_r, 0)  # the worker's stdin is a pipe here: the service's /dev/null is its own, not inherited
    engine = RecordingRemoteEngine(settings(folder))
    try:
        assert answer(engine.submit(vllm_request("first", IMG), SAMPLING))["prompt"] == "first"
        proc = engine.proc
        assert proc is not None and proc.poll() is None
        assert os.getsid(proc.pid) == proc.pid != os.getsid(0)
        targets = fd_targets(proc.pid)
        log = str((folder / "service.log").resolve())
        assert (targets[0], targets[1], targets[2]) == (os.devnull, log, log)
        assert os.readlink(f"/proc/self/fd/{leak_r}") not in targets.values()
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        got = dict(item.decode().split("=", 1) for item in environ if item)
        assert got == service_env(os.environ, sys.path)
    finally:
        os.dup2(saved_stdin, 0)
        engine.close()
        for fd in (leak_r, leak_w, saved_stdin, stdin_r, stdin_w):
            os.close(fd)


def test_the_service_writes_to_the_runs_log_when_this_machine_has_its_folder(folder: Path, tmp_path: Path) -> None:
    """The launcher names the run's log (pipelines/run/run_log.py): the service's stdout and stderr go there, as the
    in-process engine's lines do; a log whose folder is not on this machine (a worker on another host) leaves the
    service with its own service.log."""
    run_log = tmp_path / "runs" / "tenant=t" / "r.log"
    run_log.parent.mkdir(parents=True)
    engine = RecordingRemoteEngine(replace(settings(folder), log_file=str(run_log)))
    try:
        assert answer(engine.submit(vllm_request("logged", IMG), SAMPLING))["prompt"] == "logged"
        assert engine.proc is not None
        targets = fd_targets(engine.proc.pid)
        assert (targets[1], targets[2]) == (str(run_log.resolve()), str(run_log.resolve()))
        assert oct(run_log.stat().st_mode)[-3:] == "600"
    finally:
        engine.close()
    elsewhere = VllmMachineEngine(replace(settings(folder), log_file=str(tmp_path / "not-here" / "r.log")))
    assert elsewhere.log_path() == folder / "service.log"


def test_a_dead_services_socket_file_is_cleared_before_a_new_service_listens(folder: Path) -> None:
    prepare_folder(folder)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(folder / SOCKET))  # a service that died: its socket file stays, nobody listens
    stale.close()
    engine = StubRemoteEngine(settings(folder))
    assert answer(engine.submit(vllm_request("after a death", IMG), SAMPLING))["prompt"] == "after a death"
    engine.close()


def test_abort_of_a_page_no_longer_in_flight_does_nothing(folder: Path) -> None:
    engine = ThreadRemoteEngine(settings(folder))
    answered = engine.submit(vllm_request("ok", IMG), SAMPLING)
    answer(answered)
    engine.abort(answered)  # already answered: nothing to free, its result stands
    assert answered.exception() is None
    engine.abort(Future())  # never submitted
    held = engine.submit(vllm_request("hold", IMG), SAMPLING)
    engine.abort(held)
    with pytest.raises(RuntimeError, match=r"^request aborted$"):
        held.result(timeout=60)
    assert wait_until((folder / "aborted").exists)  # the service freed it
    (folder / "aborted").unlink()
    engine.abort(held)  # twice: the second finds nothing
    still = engine.submit(vllm_request("hold", IMG), SAMPLING)
    engine.close()  # hung up: what was in flight fails at once, as on a lost connection
    assert isinstance(failure_of(still), EngineDead)
    assert not (folder / "aborted").exists()  # nothing but the first abort reached the engine
    engine._futures[99] = (None, still)  # in flight as the connection went: nothing to send the abort on, no error
    engine.abort(still)


def fake_vllm_tokenizers(monkeypatch: pytest.MonkeyPatch,
                         error: Exception | None = None) -> list[tuple[str, str | None]]:
    """vllm.tokenizers.get_tokenizer as the worker calls it, recorded, or failing with `error` (vLLM itself is
    not what is tested)."""
    calls: list[tuple[str, str | None]] = []

    def get_tokenizer(model: str, revision: str | None = None) -> SimTokenizer:
        calls.append((model, revision))
        if error is not None:
            raise error
        return SimTokenizer()

    module = types.ModuleType("vllm.tokenizers")
    module.get_tokenizer = get_tokenizer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.tokenizers", module)
    return calls


@pytest.mark.parametrize("local_model", [True, False])
def test_the_worker_loads_its_tokenizer_once_at_the_models_revision(folder: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    local_model: bool) -> None:
    """A hub model at the run's pinned revision; a model folder as it is (a revision means nothing there)."""
    calls = fake_vllm_tokenizers(monkeypatch)
    model = str(tmp_path) if local_model else "org/not-a-local-folder"
    engine = VllmMachineEngine(settings(folder, model=model, model_revision="abc123"))
    first = engine.tokenizer()
    assert isinstance(first, SimTokenizer) and engine.tokenizer() is first
    assert calls == [(model, None if local_model else "abc123")]


def test_a_tokenizer_that_cannot_load_fails_prepare_as_a_dead_engine_saying_why(folder: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    fake_vllm_tokenizers(monkeypatch, OSError("org/broken has no tokenizer files"))
    engine = VllmMachineEngine(settings(folder, model="org/broken"))
    with pytest.raises(EngineDead) as dead:
        engine.prepare(page_request_of(IMG))
    assert str(dead.value) == "its tokenizer: OSError: org/broken has no tokenizer files"


def page_request_of(img: Image.Image) -> PageRequest:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return PageRequest(PageSource(buf.getvalue(), 0, img.size), PromptParts(json_prompt({}), "none", ""),
                       TokenBudget(8192, 64, "qwen2_vl"))


def test_a_restart_asked_by_a_worker_that_saw_an_older_engine_restarts_nothing(folder: Path) -> None:
    """Two workers see the engine fail; the first restarts it, the second's restart (asked with the start it saw,
    or explicitly with an older one) finds it restarted already and only learns its start number."""
    first = ThreadRemoteEngine(settings(folder))
    answer(first.submit(vllm_request("a", IMG), SAMPLING))
    second = StubRemoteEngine(settings(folder))  # the same service, in this process's threads
    answer(second.submit(vllm_request("b", IMG), SAMPLING))
    assert (first.starts, second.starts) == (1, 1)
    first.restart()
    assert first.starts == 2
    second.restart()  # it saw start 1: the engine was restarted since
    assert second.starts == 2
    second.restart(1)
    first.restart(1)
    assert (first.starts, second.starts) == (2, 2)
    second.restart(2)  # the engine it saw is the running one: restarted
    assert second.starts == 3
    second.close()
    first.close()


def test_a_remote_engine_needs_its_service_folder(folder: Path) -> None:
    with pytest.raises(ValueError, match=r"^VllmMachineEngine needs VllmMachineSettings.service_dir$"):
        VllmMachineEngine(replace(settings(folder), service_dir=""))


def test_the_workers_reader_never_keeps_its_process_alive(folder: Path) -> None:
    """The thread that reads the service's answers is a daemon (a worker process that never closed its engine
    still exits), and is named for what it is."""
    engine = ThreadRemoteEngine(settings(folder))
    engine.start()
    readers = [t for t in threading.enumerate() if t.name == "pagemill-engine-client"]
    assert readers and all(t.daemon for t in readers)
    engine.close()


def test_a_lost_connection_fails_what_was_in_flight_and_the_next_page_reconnects(folder: Path) -> None:
    engine = ThreadRemoteEngine(settings(folder))
    held = engine.submit(vllm_request("hold", IMG), SAMPLING)
    lost = engine._connected()
    with socket.socket(fileno=os.dup(lost.fileno())) as sock:
        sock.shutdown(socket.SHUT_RD)  # the worker's reader sees the connection end
    with pytest.raises(EngineDead, match=r"^engine service connection lost$"):
        held.result(timeout=60)
    assert answer(engine.submit(vllm_request("again", IMG), SAMPLING))["prompt"] == "again"
    assert engine._connected() is not lost
    engine.close()


def test_a_page_over_the_frame_limits_is_refused_before_it_is_sent(folder: Path) -> None:
    engine = ThreadRemoteEngine(settings(folder))
    prompt = "p" * (wire.MAX_HEADER + 1)
    with pytest.raises(wire.FrameError) as why:
        wire.encode(wire.submit_header(1, prompt, SAMPLING.fields(), 0, IMG.size), wire.encode_png(IMG))
    with pytest.raises(RequestRejected) as refused:
        engine.submit(vllm_request(prompt, IMG), SAMPLING)
    assert str(refused.value) == str(why.value)
    assert not (folder / SOCKET).exists()  # refused before connecting: nothing crossed
    engine.close()


def test_a_page_that_cannot_be_sent_is_not_left_in_flight(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = ThreadRemoteEngine(settings(folder))
    conn = engine._connected()

    def broken(buf: bytes) -> None:
        raise BrokenPipeError("the service is gone")

    monkeypatch.setattr(conn, "send_bytes", broken)
    with pytest.raises(BrokenPipeError):
        engine.submit(vllm_request("p", IMG), SAMPLING)
    assert engine._futures == {}
    engine.close()


class SilentRemoteEngine(RecordingRemoteEngine):
    """A service that starts and never listens."""

    def service_argv(self) -> list[str]:
        return [sys.executable, "-c", "import time; time.sleep(120)"]


def test_a_service_that_never_listens_fails_saying_so(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "CONNECT_TIMEOUT_S", 1.0)
    engine = SilentRemoteEngine(settings(folder))
    try:
        with pytest.raises(EngineDead, match=r"^the engine service: RuntimeError: engine service did not listen in 1 s"
                                             r" \("):
            engine.start()
    finally:
        if engine.proc is not None:
            engine.proc.kill()
            engine.proc.wait()


class _Gone:
    """A connection whose service is gone: the reader's next receive ends."""

    def recv_bytes(self, *args: object) -> bytes:
        raise EOFError


def test_a_lost_connection_fails_only_the_requests_sent_on_it(tmp_path: Path) -> None:
    """After a shutdown and a new start, the old connection's reader may wake late: it fails what was sent on its
    own connection, never a request already sent on the new one (which would fail a page the new service holds)."""
    engine = VllmMachineEngine(settings(tmp_path / "svc"))
    old, new = _Gone(), object()
    on_old, on_new = Future(), Future()
    engine._futures = {1: (old, on_old), 2: (new, on_new)}
    engine._conn = new  # type: ignore[assignment]
    engine._read(old)  # type: ignore[arg-type]
    assert isinstance(on_old.exception(timeout=1), EngineDead)
    assert not on_new.done() and engine._futures == {2: (new, on_new)} and engine._conn is new
