"""vLLM in the worker's own process (`--engine vllm_local`): VllmLocalSettings (settings.py), VllmLocalEngine
(engine.py: the step loop) and what vLLM is given (vllm_args.py: environment, LLM arguments, sampling)."""
