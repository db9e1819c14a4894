"""Hosted batch APIs (`--engine openai_batch`): OpenAIBatchSettings (settings.py), the engine that answers pages
from collected batch results and spools the rest (engine.py), the run's batch files and state (files.py), the
provider's files and batches endpoints (client.py) and the launcher's step: recover, poll, collect, resubmit,
submit (driver.py), Anthropic's Message Batches behind the same driver (anthropic.py, `--engine anthropic_batch`),
and one launcher per run (lock.py). The run-level loop (exit 75, --wait) is pipelines/run/batches.py."""
