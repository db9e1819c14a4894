"""The engine service's own loop (transforms/engines/vllm_machine/service.py), run in threads of the test where mutmut
sees it: `serve`, a failed accept, the idle exit on a fake clock, the counting engine, failures and their messages
on the socket, a failed restart, a peer that fails the handshake, a malformed frame, one connection serving on
after every kind of failure, and a late abort."""
from __future__ import annotations

import os
import re
import threading
import types
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tests.support.feeding import vllm_request
from tests.support.machine_stubs import (
    SAMPLING,
    Running,
    StubEngine,
    StubRemoteEngine,
    ThreadRemoteEngine,
    answer,
    failure_of,
    raw_client,
    settings,
)
from transforms.engines.base import (
    PageSource,
    Prepared,
    RequestRejected,
)
from transforms.engines.vllm_local import engine as local
from transforms.engines.vllm_machine import engine as machine
from transforms.engines.vllm_machine import service as machine_service
from transforms.engines.vllm_machine import wire
from transforms.engines.vllm_machine.folder import read_authkey
from transforms.engines.vllm_machine.service import Service

IMG = Image.new("RGB", (4, 4))


def test_serve_listens_for_workers_and_starts_its_idle_exit_beside_them(folder: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The service's main loop, here in a thread of the test: the run's engine settings, read from the folder,
    make a local engine (no service folder: not another service); the idle exit watches in a daemon thread."""
    started: list[tuple[Service, bool]] = []
    watching = threading.Event()

    def idle_exit(service: Service) -> None:  # the real one ends the process
        started.append((service, threading.current_thread().daemon))
        watching.set()

    monkeypatch.setattr(machine_service, "exit_when_idle", idle_exit)
    monkeypatch.setattr(machine, "CONNECT_TIMEOUT_S", 30.0)

    class ServedInThread(StubRemoteEngine):
        def _spawn(self) -> Running:  # type: ignore[override]
            threading.Thread(target=machine_service.serve, args=(self.directory, StubEngine), daemon=True).start()
            return Running()

    engine = ServedInThread(settings(folder))
    try:
        assert answer(engine.submit(vllm_request("served", IMG), SAMPLING))["prompt"] == "served"
        assert watching.wait(timeout=60)
    finally:
        engine.close()
        for service, _ in started:
            service.stop()
    (service, daemon), = started
    assert daemon and isinstance(service.engine, StubEngine)
    assert service.engine.settings == settings(folder).vllm
    assert service.engine.settings.kind == "vllm_local"


class FailingListener:
    """A listener whose accept fails (a worker gone mid-connect, too many open files), then is stopped."""

    def __init__(self, service: Service, failures: int) -> None:
        self.service, self.failures, self.calls = service, failures, 0

    def accept(self) -> Any:
        self.calls += 1
        if self.calls > self.failures:
            self.service.stopped.set()
        raise OSError(24, "Too many open files")

    def close(self) -> None:
        pass


def test_a_failed_accept_is_logged_and_the_service_accepts_on(caplog: pytest.LogCaptureFixture) -> None:
    service = Service(listener=None, engine=None, authkey=b"")  # type: ignore[arg-type]
    service.listener = FailingListener(service, failures=2)  # type: ignore[assignment]
    with caplog.at_level("WARNING", logger=machine_service.__name__):
        machine_service.accept_workers(service)  # returns once stopped
    assert service.listener.calls == 3  # type: ignore[attr-defined]
    failed = "engine service: accept failed: [Errno 24] Too many open files"
    assert [r.getMessage() for r in caplog.records] == [failed, failed]
    assert service.state["clients"] == 0


class Exited(Exception):
    pass


class Clock:
    """time.sleep and time.monotonic for exit_when_idle, and os._exit: each sleep moves the clock on and may
    change the service's state (a worker leaving at `leaves_at`)."""

    def __init__(self, service: Service, leaves_at: float) -> None:
        self.now, self.service, self.leaves_at = 1000.0, service, leaves_at
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        if self.now >= self.leaves_at and self.service.state["clients"]:
            self.service.state.update(clients=0, idle_since=self.now)

    def monotonic(self) -> float:
        return self.now

    def exit(self, code: int) -> None:
        raise Exited(code, self.now)


def test_the_service_exits_once_idle_for_its_grace_period_never_while_a_worker_is_connected(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    service = Service(listener=None, engine=None, authkey=b"")  # type: ignore[arg-type]
    service.state.update(clients=1, idle_since=0.0)  # long ago: a connected worker keeps it alive anyway
    clock = Clock(service, leaves_at=1000.0 + 3 * machine_service.IDLE_EXIT_S)
    monkeypatch.setattr(machine_service, "time", types.SimpleNamespace(sleep=clock.sleep, monotonic=clock.monotonic))
    monkeypatch.setattr(machine_service, "os", types.SimpleNamespace(_exit=clock.exit))
    with pytest.raises(Exited) as exited, caplog.at_level("INFO", logger=machine_service.__name__):
        machine_service.exit_when_idle(service)
    assert [r.getMessage() for r in caplog.records] == ["engine service: no workers left, exiting"]
    code, at = exited.value.args
    idle_for = at - service.state["idle_since"]
    assert code == 0 and service.state["clients"] == 0
    # It exits on the first check past the grace period: checks are at most a second apart.
    assert max(clock.sleeps) <= 1.0 and machine_service.IDLE_EXIT_S < idle_for <= machine_service.IDLE_EXIT_S + 1.0


def test_the_services_engine_notes_each_start_in_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    launched: list[Any] = []
    monkeypatch.setattr(local, "prepare_environment", lambda settings: None)  # vLLM's variables: not under test
    monkeypatch.setattr(local.VllmLocalEngine, "launch", lambda self: launched.append(self))  # no vLLM
    run = settings(tmp_path).vllm
    engine = machine_service._CountingEngine(run, tmp_path)
    engine.launch()
    engine.launch()
    assert launched == [engine, engine] and engine.directory == tmp_path and engine.settings == run
    lines = (tmp_path / "starts").read_text().splitlines()
    assert [line.split()[0] for line in lines] == [str(os.getpid())] * 2


def test_a_new_services_engine_counts_on_from_the_starts_of_the_folders_earlier_engines(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A service that died is replaced by a new one (with a new engine) in the same folder. Its workers saw the old
    engine's starts: each reports the death as restart(seen). Were the new engine counted from 0, its first start
    would make it 1 and a second worker's restart(1) for the same death would re-create the new, healthy engine
    (and the first worker's `starts` would go back to 0): it counts on from the folder's record instead."""
    monkeypatch.setattr(local, "prepare_environment", lambda settings: None)  # vLLM's variables: not under test
    monkeypatch.setattr(local.VllmLocalEngine, "launch", lambda self: None)  # no vLLM: the record is under test
    run = settings(tmp_path).vllm
    old = machine_service._CountingEngine(run, tmp_path)
    old.launch()  # the dead service's engine: started once
    assert machine_service._CountingEngine(run, tmp_path).starts == 1
    old.launch()
    assert machine_service._CountingEngine(run, tmp_path).starts == 2


def test_a_failed_request_reaches_the_worker_as_its_kind_and_message(folder: Path) -> None:
    """Rejected and dead-engine failures keep their own message; any other error from the engine is a dead
    engine named by its type; a message is cut to 2,000 characters on the socket."""
    engine = ThreadRemoteEngine(settings(folder))
    failures = [failure_of(engine.submit(vllm_request(p, IMG), SAMPLING)) for p in ("reject", "die", "crash", "long")]
    assert [(type(e).__name__, str(e)) for e in failures] == [
        ("RequestRejected", "rejected by the stub"), ("EngineDead", "stub died"),
        ("EngineDead", "RuntimeError: stub crashed"), ("RequestRejected", "x" * 2000)]
    engine.close()


def test_a_restart_that_fails_is_logged_and_answered_with_the_unchanged_start(
        folder: Path, caplog: pytest.LogCaptureFixture) -> None:
    engine = ThreadRemoteEngine(settings(folder))
    answer(engine.submit(vllm_request("a", IMG), SAMPLING))
    engine._service.engine.restart_error = RuntimeError("no GPU memory left")
    with caplog.at_level("ERROR", logger=machine_service.__name__):
        engine.restart()  # answered: the worker does not wait for an hour
    assert engine.starts == 1
    assert [r.getMessage() for r in caplog.records] == ["engine could not restart: RuntimeError: no GPU memory left"]
    engine.close()


def test_a_peer_that_fails_the_handshake_is_never_served(folder: Path, caplog: pytest.LogCaptureFixture) -> None:
    """It answers the challenge wrongly, then sends a page anyway: the service closes the connection unread."""
    engine = ThreadRemoteEngine(settings(folder))
    engine.start()
    peer = raw_client(folder, None)  # no key: the handshake is done by hand below
    with caplog.at_level("WARNING", logger=machine_service.__name__):
        assert peer.recv_bytes().startswith(b"#CHALLENGE#")
        peer.send_bytes(b"not the digest")
        assert peer.recv_bytes() == b"#FAILURE#"
        frame = wire.encode(wire.submit_header(1, "smuggled", SAMPLING.fields(), 0, IMG.size), wire.encode_png(IMG))
        with pytest.raises((EOFError, OSError)):
            peer.send_bytes(frame)
            peer.recv_bytes()
    peer.close()
    assert not (folder / "starts").exists()  # the engine never saw a request
    (message,) = [r.getMessage() for r in caplog.records]
    assert re.fullmatch(r"engine service: a connection failed the authkey handshake: AuthenticationError: .*digest.*",
                        message)
    engine.close()


def test_a_malformed_frame_is_logged_with_why_and_ends_its_connection(folder: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    engine = ThreadRemoteEngine(settings(folder))
    engine.start()
    peer = raw_client(folder, read_authkey(folder))
    with caplog.at_level("WARNING", logger=machine_service.__name__):
        peer.send_bytes(b"not a frame")
        with pytest.raises((EOFError, OSError)):
            peer.recv_bytes()
    peer.close()
    with pytest.raises(wire.FrameError) as why:
        wire.decode(b"not a frame", wire.TO_SERVICE)
    logged = [r.getMessage() for r in caplog.records]
    assert logged == [f"engine service: malformed frame, connection closed: {why.value}"]
    engine.close()


def test_one_connection_serves_on_after_every_kind_of_failure_restart_and_abort(folder: Path) -> None:
    """A worker's connection carries all its pages: a rejected, failed, undecodable or crashing request, a
    restart and an abort each end only themselves, and the next page is answered on the same connection."""
    engine = ThreadRemoteEngine(settings(folder))
    conn = engine._connected()
    for prompt in ("reject", "die", "crash"):
        assert failure_of(engine.submit(vllm_request(prompt, IMG), SAMPLING)) is not None
    garbage = Prepared({"prompt": "p", "page": PageSource(b"not an image", 0, (4, 4))}, 0, 4, 4)
    undecodable = failure_of(engine.submit(garbage, SAMPLING))
    assert isinstance(undecodable, RequestRejected)
    assert str(undecodable).startswith("UnidentifiedImageError: cannot identify image file")
    engine.restart()
    held = engine.submit(vllm_request("hold", IMG), SAMPLING)
    engine.abort(held)
    assert answer(engine.submit(vllm_request("after", IMG), SAMPLING))["prompt"] == "after"
    assert (folder / "aborted").exists()
    assert engine._connected() is conn and engine._service.state["clients"] == 1
    engine.close()


def test_an_abort_for_a_request_already_answered_reaches_no_engine(folder: Path) -> None:
    engine = ThreadRemoteEngine(settings(folder))
    engine.start()
    peer = raw_client(folder, read_authkey(folder))

    def submit(rid: int) -> dict[str, Any]:
        wire.send(peer, wire.submit_header(rid, "p", SAMPLING.fields(), 0, IMG.size), wire.encode_png(IMG))
        return wire.recv(peer, wire.TO_WORKER)[0]

    assert submit(7)["kind"] == "done"
    wire.send(peer, {"kind": "abort", "rid": 7})  # a late abort: the answer crossed it
    assert submit(8)["kind"] == "done"  # frames are served in order: the abort was read before this page
    assert not (folder / "aborted").exists()
    peer.close()
    engine.close()
