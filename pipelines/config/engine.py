"""The engine choice: `--engine` (and its aliases) resolved to one kind, and that kind's settings value, the run's one
engine slot (transforms/engines/: VllmLocalSettings, VllmMachineSettings, OpenAISettings, SimulatedSettings).

The only reader of `--engine` and `--engine-service`: everything else takes the settings value, and
`transforms.engines.make` builds its engine by its `kind` (tests/test_repository.py holds the rule).
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from schemas.records import API_ROUTE_PREFIX

if TYPE_CHECKING:
    from transforms.engines import EngineChoice
    from transforms.engines.openai_batch.settings import OpenAIBatchSettings
    from transforms.engines.vllm_local.settings import VllmLocalSettings

KINDS = ("vllm_local", "vllm_machine", "openai", "openai_batch", "anthropic_batch", "simulated")
ALIAS = "vllm"  # the old value and the default: vllm_machine or vllm_local by `machine_engine`
SPELLINGS = {"openai-batch": "openai_batch", "anthropic-batch": "anthropic_batch"}  # the docs' spelling of a kind
CHOICES = (*KINDS, ALIAS, *SPELLINGS)
BATCH_KINDS = ("openai_batch", "anthropic_batch")  # hosted batch APIs (pipelines/run/batches.py)
ENDPOINT_KINDS = ("openai", *BATCH_KINDS)  # a hosted or served API answers: --endpoint, --model is its name
VLLM_KINDS = ("vllm_local", "vllm_machine")
SERVICE_ALIASES = {"machine": "vllm_machine", "process": "vllm_local"}  # --engine-service, kept for job files


def machine_engine(o: Any) -> bool:
    """The `vllm` alias's rule: one engine per machine (a service process) rather than one per worker process,
    when --engine-service says so, else when the DirectRunner runs several worker processes. Read after the
    run's local workers are resolved (a small run goes in process: pipelines/run/local_workers.py)."""
    if o.engine_service != "auto":
        return o.engine_service == "machine"
    from apache_beam.options.pipeline_options import DirectOptions

    direct = o.view_as(DirectOptions)
    return (direct.direct_running_mode == "multi_processing" and direct.direct_num_workers != 1) or several_devices(o)


def engine_kind(o: Any) -> str:
    """The one resolver of the engine choice: a kind of KINDS (`vllm` and --engine-service are aliases)."""
    if o.engine != ALIAS:
        return SPELLINGS.get(o.engine, str(o.engine))
    return "vllm_machine" if machine_engine(o) else "vllm_local"


def engine_problems(o: Any) -> list[str]:
    """--engine-service only qualifies the `vllm` alias: with an explicit kind it would be ignored silently.
    --devices must be one (transforms/engines/devices/plan.py spec_problem)."""
    from transforms.engines.devices.plan import spec_problem

    devices = spec_problem(str(o.devices))
    problems = [devices] if devices else []
    if o.engine_service == "auto" or o.engine == ALIAS or SERVICE_ALIASES[o.engine_service] == o.engine:
        return problems
    return [*problems, f"--engine-service {o.engine_service} is an alias of --engine "
                       f"{SERVICE_ALIASES[o.engine_service]}; it contradicts --engine {o.engine}"]


def several_devices(o: Any) -> bool:
    """The launcher's machine plans several engines for --devices (one per GPU, or --devices N on a CPU): a local
    run then needs the machine's engine service, which holds one engine per device."""
    from transforms.engines.devices.plan import machine_plan

    try:
        return len(machine_plan(str(o.devices), o.tensor_parallel_size)) > 1
    except ValueError:
        return False  # a plan that cannot be made is the preflight's problem line (pipelines/run/preflight.py)


def uses_endpoint(o: Any) -> bool:
    """An OpenAI-compatible endpoint answers the pages: --model is the name it serves the model under."""
    return engine_kind(o) in ENDPOINT_KINDS


def uses_batches(o: Any) -> bool:
    """A hosted batch API answers the pages: the run passes as its batches need (pipelines/run/batches.py)."""
    return engine_kind(o) in BATCH_KINDS


def batch_settings(kind: str, **fields: Any) -> OpenAIBatchSettings:
    """A hosted batch kind's settings (`kind` of BATCH_KINDS, or its spelling: `pagemill cancel --engine`)."""
    from transforms.engines.openai_batch.settings import AnthropicBatchSettings, OpenAIBatchSettings

    if SPELLINGS.get(kind, kind) == "anthropic_batch":
        return AnthropicBatchSettings(**fields)
    return OpenAIBatchSettings(**fields)


def endpoint_auth(o: Any) -> dict[str, str] | None:
    """The endpoint's key headers where they are not a bearer token (Anthropic's); None: the bearer token."""
    if engine_kind(o) != "anthropic_batch":
        return None
    from transforms.engines.openai_batch.anthropic import api_headers

    return api_headers(o.api_key_env)


def reads_model_folder(o: Any) -> bool:
    """The workers (or their machine's engine service) load --model themselves: a vLLM engine."""
    return engine_kind(o) in VLLM_KINDS


def vllm_settings(o: Any, run_id: str | None = None) -> VllmLocalSettings:
    """The vLLM engine the options describe (the machine engine's service runs one of these too). Its model
    fields are keyed in the cache configuration whichever engine runs (pipelines/run/settings.py). `run_id`:
    the run's (its RunPlace's; default --run-id)."""
    from transforms.engines.vllm_local.settings import VllmLocalSettings

    return VllmLocalSettings(model=o.model, model_revision=o.model_revision, max_model_len=o.max_model_len,
                             max_num_seqs=o.max_num_seqs, gpu_memory_utilization=o.gpu_memory_utilization,
                             tensor_parallel_size=o.tensor_parallel_size, limit_mm_per_prompt=o.limit_mm_per_prompt,
                             kv_cache_gib=o.kv_cache_gib, enforce_eager=o.enforce_eager, in_process=o.engine_in_process,
                             devices=str(o.devices), run_key=_run_id(o, run_id))


def _run_id(o: Any, run_id: str | None) -> str:
    return (o.run_id or "") if run_id is None else run_id


def engine_settings(o: Any, run_id: str | None = None) -> EngineChoice:
    """The run's engine slot, by its resolved kind. The machine engine's folder is named after `run_id` (the
    run's RunPlace's; default --run-id): call it once a run (a refused private base makes a new folder at each
    call)."""
    kind = engine_kind(o)
    run_id = _run_id(o, run_id)
    if kind == "openai":
        from transforms.engines.openai.settings import OpenAISettings

        return OpenAISettings(endpoint=o.endpoint or "", model=o.model, api_key_env=o.api_key_env,
                              concurrency=max(1, o.concurrency), request_timeout_s=o.request_timeout_s)
    if kind in BATCH_KINDS:
        from schemas.layout import batch_folder

        return batch_settings(kind, endpoint=o.endpoint or "", model=o.model, api_key_env=o.api_key_env,
                              folder=batch_folder(o.output or "", o.tenant, run_id),
                              run_key=f"{o.tenant}/{run_id}", max_requests=o.batch_max_requests,
                              max_resubmits=o.batch_max_resubmits, request_timeout_s=o.request_timeout_s)
    if kind == "simulated":
        from transforms.engines.simulated import SimulatedSettings

        return SimulatedSettings()
    vllm = vllm_settings(o, run_id)
    if kind == "vllm_local":
        return vllm
    from transforms.engines.vllm_machine.folder import service_dir
    from transforms.engines.vllm_machine.settings import VllmMachineSettings

    return VllmMachineSettings(vllm=vllm, service_dir=o.engine_service_dir or service_dir(run_id, vllm),
                               devices=str(o.devices))


def resolved_engine(o: Any, engine: EngineChoice, run_id: str | None = None) -> EngineChoice:
    """`engine` (built before the run's local workers were resolved), or the slot again when the `vllm` alias now
    resolves to another kind (a small run goes in process). Keeps a machine engine's folder: made once a run."""
    return engine if engine_kind(o) == engine.kind else engine_settings(o, run_id)


def with_log_file(engine: EngineChoice, log: str) -> EngineChoice:
    """The run's log file (pipelines/run/run_log.py) on a machine engine's settings: its service processes, which
    outlive the worker that starts them, write their lines there. Other kinds write where their process does."""
    return replace(engine, log_file=log) if engine.kind == "vllm_machine" else engine


def model_route(o: Any) -> str:
    """The ledger route of a page sent to the model: how its cost is counted (schemas/records.py ROUTES). An
    endpoint is `served` (self-hosted, priced by --gpu-hourly-usd) or a hosted API (--api-price's list price)."""
    if not uses_endpoint(o):
        return "model"
    if engine_kind(o) in BATCH_KINDS:  # a hosted batch: --api-price's batch rate (transforms/model/budget.py)
        from transforms.model.budget import BATCH_TIER

        return f"{API_ROUTE_PREFIX}{o.api_price}{BATCH_TIER}"
    return "served" if o.endpoint_kind == "served" else f"{API_ROUTE_PREFIX}{o.api_price}"


def max_in_flight(o: Any) -> int:
    """--max-in-flight; 0 lets the stage take twice the engine's sequences, except for an endpoint: its requests
    in flight (--concurrency), and as many queued behind them in the stage."""
    return o.max_in_flight or (2 * max(1, o.concurrency) if uses_endpoint(o) else 0)
