"""Option checks of `pagemill run`: what would fail late (a bad time, schema, model or endpoint) fails
before anything is written, as one line a user can act on (exit 2)."""
from __future__ import annotations

import datetime as dt
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def epoch(text: str | None) -> float | None:
    if not text:
        return None
    value = dt.datetime.fromisoformat(text)
    return (value if value.tzinfo else value.replace(tzinfo=dt.UTC)).timestamp()


def check_options(o: Any) -> list[str]:
    """Checks of the options' own values that save a user from a pipeline that would fail late: a bad time, a
    bad endpoint or model folder. What the options name in files (the schema, the image-token rule, the
    blocklists) is loaded and checked once, by the settings' build (pipelines/run/settings.py)."""
    from pipelines.config.engine import engine_problems, uses_endpoint

    problems = []
    for name in ("modified_since", "modified_until"):
        try:
            epoch(getattr(o, name))
        except ValueError:
            problems.append(f"--{name.replace('_', '-')} {getattr(o, name)!r} is not an ISO time")
    if not 0 <= o.max_failed_fraction <= 1:
        problems.append(f"--max-failed-fraction {o.max_failed_fraction:g} is not between 0 and 1")
    for name in ("render_range_pages", "workers", "wave_objects"):
        if getattr(o, name) < 0:
            problems.append(f"--{name.replace('_', '-')} {getattr(o, name)} is negative")
    for name in ("document_timeout_s", "page_timeout_s"):
        if getattr(o, name) < 0:
            problems.append(f"--{name.replace('_', '-')} {getattr(o, name):g} is negative (0 turns it off)")
    problems += engine_problems(o)
    problems += device_plan_problems(o)
    problems += local_path_problems(o)
    from transforms.store.iceberg import catalog_problems

    problems += catalog_problems(o.catalog, o.output or "", o.catalog_property or (), o.catalog_namespace,
                                 bool(o.catalog_allow_http))
    if not o.extract:
        return problems
    looks_local = o.model.startswith(("/", "./", "../", "~")) or o.model.count("/") != 1
    if uses_endpoint(o):  # --model is the name the endpoint serves it under
        problems += endpoint_option_problems(o)
    elif looks_local and not Path(o.model).expanduser().exists():
        problems.append(f"--model {o.model}: no such model folder (a hub id looks like org/name)")
    return problems


# Runners whose workers run on this machine whatever the environment (the launcher's process or its children).
LOCAL_RUNNERS = ("directrunner", "bundlebaseddirectrunner", "switchingdirectrunner", "prismrunner",
                 "interactiverunner")


def runner_name(runner: Any) -> str:
    """Pure: a runner as Beam resolves `--runner` (any case, the module path or the name without "Runner", or a
    runner object): its lower-case class name, e.g. `portablerunner`; the DirectRunner when none is given."""
    name = (runner if isinstance(runner, str) else type(runner).__name__ if runner else "DirectRunner").lower()
    name = name.rsplit(".", 1)[-1]
    return name if name.endswith("runner") else f"{name}runner"


def environment_kind(environment_type: str | None) -> str:
    """Pure: `--environment_type` as DOCKER, EXTERNAL, PROCESS, LOOPBACK (its URN's last part), or ''."""
    env = (environment_type or "").upper()
    return env.split(":")[2] if env.startswith("BEAM:ENV:") and env.count(":") >= 2 else env


def workers_elsewhere(runner: Any, environment_type: str | None, job_endpoint: str | None = None) -> str | None:
    """Pure: why the run's SDK workers may not see this machine's files (None when they run here). Dataflow's
    are VMs; DOCKER (portable runners' default) and EXTERNAL environments are containers or worker pools that
    have only their own files; PROCESS workers run where the runner runs (here only for the local runners and an
    embedded job service); LOOPBACK workers are the launcher's own process."""
    name, env = runner_name(runner), (environment_type or "").upper()
    if "dataflow" in name:
        return f"--runner {runner} runs workers on other machines"
    if environment_kind(env) in ("DOCKER", "EXTERNAL"):
        return f"--environment_type {env} runs workers that see only their own files"
    if env == "LOOPBACK" or name in LOCAL_RUNNERS:
        return None
    if not env:
        return f"--runner {runner} runs workers in Docker containers unless --environment_type says otherwise"
    if name == "portablerunner" and job_endpoint in (None, "", "embed"):
        return None  # an embedded job service starts its workers on this machine
    return f"--environment_type {env} starts workers on the hosts of --runner {runner}"


def shared(path: str, folders: Sequence[str]) -> bool:
    """Pure: `path` is one of `folders` or inside one (absolute, normalised; "/" shares every path)."""
    absolute = os.path.abspath(os.path.expanduser(path))
    return any(absolute == f or absolute.startswith(f.rstrip("/") + "/")
               for f in (os.path.abspath(os.path.expanduser(f)) for f in folders))


def local_paths(o: Any) -> list[tuple[str, str]]:
    """(flag, path) of every local path the workers read or write: inputs (and @lists), the output, and the
    model folder of the in-process engine."""
    from pipelines.config.engine import reads_model_folder

    found = [("--input", i.removeprefix("@")) for i in o.input or []] + [("--output", o.output or "")]
    if o.extract and reads_model_folder(o) and Path(o.model).expanduser().exists():
        found.append(("--model", o.model))
    return [(flag, p.removeprefix("file://")) for flag, p in found
            if p and ("://" not in p or p.startswith("file://"))]


def local_path_problems(o: Any) -> list[str]:
    """A local path with a runner whose workers may run elsewhere: refused (the run would fail on a worker, or
    write where nobody looks), unless --shared-filesystem says every worker sees it at the same path."""
    from apache_beam.options.pipeline_options import PortableOptions, StandardOptions

    portable = o.view_as(PortableOptions)
    why = workers_elsewhere(o.view_as(StandardOptions).runner, portable.environment_type, portable.job_endpoint)
    if why is None:
        return []
    return [f"{flag} {path}: a local path, and {why}: use an object store (s3://, gs://), or pass "
            f"--shared-filesystem {path} if every worker sees it at that path (NFS, a volume, an image layer)"
            for flag, path in local_paths(o) if not shared(path, o.shared_filesystem or [])]


def device_plan_problems(o: Any) -> list[str]:
    """--devices on a run whose vLLM engines run on this machine: a plan it cannot make (more engines than GPUs,
    or than cores on a CPU; an id it does not see). Elsewhere the plan is made on each worker's machine."""
    from apache_beam.options.pipeline_options import PortableOptions, StandardOptions

    from pipelines.config.engine import reads_model_folder
    from transforms.engines.devices.plan import machine_plan, spec_problem

    portable = o.view_as(PortableOptions)
    if (spec_problem(str(o.devices)) or not o.extract or not reads_model_folder(o)
            or workers_elsewhere(o.view_as(StandardOptions).runner, portable.environment_type,
                                 portable.job_endpoint) is not None):
        return []
    try:
        machine_plan(str(o.devices), o.tensor_parallel_size)
    except ValueError as err:
        return [str(err)]
    return []


def endpoint_option_problems(o: Any) -> list[str]:
    """`--engine openai`'s options, then the endpoint itself (pipelines/run/preflight.py)."""
    if not o.endpoint:
        return ["--engine openai needs --endpoint URL (an OpenAI-compatible API, e.g. http://host:8000/v1)"]
    if not o.endpoint.startswith(("http://", "https://")):
        return [f"--endpoint {o.endpoint}: not an http(s) URL"]
    if o.concurrency < 1 or o.request_timeout_s <= 0:
        return ["--concurrency must be at least 1 and --request-timeout-s over 0"]
    names = load_price_names()
    from pipelines.config.engine import uses_batches

    batch = uses_batches(o)
    if batch and (o.batch_max_requests < 1 or o.batch_max_resubmits < 0):
        return ["--batch-max-requests must be at least 1 and --batch-max-resubmits at least 0"]
    if (o.endpoint_kind == "hosted" or batch) and o.api_price not in names:
        return [f"--api-price {o.api_price}: not in schemas/prices.json ({', '.join(names)})"]
    from pipelines.config.engine import endpoint_auth
    from pipelines.run.preflight import check_endpoint

    problem = check_endpoint(o.endpoint, o.model, o.api_key_env, endpoint_auth(o))
    return [problem] if problem else []


def load_price_names() -> list[str]:
    from transforms.model.budget import load_prices

    return list(load_prices()["providers"])
