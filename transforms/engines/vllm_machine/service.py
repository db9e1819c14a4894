"""The engine service process of VllmMachineEngine (engine.py): one engine for the machine, fed by every worker
process of the run through a Unix socket in its private folder (started as
`python -P -m transforms.engines.vllm_machine.engine DIR`). Each page arrives as its encoded bytes with its detail
side and fitted size (wire.py); the service makes the engine's pixels with templated.page_pixels, as a local engine
would, and answers with the text, the finish reason and the token counts its engine counted. It exits IDLE_EXIT_S
after its last worker left.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.connection import Connection, Listener, answer_challenge, deliver_challenge
from pathlib import Path
from typing import Any

from transforms.engines.base import Completion, EngineDead, PageEngine, Prepared, RequestRejected, Sampling
from transforms.engines.simulated import SimulatedEngine
from transforms.engines.vllm_local.engine import VllmLocalEngine
from transforms.engines.vllm_local.settings import VllmLocalSettings
from transforms.engines.vllm_machine import stats as engine_stats
from transforms.engines.vllm_machine import wire
from transforms.engines.vllm_machine.folder import MAX_SETTINGS_BYTES, check_folder, read_authkey, read_private
from transforms.engines.vllm_shared.templated import page_pixels

log = logging.getLogger(__name__)
IDLE_EXIT_S = 10.0  # the service exits this long after its last worker disconnected
SOCKET = "engine.sock"
EngineMaker = Callable[[VllmLocalSettings, Path], PageEngine]
# Fault injection (tests): "<device>:<pages>" makes that device's service exit once, right after its <pages>th
# answer, as an engine process that dies mid-run (its restarted service does not exit again).
FAULT_ENV = "PAGEMILL_FAULT_ENGINE_EXIT"


class _CountingEngine(VllmLocalEngine):
    """The service's engine: every start is a line in DIR/starts (one engine per run: tests count them)."""

    def __init__(self, settings: VllmLocalSettings, directory: Path) -> None:
        super().__init__(settings)
        self.directory = directory
        # Count on from the folder's earlier engines (a service that died): the workers' restart(seen) names
        # their starts, and a new engine counted from 0 would reach a `seen` and be re-created for an old death.
        record = directory / "starts"
        self.starts = len(record.read_text().splitlines()) if record.exists() else 0

    def launch(self) -> None:
        super().launch()
        with open(self.directory / "starts", "a") as handle:
            handle.write(f"{os.getpid()} {time.time():.3f}\n")


@dataclass
class Service:
    """An open engine service: its listener, engine and key, and its workers' count (guarded by `lock`)."""

    listener: Listener
    engine: PageEngine
    authkey: bytes
    lock: threading.Lock = field(default_factory=threading.Lock)
    state: dict[str, Any] = field(default_factory=lambda: {"clients": 0, "idle_since": time.monotonic()})
    stopped: threading.Event = field(default_factory=threading.Event)
    stats: engine_stats.EngineStats | None = None  # its figures (stats.py), in `directory`
    directory: Path | None = None

    def stop(self) -> None:
        """Stop accepting (the service process never does: it exits when idle; tests run it in a thread)."""
        self.stopped.set()
        self.listener.close()


def serve(directory: Path, make_engine: EngineMaker = _CountingEngine) -> None:
    """The engine service's main loop: accept workers until none is left. `make_engine` makes the engine
    (tests put a stub engine here, behind the real socket)."""
    service = open_service(directory, make_engine)
    threading.Thread(target=exit_when_idle, args=(service,), daemon=True).start()
    accept_workers(service)


def open_service(directory: Path, make_engine: EngineMaker) -> Service:
    """Check the folder, read the run's engine settings and key, make the engine and listen on the socket."""
    check_folder(directory)
    fields = json.loads(read_private(directory / "settings.json", MAX_SETTINGS_BYTES))
    device, simulated = str(fields.pop("device", "")), fields.pop("simulated", None)
    settings = VllmLocalSettings(**fields)
    authkey = read_authkey(directory)
    engine = SimulatedEngine(**simulated) if simulated is not None else make_engine(settings, directory)
    # No authkey here: the handshake runs in each connection's thread, so a peer that stalls in it
    # holds up only itself, and a failed one never stops the accept loop.
    return Service(Listener(str(directory / SOCKET), family="AF_UNIX"), engine, authkey,
                   stats=engine_stats.load(directory, device), directory=directory)


def exit_when_idle(service: Service) -> None:
    """The process exits IDLE_EXIT_S after its last worker left."""
    while True:
        time.sleep(1.0)
        with service.lock:
            if service.state["clients"] == 0 and time.monotonic() - service.state["idle_since"] > IDLE_EXIT_S:
                log.info("engine service: no workers left, exiting")
                os._exit(0)


def accept_workers(service: Service) -> None:
    """Each worker that connects is served in a thread of its own, until the service is stopped."""
    while not service.stopped.is_set():
        try:
            conn = service.listener.accept()
        except OSError as err:
            if service.stopped.is_set():
                return
            log.warning("engine service: accept failed: %s", err)
            continue
        with service.lock:
            service.state["clients"] += 1
        worker = partial(_serve_worker, service.engine, conn, service.authkey, service.lock, service.state,
                         service.stats, service.directory)
        threading.Thread(target=worker, daemon=True).start()


def _handshake(conn: Connection, authkey: bytes) -> bool:
    """Multiprocessing's HMAC challenge both ways (as Listener.accept does): bytes only, nothing unpickled."""
    try:
        deliver_challenge(conn, authkey)
        answer_challenge(conn, authkey)
        return True
    except Exception as err:  # noqa: BLE001 - a wrong key, a dead or garbled peer: this connection only
        log.warning("engine service: a connection failed the authkey handshake: %s: %s", type(err).__name__, err)
        return False


def fault_due(spec: str | None, device: str, pages: int, directory: Path) -> bool:
    """FAULT_ENV's test fault: True once (a marker file in the folder), when `spec` names this device and its
    pages answered reached the count."""
    name, _, count = (spec or "").partition(":")
    if not count.isdigit() or name != device or pages < int(count):
        return False
    try:
        os.close(os.open(directory / "fault-fired", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        return False
    return True


def _write(stats: engine_stats.EngineStats, directory: Path) -> None:
    try:
        stats.write(directory)
    except OSError as err:
        log.warning("engine service: could not write its figures: %s", err)


def _counted(stats: engine_stats.EngineStats | None, directory: Path | None, engine: PageEngine,
             c: Completion) -> int:
    """One answer in the service's figures (stats.json, written before the answer goes: a run that has its
    answers has their figures); the pages answered so far."""
    if stats is None or directory is None:
        return 0
    pages = stats.answered(c.output.output_tokens, float(c.gpu_seconds), engine.starts)
    _write(stats, directory)
    return pages


def _fault(stats: engine_stats.EngineStats | None, directory: Path | None, pages: int) -> None:
    """The test fault (FAULT_ENV) once its answer has gone."""
    if stats is not None and directory is not None and fault_due(os.environ.get(FAULT_ENV), stats.device, pages,
                                                                 directory):
        log.warning("engine service: %s: exiting after %d answers", FAULT_ENV, pages)
        os._exit(9)


def _serve_worker(engine: PageEngine, conn: Connection, authkey: bytes, lock: threading.Lock,
                  state: dict[str, Any], stats: engine_stats.EngineStats | None = None,
                  directory: Path | None = None) -> None:
    send_lock = threading.Lock()
    submitted: dict[int, Future[Completion]] = {}  # this worker's requests in the engine, for `abort`

    def reply(header: dict[str, Any]) -> None:
        with send_lock:
            try:
                wire.send(conn, header)
            except (OSError, EOFError):
                pass  # the worker went away; its pages went with it

    def error(rid: int, kind: str, err: BaseException) -> None:
        text = str(err) if isinstance(err, RequestRejected | EngineDead) else f"{type(err).__name__}: {err}"
        reply({"kind": "error", "rid": rid, "error": kind, "message": text[:2000],
               "starts": engine.starts})

    def done(rid: int, future: Future[Completion]) -> None:
        err = future.exception()
        if err is not None:
            return error(rid, "rejected" if isinstance(err, RequestRejected) else "engine", err)
        c = future.result()
        a = c.output
        pages = _counted(stats, directory, engine, c)
        reply({"kind": "done", "rid": rid, "text": a.text, "finish_reason": a.finish_reason,
               "tokens": [a.image_tokens, a.text_tokens, a.output_tokens], "gpu_seconds": float(c.gpu_seconds),
               "starts": engine.starts, "cached_tokens": a.cached_prompt_tokens})
        _fault(stats, directory, pages)

    def restart(seen: int) -> None:
        try:
            engine.restart(seen)
        except Exception as err:  # noqa: BLE001 - the worker's pages fail as rows; see VllmLocalEngine.restart
            log.error("engine could not restart: %s: %s", type(err).__name__, err)
        if stats is not None and directory is not None:
            stats.started(engine.starts)
            _write(stats, directory)
        reply({"kind": "starts", "starts": engine.starts})

    try:
        if not _handshake(conn, authkey):
            return
        while True:
            try:
                header, payload = wire.recv(conn, wire.TO_SERVICE)
            except (EOFError, OSError):
                return
            except wire.FrameError as err:
                log.warning("engine service: malformed frame, connection closed: %s", err)
                return
            if header["kind"] == "restart":
                threading.Thread(target=restart, args=(header["seen"],), daemon=True).start()
                continue
            if header["kind"] == "abort":  # the worker gave up on it (--answer-timeout-s): free its sequence
                running = submitted.get(header["rid"])
                if running is not None:
                    engine.abort(running)
                continue
            sub = wire.as_submit(header, payload)
            try:  # the same pixels a local engine gets (templated.py): decoded, capped, fitted
                image = page_pixels(sub.image, sub.detail_side, sub.size)
                sampling = Sampling.of_fields(sub.sampling)
            except Exception as err:  # noqa: BLE001 - an undecodable page or bad parameters: this request only
                error(sub.rid, "rejected", RequestRejected(f"{type(err).__name__}: {err}"))
                continue
            try:
                prepared = Prepared({"prompt": sub.prompt, "multi_modal_data": {"image": image}}, 0, *image.size)
                future = engine.submit(prepared, sampling)
            except Exception as err:  # noqa: BLE001 - the engine cannot start: this request fails
                error(sub.rid, "engine", err)
                continue
            if stats is not None:
                stats.received()
            submitted[sub.rid] = future
            future.add_done_callback(lambda _, rid=sub.rid: submitted.pop(rid, None))
            future.add_done_callback(partial(done, sub.rid))
    finally:
        conn.close()
        with lock:
            state["clients"] -= 1
            state["idle_since"] = time.monotonic()
