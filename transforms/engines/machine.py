"""One engine per machine, fed by every worker process of the run on that machine.

With several worker processes (`--direct_running_mode=multi_processing`, or several SDK processes
on a Dataflow VM) a per-process engine would mean one vLLM engine per process, and on one GPU the
second cannot get memory. Instead the first worker process that needs the model starts an engine
service process (`python -P -m transforms.engines.machine DIR`, one per DIR, guarded by a file lock, with a
minimal environment: machine_folder.service_env); every worker process connects to it through a local Unix
socket in DIR (multiprocessing.connection's HMAC handshake, with a random authkey kept in DIR).

DIR is private to the user (transforms/engines/machine_folder.py): created 0700 in a per-user base, and both
checked (a real directory, ours, no group/other bits) before any use by a worker or the service; a folder that
fails is refused (`FolderRefused`: the pages fail with `engine_error`, the run says why).

Frames, not pickles (transforms/engines/machine_wire.py): a page crosses the socket as its encoded bytes (the
JPEG the page stage made) with its detail side and target size, and the service makes the engine's pixels with
the function the local engine path uses (feed.page_pixels), so the engine sees exactly what a local engine
would; the prompt text and the sampling fields go as JSON. Results come back as token ids, text and
gpu_seconds. Prompts are built in the workers with the model's tokenizer, loaded there. The service exits a
few seconds after its last worker disconnects.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, replace
from functools import partial
from multiprocessing.connection import Client, Connection, Listener, answer_challenge, deliver_challenge
from pathlib import Path
from typing import Any

from transforms.child_process import python_argv
from transforms.engines import machine_wire as wire
from transforms.engines.local import (
    Completion,
    Engine,
    EngineOutput,
    EngineSettings,
    PageEngine,
    Sample,
    image_token_id_of,
)
from transforms.engines.machine_folder import (
    AUTHKEY_BYTES,
    MAX_SETTINGS_BYTES,
    check_folder,
    last_line,
    open_private,
    prepare_folder,
    read_authkey,
    read_private,
    service_env,
    write_new,
)
from transforms.engines.machine_folder import service_dir as service_dir  # the settings compute it from here
from transforms.extract.feed import PageSource, page_pixels, vllm_sampling

log = logging.getLogger(__name__)
IDLE_EXIT_S = 10.0  # the service exits this long after its last worker disconnected
CONNECT_TIMEOUT_S = 120.0
SOCKET = "engine.sock"
EngineMaker = Callable[[EngineSettings, Path], PageEngine]


class _CountingEngine(Engine):
    """The service's engine: every start is a line in DIR/starts (one engine per run: tests count them)."""

    def __init__(self, settings: EngineSettings, directory: Path) -> None:
        super().__init__(settings)
        self.directory = directory

    def start(self) -> None:
        super().start()
        with open(self.directory / "starts", "a") as handle:
            handle.write(f"{os.getpid()} {time.time():.3f}\n")


def serve(directory: Path, make_engine: EngineMaker = _CountingEngine,
          sampling: Callable[[dict[str, Any]], Any] = vllm_sampling) -> None:
    """The engine service's main loop: accept workers until none is left. `make_engine` and `sampling` are
    the engine and its sampling parameters (tests put a stub engine here, behind the real socket)."""
    check_folder(directory)
    settings = EngineSettings(**json.loads(read_private(directory / "settings.json", MAX_SETTINGS_BYTES)))
    authkey = read_authkey(directory)
    engine = make_engine(replace(settings, service_dir=None), directory)
    # No authkey here: the handshake runs in each connection's thread, so a peer that stalls in it
    # holds up only itself, and a failed one never stops the accept loop.
    listener = Listener(str(directory / SOCKET), family="AF_UNIX")
    state = {"clients": 0, "idle_since": time.monotonic()}
    lock = threading.Lock()

    def watchdog() -> None:
        while True:
            time.sleep(1.0)
            with lock:
                if state["clients"] == 0 and time.monotonic() - state["idle_since"] > IDLE_EXIT_S:
                    log.info("engine service: no workers left, exiting")
                    os._exit(0)

    threading.Thread(target=watchdog, daemon=True).start()
    while True:
        try:
            conn = listener.accept()
        except OSError as err:
            log.warning("engine service: accept failed: %s", err)
            continue
        with lock:
            state["clients"] += 1
        worker = partial(_serve_worker, engine, sampling, conn, authkey, lock, state)
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


def _serve_worker(engine: PageEngine, sampling: Callable[[dict[str, Any]], Any], conn: Connection, authkey: bytes,
                  lock: threading.Lock, state: dict[str, Any]) -> None:
    send_lock = threading.Lock()
    submitted: dict[int, Future[Completion]] = {}  # this worker's requests in the engine, for `abort`

    def reply(header: dict[str, Any]) -> None:
        with send_lock:
            try:
                wire.send(conn, header)
            except (OSError, EOFError):
                pass  # the worker went away; its pages went with it

    def error(rid: int, kind: str, err: BaseException) -> None:
        reply({"kind": "error", "rid": rid, "error": kind, "message": f"{type(err).__name__}: {err}"[:2000],
               "starts": engine.starts})

    def done(rid: int, future: Future[Completion]) -> None:
        err = future.exception()
        if err is not None:
            return error(rid, "rejected" if isinstance(err, ValueError) else "engine", err)
        c = future.result()
        samples = [[s.text, list(s.token_ids), s.finish_reason] for s in c.output.outputs]
        reply({"kind": "done", "rid": rid, "prompt_token_ids": list(c.output.prompt_token_ids or []),
               "samples": samples, "gpu_seconds": float(c.gpu_seconds), "starts": engine.starts,
               "cached_tokens": int(getattr(c.output, "num_cached_tokens", None) or 0)})

    def restart(seen: int) -> None:
        try:
            engine.restart(seen)
        except Exception as err:  # noqa: BLE001 - the worker's pages fail as rows; see Engine.restart
            log.error("engine could not restart: %s: %s", type(err).__name__, err)
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
            try:  # the same pixels a local engine gets (feed.prepare): decoded, capped, fitted
                image = page_pixels(sub.image, sub.detail_side, sub.size)
                params = sampling(sub.sampling)
            except Exception as err:  # noqa: BLE001 - an undecodable page or bad parameters: this request only
                error(sub.rid, "rejected", ValueError(f"{type(err).__name__}: {err}"))
                continue
            try:
                future = engine.submit({"prompt": sub.prompt, "multi_modal_data": {"image": image}}, params)
            except Exception as err:  # noqa: BLE001 - the engine cannot start: this request fails
                error(sub.rid, "engine", err)
                continue
            submitted[sub.rid] = future
            future.add_done_callback(lambda _, rid=sub.rid: submitted.pop(rid, None))
            future.add_done_callback(partial(done, sub.rid))
    finally:
        conn.close()
        with lock:
            state["clients"] -= 1
            state["idle_since"] = time.monotonic()


class RemoteEngine:
    """A worker process's handle on the machine's engine service (the PageEngine protocol)."""

    def __init__(self, settings: EngineSettings) -> None:
        if not settings.service_dir:
            raise ValueError("RemoteEngine needs EngineSettings.service_dir")
        self.settings = settings
        self.directory = Path(settings.service_dir)
        self.starts = 0
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._conn: Connection | None = None
        self._futures: dict[int, Future[Completion]] = {}
        self._next = 0
        self._restarted = threading.Condition()
        self._restart_replies = 0  # answers to "restart" (a failed restart answers too, starts unchanged)
        self._tokenizer: Any = None

    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from vllm.tokenizers import get_tokenizer

            model = self.settings.model
            revision = None if Path(model).exists() else self.settings.model_revision
            self._tokenizer = get_tokenizer(model, revision=revision)
        return self._tokenizer

    def image_token_id(self) -> int | None:
        return image_token_id_of(self.tokenizer())

    def submit(self, request: dict[str, Any], params: Any) -> Future[Completion]:
        """Send the page's encoded bytes (the feed's PageSource); a request with only a PIL image is sent as
        lossless PNG. Raises FrameError (a ValueError: this request is rejected) over the frame limits."""
        source = request.get("page")
        if isinstance(source, PageSource):
            data, side, size = source.data, source.detail_side, source.size
        else:
            img = request["multi_modal_data"]["image"]
            data, side, size = wire.encode_png(img), 0, img.size
        conn = self._connected()
        future: Future[Completion] = Future()
        with self._lock:
            self._next += 1
            rid = self._next
        frame = wire.encode(wire.submit_header(rid, request["prompt"], wire.fields_of(params), side, size), data)
        with self._lock:
            self._futures[rid] = future
        try:
            with self._send_lock:
                conn.send_bytes(frame)
        except Exception:
            with self._lock:
                self._futures.pop(rid, None)
            raise
        return future

    def abort(self, future: Future[Completion]) -> None:
        """The service aborts the request in its engine (--answer-timeout-s); its future fails here at once."""
        with self._lock:
            rid = next((r for r, f in self._futures.items() if f is future), None)
            self._futures.pop(rid, None)
            conn = self._conn
        if rid is None or conn is None:
            return
        future.set_exception(RuntimeError("request aborted"))
        with self._send_lock:
            wire.send(conn, {"kind": "abort", "rid": rid})

    def restart(self, seen: int | None = None) -> None:
        conn = self._connected()
        with self._restarted:
            answered = self._restart_replies
            with self._send_lock:
                wire.send(conn, {"kind": "restart", "seen": seen if seen is not None else self.starts})
            self._restarted.wait_for(lambda: self._restart_replies != answered or self._conn is None, timeout=3600)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _connected(self) -> Connection:
        with self._lock:
            if self._conn is not None:
                return self._conn
            prepare_folder(self.directory)  # FolderRefused: nothing in a folder we do not own is used
            with os.fdopen(open_private(self.directory / "lock", os.O_RDWR | os.O_CREAT), "r+b") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # one worker starts the service, the others wait for it
                authkey = self._authkey()
                conn = self._try_connect(authkey)
                if conn is None:
                    conn = self._start_service(authkey)
            self._conn = conn
            threading.Thread(target=self._read, args=(conn,), name="pagemill-engine-client", daemon=True).start()
            return conn

    def _start_service(self, authkey: bytes) -> Connection:
        """Spawn the service and connect once it listens. A service that exits first (its folder refused, a
        broken install) raises at once, with the last line of its log."""
        proc = self._spawn()
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            conn = self._try_connect(authkey)
            if conn is not None:
                return conn
        code = proc.poll()
        why = f"exited with code {code}" if code is not None else f"did not listen in {CONNECT_TIMEOUT_S:g} s"
        raise RuntimeError(f"engine service {why} ({self.directory}): {last_line(self.directory / 'service.log')}")

    def _authkey(self) -> bytes:
        """The folder's authkey, created (O_EXCL, 0600) with the service's settings by the first worker."""
        if write_new(self.directory / "authkey", secrets.token_bytes(AUTHKEY_BYTES)):
            fd = open_private(self.directory / "settings.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            with os.fdopen(fd, "w") as handle:
                json.dump(asdict(self.settings), handle)
        return read_authkey(self.directory)

    def _try_connect(self, authkey: bytes) -> Connection | None:
        try:
            return Client(str(self.directory / SOCKET), family="AF_UNIX", authkey=authkey)
        except (FileNotFoundError, ConnectionRefusedError):
            return None

    def service_argv(self) -> list[str]:
        """The service's command line (tests start a stub engine's service here)."""
        return python_argv("-m", "transforms.engines.machine", str(self.directory))

    def _spawn(self) -> subprocess.Popen[bytes]:
        sock = self.directory / SOCKET
        if sock.is_symlink() or sock.exists():
            sock.unlink()  # left by a service that died
        fd = open_private(self.directory / "service.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        with os.fdopen(fd, "ab") as out:
            return subprocess.Popen(self.service_argv(), stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                                    env=service_env(os.environ, sys.path), start_new_session=True, close_fds=True)


    def _read(self, conn: Connection) -> None:
        while True:
            try:
                header, _ = wire.recv(conn, wire.TO_WORKER)
            except (EOFError, OSError):
                break
            except wire.FrameError as err:
                log.error("engine service sent a malformed frame; connection closed: %s", err)
                conn.close()
                break
            if header["kind"] == "starts":
                with self._restarted:
                    self.starts = header["starts"]
                    self._restart_replies += 1
                    self._restarted.notify_all()
                continue
            self.starts = max(self.starts, header["starts"])
            with self._lock:
                future = self._futures.pop(header["rid"], None)
            if future is None:
                continue
            if header["kind"] == "done":
                samples = [Sample(text, tuple(ids), reason) for text, ids, reason in header["samples"]]
                future.set_result(Completion(EngineOutput(header["prompt_token_ids"], samples,
                                                          num_cached_tokens=header["cached_tokens"]),
                                             header["gpu_seconds"]))
            else:
                error = ValueError if header["error"] == "rejected" else RuntimeError
                future.set_exception(error(header["message"]))
        # The service went away: what was in flight fails (and is resubmitted to a new service).
        with self._lock:
            if self._conn is conn:
                self._conn = None
            lost, self._futures = self._futures, {}
        for future in lost.values():
            future.set_exception(RuntimeError("engine service connection lost"))
        with self._restarted:
            self._restarted.notify_all()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(Path(sys.argv[1]))
