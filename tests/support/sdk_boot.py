#!/usr/bin/env python3
"""What the SDK image's entrypoint (/opt/apache/beam/boot, Beam's Go `boot`) does for a worker pool that starts
it per SDK worker (`worker_pool_main --container_executable`), minus installing staged artifacts (the image has
pagemill): ask the runner's provision service for the pipeline options, then run `sdk_worker_main`, which sets
Beam's filesystems up from them. A bare `worker_pool_main` starts `python -c SdkHarness(...)` instead, whose
filesystems have no options at all: every s3:// read and write of the worker fails (docs/runners.md).

Usage (as the pool calls it): sdk_boot.py --id=ID --logging_endpoint=H:P --artifact_endpoint=H:P
--provision_endpoint=H:P --control_endpoint=H:P"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence


def main(argv: Sequence[str]) -> None:
    import grpc
    from apache_beam.portability.api import beam_provision_api_pb2, beam_provision_api_pb2_grpc
    from google.protobuf import json_format

    parser = argparse.ArgumentParser()
    for name in ("id", "logging_endpoint", "artifact_endpoint", "provision_endpoint", "control_endpoint"):
        parser.add_argument(f"--{name}", required=True)
    args, _ = parser.parse_known_args(argv)
    with grpc.insecure_channel(args.provision_endpoint) as channel:
        info = beam_provision_api_pb2_grpc.ProvisionServiceStub(channel).GetProvisionInfo(
            beam_provision_api_pb2.GetProvisionInfoRequest(), metadata=[("worker_id", args.id)], timeout=60).info
    env = {**os.environ, "WORKER_ID": args.id,
           "PIPELINE_OPTIONS": json.dumps(json_format.MessageToDict(info.pipeline_options)),
           "LOGGING_API_SERVICE_DESCRIPTOR": f'url: "{args.logging_endpoint}"',
           "CONTROL_API_SERVICE_DESCRIPTOR": f'url: "{args.control_endpoint}"',
           "RUNNER_CAPABILITIES": " ".join(info.runner_capabilities)}
    os.execvpe(sys.executable, [sys.executable, "-m", "apache_beam.runners.worker.sdk_worker_main"], env)


if __name__ == "__main__":
    main(sys.argv[1:])
