"""The engine choice: `--engine` (and its aliases) resolved to one kind, and that kind's settings value, the run's one
engine slot (transforms/engines/: VllmLocalSettings, VllmMachineSettings, OpenAISettings, SimulatedSettings).

The only reader of `--engine` and `--engine-service`: everything else takes the settings value, and
`transforms.engines.make` builds its engine by its `kind` (tests/test_repository.py holds the rule).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from schemas.records import API_ROUTE_PREFIX

if TYPE_CHECKING:
    from transforms.engines import EngineChoice
    from transforms.engines.vllm_local.settings import VllmLocalSettings

KINDS = ("vllm_local", "vllm_machine", "openai", "simulated")
ALIAS = "vllm"  # the old value and the default: vllm_machine or vllm_local by `machine_engine`
CHOICES = (*KINDS, ALIAS)
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
    return direct.direct_running_mode == "multi_processing" and direct.direct_num_workers != 1


def engine_kind(o: Any) -> str:
    """The one resolver of the engine choice: a kind of KINDS (`vllm` and --engine-service are aliases)."""
    if o.engine != ALIAS:
        return str(o.engine)
    return "vllm_machine" if machine_engine(o) else "vllm_local"


def engine_problems(o: Any) -> list[str]:
    """--engine-service only qualifies the `vllm` alias: with an explicit kind it would be ignored silently."""
    if o.engine_service == "auto" or o.engine == ALIAS or SERVICE_ALIASES[o.engine_service] == o.engine:
        return []
    return [f"--engine-service {o.engine_service} is an alias of --engine {SERVICE_ALIASES[o.engine_service]}; "
            f"it contradicts --engine {o.engine}"]


def uses_endpoint(o: Any) -> bool:
    """An OpenAI-compatible endpoint answers the pages: --model is the name it serves the model under."""
    return engine_kind(o) == "openai"


def reads_model_folder(o: Any) -> bool:
    """The workers (or their machine's engine service) load --model themselves: a vLLM engine."""
    return engine_kind(o) in VLLM_KINDS


def vllm_settings(o: Any) -> VllmLocalSettings:
    """The vLLM engine the options describe (the machine engine's service runs one of these too). Its model
    fields are keyed in the cache configuration whichever engine runs (pipelines/run/settings.py)."""
    from transforms.engines.vllm_local.settings import VllmLocalSettings

    return VllmLocalSettings(model=o.model, model_revision=o.model_revision, max_model_len=o.max_model_len,
                             max_num_seqs=o.max_num_seqs, gpu_memory_utilization=o.gpu_memory_utilization,
                             tensor_parallel_size=o.tensor_parallel_size, limit_mm_per_prompt=o.limit_mm_per_prompt,
                             kv_cache_gib=o.kv_cache_gib, enforce_eager=o.enforce_eager, in_process=o.engine_in_process)


def engine_settings(o: Any) -> EngineChoice:
    """The run's engine slot, by its resolved kind. The machine engine's folder is named after the run id: call it
    once the run id is set, and once a run (a refused private base makes a new folder at each call)."""
    kind = engine_kind(o)
    if kind == "openai":
        from transforms.engines.openai.settings import OpenAISettings

        return OpenAISettings(endpoint=o.endpoint or "", model=o.model, api_key_env=o.api_key_env,
                              concurrency=max(1, o.concurrency), request_timeout_s=o.request_timeout_s)
    if kind == "simulated":
        from transforms.engines.simulated import SimulatedSettings

        return SimulatedSettings()
    vllm = vllm_settings(o)
    if kind == "vllm_local":
        return vllm
    from transforms.engines.vllm_machine.folder import service_dir
    from transforms.engines.vllm_machine.settings import VllmMachineSettings

    return VllmMachineSettings(vllm=vllm, service_dir=o.engine_service_dir or service_dir(o.run_id or "", vllm))


def resolved_engine(o: Any, engine: EngineChoice) -> EngineChoice:
    """`engine` (built before the run's local workers were resolved), or the slot again when the `vllm` alias now
    resolves to another kind (a small run goes in process). Keeps a machine engine's folder: made once a run."""
    return engine if engine_kind(o) == engine.kind else engine_settings(o)


def model_route(o: Any) -> str:
    """The ledger route of a page sent to the model: how its cost is counted (schemas/records.py ROUTES). An
    endpoint is `served` (self-hosted, priced by --gpu-hourly-usd) or a hosted API (--api-price's list price)."""
    if not uses_endpoint(o):
        return "model"
    return "served" if o.endpoint_kind == "served" else f"{API_ROUTE_PREFIX}{o.api_price}"


def max_in_flight(o: Any) -> int:
    """--max-in-flight; 0 lets the stage take twice the engine's sequences, except for an endpoint: its requests
    in flight (--concurrency), and as many queued behind them in the stage."""
    return o.max_in_flight or (2 * max(1, o.concurrency) if uses_endpoint(o) else 0)
