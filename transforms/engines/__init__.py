"""Engines: what answers a page (vLLM in process, one engine per machine, a served endpoint, a simulated engine for
benchmarks) and the feed in front of them."""
