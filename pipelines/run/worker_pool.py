"""Beam's external worker pool, bound to the address the user names (loopback unless told otherwise).

    python -m pipelines.run.worker_pool [--bind HOST:PORT] [--container_executable PATH]

Beam's own `worker_pool_main` (and its boot entrypoint's `--worker_pool`) always listens on every interface
(`[::]:50000`), and the pool has no authentication: whoever reaches the port can make it start an SDK worker that
connects to an endpoint of their choosing. This starts the same servicer (`BeamFnExternalWorkerPoolServicer`,
one process per SDK worker) on `--bind` only, default 127.0.0.1:50000: right for a pool beside its Flink or Spark
task manager (same host or pod) or the launcher; another host's runner needs an address it can reach, which
must then be on a private network (docs/runners.md, "Worker images"). `--container_executable` is Beam's boot
in the worker images (it fetches the pipeline options and starts the SDK harness); without it each worker is
`python -c SdkHarness(...)`, as with `worker_pool_main`.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from transforms.text_safety import is_loopback

DEFAULT_BIND = "127.0.0.1:50000"


def parse_bind(text: str) -> tuple[str, int]:
    """(host, port) of `HOST:PORT` or `[V6]:PORT`; raises ValueError with the reason."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--bind {text!r}: expected HOST:PORT (e.g. {DEFAULT_BIND}), port 0-65535")
    return host.strip("[]"), int(port)




def start(bind: str = DEFAULT_BIND, container_executable: str | None = None) -> tuple[int, Any]:
    """(the bound port, the started gRPC server) of a worker pool listening on `bind` alone."""
    import grpc
    from apache_beam.portability.api import beam_fn_api_pb2_grpc
    from apache_beam.runners.worker.worker_pool_main import BeamFnExternalWorkerPoolServicer
    from apache_beam.utils import thread_pool_executor

    host, port = parse_bind(bind)
    # The same server options as Beam's own pool: no ping limits on the long-lived control streams.
    server = grpc.server(thread_pool_executor.shared_unbounded_instance(),
                         options=[("grpc.http2.max_pings_without_data", 0), ("grpc.http2.max_ping_strikes", 0)])
    bound = server.add_insecure_port(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    if not bound:
        raise OSError(f"--bind {bind}: cannot listen there")
    beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(
        BeamFnExternalWorkerPoolServicer(use_process=True, container_executable=container_executable), server)
    server.start()
    return bound, server


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.run.worker_pool", description=__doc__.splitlines()[0])
    parser.add_argument("--bind", default=DEFAULT_BIND, help=f"HOST:PORT to listen on (default {DEFAULT_BIND})")
    parser.add_argument("--container_executable", default=None, help="each SDK worker's executable (Beam's boot)")
    args = parser.parse_args(argv)
    try:
        host, _ = parse_bind(args.bind)
    except ValueError as err:
        print(f"worker_pool: {err}", file=sys.stderr)
        return 2
    # Beam's boot marks the workers of one pool so (its --worker_pool does the same before starting the pool).
    os.environ.setdefault("BEAM_PYTHON_WORKER_POOL_ID", str(os.getpid()))
    try:
        port, server = start(args.bind, args.container_executable)
    except (OSError, RuntimeError) as err:
        print(f"worker_pool: {err}", file=sys.stderr)
        return 1
    if not is_loopback(host):
        print(f"worker_pool: listening on {host}:{port}, which is not loopback: the pool has no authentication, "
              "keep the port on a private network (docs/runners.md)", file=sys.stderr)
    print(f"worker_pool: listening on {host}:{port}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
