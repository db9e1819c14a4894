"""One vLLM engine per machine (`--engine vllm_machine`), fed by every worker process: VllmMachineSettings
(settings.py), VllmMachineEngine (engine.py: a worker's handle), the service process (service.py), its frames
(wire.py) and its private folder (folder.py)."""
