"""A fake vLLM engine core whose token stream falls into a loop: LoopingCore.
Moved from tests/transforms/engines/vllm_shared/test_repetition.py, which other test files imported."""
from __future__ import annotations


# The guard in the engine's step loop (transforms/engines/vllm_local/engine.py), over a fake engine core that injects
# the fault: one request's token stream falls into a loop, the other's does not.
class LoopingCore:
    """vllm.LLM's surface that VllmLocalEngine drives (preprocess, add_request, step, abort_request), emitting vLLM's
    DELTA RequestOutputs: one token per running request per step."""

    def __init__(self, streams: dict[int, list[int]]) -> None:
        self.llm_engine = self
        self.streams = streams  # by prompt length: which stream a request decodes
        self.live: dict[str, list] = {}
        self.aborted: list[str] = []

    def _preprocess_cmpl_one(self, request: dict) -> dict:
        return request

    def add_request(self, rid: str, request: dict, params) -> None:
        self.live[rid] = [iter(self.streams[len(request["prompt"])]), params.max_tokens, 0]

    def abort_request(self, ids: list[str]) -> None:
        self.aborted += ids
        for rid in ids:
            self.live.pop(rid, None)

    def step(self) -> list:
        from types import SimpleNamespace

        outputs = []
        for rid, state in list(self.live.items()):
            token = next(state[0])
            state[2] += 1
            done = state[2] >= state[1]
            sample = SimpleNamespace(text=f"<{token}>", token_ids=[token], finish_reason="length" if done else None)
            outputs.append(SimpleNamespace(request_id=rid, outputs=[sample], finished=done, prompt_token_ids=[1, 2],
                                           num_cached_tokens=0))
            if done:
                del self.live[rid]
        return outputs
