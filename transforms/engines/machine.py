"""One engine per machine, fed by every worker process of the run on that machine.

With several worker processes (`--direct_running_mode=multi_processing`, or several SDK processes
on a Dataflow VM) a per-process engine would mean one vLLM engine per process, and on one GPU the
second cannot get memory. Instead the first worker process that needs the model starts an engine
service process (`python -m transforms.engines.machine DIR`, one per DIR: a run-scoped folder under
the machine's temp dir, guarded by a file lock); every worker process connects to it through a
local Unix socket (multiprocessing.connection, with a random authkey kept in DIR, mode 0600).

Pages cross the socket as raw RGB pixels (already decoded and resized by the worker, so the
engine sees exactly what a local engine would; a local copy costs memcpy, not an encode) plus the
prompt text and the sampling parameters. Results come back as token ids, text and gpu_seconds.
Prompts are built in the workers with the model's tokenizer, loaded there. The service exits a
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
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import asdict, replace
from functools import partial
from hashlib import sha256
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any

from PIL import Image

from transforms.engines.local import (
    Completion,
    Engine,
    EngineOutput,
    EngineSettings,
    Sample,
    image_token_id_of,
)

log = logging.getLogger(__name__)
IDLE_EXIT_S = 10.0  # the service exits this long after its last worker disconnected
CONNECT_TIMEOUT_S = 120.0


def service_dir(run_id: str, settings: EngineSettings) -> str:
    """The run's engine folder on this machine: one engine per run, model and settings. Pure."""
    key = sha256(json.dumps([run_id, asdict(settings)], sort_keys=True, default=str).encode()).hexdigest()[:16]
    return str(Path(tempfile.gettempdir()) / f"pagemill-engine-{key}")


class _CountingEngine(Engine):
    """The service's engine: every start is a line in DIR/starts (one engine per run: tests count them)."""

    def __init__(self, settings: EngineSettings, directory: Path) -> None:
        super().__init__(settings)
        self.directory = directory

    def start(self) -> None:
        super().start()
        with open(self.directory / "starts", "a") as handle:
            handle.write(f"{os.getpid()} {time.time():.3f}\n")


def serve(directory: Path) -> None:
    """The engine service's main loop: accept workers until none is left."""
    settings = replace_service(EngineSettings(**json.loads((directory / "settings.json").read_text())))
    engine = _CountingEngine(settings, directory)
    listener = Listener(str(directory / "engine.sock"), family="AF_UNIX",
                        authkey=(directory / "authkey").read_bytes())
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
        conn = listener.accept()
        with lock:
            state["clients"] += 1
        threading.Thread(target=_serve_worker, args=(engine, conn, lock, state), daemon=True).start()


def replace_service(settings: EngineSettings) -> EngineSettings:
    return replace(settings, service_dir=None)


def _serve_worker(engine: Engine, conn: Connection, lock: threading.Lock, state: dict[str, Any]) -> None:
    send_lock = threading.Lock()

    def reply(message: tuple[Any, ...]) -> None:
        with send_lock:
            try:
                conn.send(message)
            except (OSError, EOFError):
                pass  # the worker went away; its pages went with it

    def done(rid: int, future: Future[Completion]) -> None:
        err = future.exception()
        if err is not None:
            kind = "rejected" if isinstance(err, ValueError) else "engine"
            reply(("error", rid, kind, f"{type(err).__name__}: {err}", engine.starts))
            return
        c = future.result()
        samples = [(s.text, tuple(s.token_ids), s.finish_reason) for s in c.output.outputs]
        reply(("done", rid, list(c.output.prompt_token_ids or []), samples, c.gpu_seconds, engine.starts))

    def restart(seen: int) -> None:
        try:
            engine.restart(seen)
        except Exception as err:  # noqa: BLE001 - the worker's pages fail as rows; see Engine.restart
            log.error("engine could not restart: %s: %s", type(err).__name__, err)
        reply(("starts", engine.starts))

    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return
            if message[0] == "submit":
                _, rid, prompt, (mode, size, pixels), params = message
                request = {"prompt": prompt, "multi_modal_data": {"image": Image.frombytes(mode, size, pixels)}}
                try:
                    engine.submit(request, params).add_done_callback(partial(done, rid))
                except Exception as err:  # noqa: BLE001 - the engine cannot start: this request fails
                    reply(("error", rid, "engine", f"{type(err).__name__}: {err}", engine.starts))
            elif message[0] == "restart":
                threading.Thread(target=restart, args=(message[1],), daemon=True).start()
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
        conn = self._connected()
        img: Image.Image = request["multi_modal_data"]["image"]
        future: Future[Completion] = Future()
        with self._lock:
            self._next += 1
            rid = self._next
            self._futures[rid] = future
        with self._send_lock:
            conn.send(("submit", rid, request["prompt"], (img.mode, img.size, img.tobytes()), params))
        return future

    def restart(self, seen: int | None = None) -> None:
        conn = self._connected()
        with self._restarted:
            answered = self._restart_replies
            with self._send_lock:
                conn.send(("restart", seen if seen is not None else self.starts))
            self._restarted.wait_for(lambda: self._restart_replies != answered or self._conn is None, timeout=3600)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _connected(self) -> Connection:
        with self._lock:
            if self._conn is not None:
                return self._conn
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            with open(self.directory / "lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # one worker starts the service, the others wait for it
                authkey = self._authkey()
                conn = self._try_connect(authkey)
                if conn is None:
                    self._spawn()
                    deadline = time.monotonic() + CONNECT_TIMEOUT_S
                    while conn is None and time.monotonic() < deadline:
                        time.sleep(0.2)
                        conn = self._try_connect(authkey)
                    if conn is None:
                        raise RuntimeError(f"engine service did not come up in {self.directory}")
            self._conn = conn
            threading.Thread(target=self._read, args=(conn,), name="pagemill-engine-client", daemon=True).start()
            return conn

    def _authkey(self) -> bytes:
        path = self.directory / "authkey"
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(secrets.token_bytes(32))
            (self.directory / "settings.json").write_text(json.dumps(asdict(self.settings)))
        return path.read_bytes()

    def _try_connect(self, authkey: bytes) -> Connection | None:
        try:
            return Client(str(self.directory / "engine.sock"), family="AF_UNIX", authkey=authkey)
        except (FileNotFoundError, ConnectionRefusedError):
            return None

    def _spawn(self) -> None:
        sock = self.directory / "engine.sock"
        if sock.exists():
            sock.unlink()  # left by a service that died
        with open(self.directory / "service.log", "ab") as out:
            subprocess.Popen([sys.executable, "-m", "transforms.engines.machine", str(self.directory)],
                             stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True)

    def _read(self, conn: Connection) -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            kind = message[0]
            if kind == "starts":
                with self._restarted:
                    self.starts = message[1]
                    self._restart_replies += 1
                    self._restarted.notify_all()
                continue
            rid, starts = message[1], message[-1]
            self.starts = max(self.starts, starts)
            with self._lock:
                future = self._futures.pop(rid, None)
            if future is None:
                continue
            if kind == "done":
                samples = [Sample(text, token_ids, reason) for text, token_ids, reason in message[3]]
                future.set_result(Completion(EngineOutput(message[2], samples), message[4]))
            else:
                error = ValueError if message[2] == "rejected" else RuntimeError
                future.set_exception(error(message[3]))
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
