"""An OpenAI-compatible endpoint (`--engine openai`): OpenAISettings (settings.py), OpenAIEngine (engine.py), its
request (prompt.py), the answer's checks (answer.py) and the endpoint's URL, key and model list (endpoint.py)."""
