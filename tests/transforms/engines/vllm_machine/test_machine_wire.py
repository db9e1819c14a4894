"""The engine service's frames (transforms/engines/vllm_machine/wire.py): round trips, limits, malformed frames, and
the sampling fields that replace a pickled SamplingParams. The frames over a real service: test_machine_service.py."""
from __future__ import annotations

import json
import struct

import pytest

from schemas.extraction import load_schema
from tests.conftest import vllm_available
from transforms.engines.base import Sampling
from transforms.engines.vllm_local.vllm_args import vllm_sampling
from transforms.engines.vllm_machine import wire
from transforms.extract.feed import sampling
from transforms.model.markdown import MARKDOWN_FORMATS

SAMPLING = {"temperature": 0.0, "top_p": 1.0, "max_tokens": 64, "json": {"type": "object"}}


def frame(header: object, payload: bytes = b"") -> bytes:
    """A frame built by hand (not by wire.encode), as a hostile or broken peer would."""
    head = json.dumps(header).encode()
    return struct.pack(">I", len(head)) + head + payload


def test_every_kind_round_trips() -> None:
    submit = wire.submit_header(7, "describe <image>", SAMPLING, 512, (300, 400))
    header, payload = wire.decode(wire.encode(submit, b"\xff\xd8jpeg"), wire.TO_SERVICE)
    assert wire.as_submit(header, payload) == wire.Submit(7, "describe <image>", SAMPLING, 512, (300, 400),
                                                          b"\xff\xd8jpeg")
    replies = [
        {"kind": "done", "rid": 7, "text": "{}", "finish_reason": "stop", "tokens": [2, 1, 2],
         "gpu_seconds": 0.5, "starts": 1, "cached_tokens": 1408},
        {"kind": "done", "rid": 8, "text": "", "finish_reason": None, "tokens": [0, 0, 0],
         "gpu_seconds": 0.5, "starts": 1, "cached_tokens": 0},
        {"kind": "error", "rid": 7, "error": "rejected", "message": "ValueError: too long", "starts": 2},
        {"kind": "starts", "starts": 3},
    ]
    for reply in replies:
        assert wire.decode(wire.encode(reply), wire.TO_WORKER) == (reply, b"")
    restart = {"kind": "restart", "seen": 1}
    assert wire.decode(wire.encode(restart), wire.TO_SERVICE) == (restart, b"")
    abort = {"kind": "abort", "rid": 7}
    assert wire.decode(wire.encode(abort), wire.TO_SERVICE) == (abort, b"")


GOOD_SUBMIT = wire.submit_header(1, "p", SAMPLING, 0, (10, 10))


@pytest.mark.parametrize("data, allowed", [
    (b"", wire.TO_SERVICE),                                              # shorter than its length field
    (struct.pack(">I", 100) + b"{}", wire.TO_SERVICE),                   # header length past the frame
    (struct.pack(">I", wire.MAX_HEADER + 1) + b"{}", wire.TO_SERVICE),   # header over the limit
    (struct.pack(">I", 3) + b"\x80\x04K", wire.TO_SERVICE),              # not JSON (a pickle's opening bytes)
    (frame([1, 2]), wire.TO_SERVICE),                                    # not an object
    (frame({"kind": "done", "rid": 1, "text": "", "finish_reason": None, "tokens": [0, 0, 0], "gpu_seconds": 0.0,
            "starts": 1, "cached_tokens": 0}), wire.TO_SERVICE),         # a reply sent to the service
    (frame(GOOD_SUBMIT), wire.TO_WORKER),                                # a request sent to a worker
    (frame({**GOOD_SUBMIT, "extra": 1}, b"x"), wire.TO_SERVICE),         # an unknown field
    (frame({**GOOD_SUBMIT, "rid": True}, b"x"), wire.TO_SERVICE),        # a bool is not an id
    (frame({**GOOD_SUBMIT, "size": [10]}, b"x"), wire.TO_SERVICE),       # a size of one side
    (frame({**GOOD_SUBMIT, "size": [0, 10]}, b"x"), wire.TO_SERVICE),    # an empty page
    (frame({**GOOD_SUBMIT, "detail_side": -1}, b"x"), wire.TO_SERVICE),
    (frame({**GOOD_SUBMIT, "size": [10, wire.MAX_SIDE + 1]}, b"x"), wire.TO_SERVICE),  # a resize bomb
    (frame(GOOD_SUBMIT), wire.TO_SERVICE),                               # a page without its image
    (frame({**GOOD_SUBMIT, "sampling": {**SAMPLING, "seed": 1}}, b"x"), wire.TO_SERVICE),  # unknown sampling field
    (frame({**GOOD_SUBMIT, "sampling": {"temperature": 0.0, "top_p": 1.0}}, b"x"), wire.TO_SERVICE),
    (frame({**GOOD_SUBMIT, "sampling": {**SAMPLING, "max_tokens": 0}}, b"x"), wire.TO_SERVICE),
    (frame({"kind": "starts", "starts": 1}, b"x"), wire.TO_WORKER),      # a payload where none belongs
    (frame({"kind": "done", "rid": 1, "text": "", "finish_reason": None, "tokens": ["1", 0, 0], "gpu_seconds": 0.0,
            "starts": 1, "cached_tokens": 0}), wire.TO_WORKER),          # a count that is not a number
    (frame({"kind": "done", "rid": 1, "text": "t", "finish_reason": None, "tokens": [1, 1], "gpu_seconds": 0.0,
            "starts": 1, "cached_tokens": 0}), wire.TO_WORKER),          # counts without the output's
    (frame({"kind": "done", "rid": 1, "text": "t", "finish_reason": 3, "tokens": [1, 1, 1], "gpu_seconds": 0.0,
            "starts": 1, "cached_tokens": 0}), wire.TO_WORKER),          # a finish reason that is not a word
    (frame({"kind": "done", "rid": 1, "text": "", "finish_reason": None, "tokens": [0, 0, 0], "gpu_seconds": 0.0,
            "starts": 1}), wire.TO_WORKER),                              # without the cached prompt tokens
    (frame({"kind": "abort", "rid": 1}), wire.TO_WORKER),                # an abort sent to a worker
    (frame({"kind": "error", "rid": 1, "error": "exec", "message": "", "starts": 1}), wire.TO_WORKER),
])
def test_malformed_frames_are_refused(data: bytes, allowed: tuple[str, ...]) -> None:
    with pytest.raises(wire.FrameError):
        wire.decode(data, allowed)


def test_frames_over_the_limits_are_not_built() -> None:
    with pytest.raises(wire.FrameError):
        wire.encode(GOOD_SUBMIT, b"x" * (wire.MAX_PAYLOAD + 1))
    with pytest.raises(wire.FrameError):
        wire.encode({**GOOD_SUBMIT, "prompt": "x" * wire.MAX_HEADER}, b"x")
    assert wire.MAX_FRAME == 4 + wire.MAX_HEADER + wire.MAX_PAYLOAD  # what recv_bytes accepts, at most


@pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (scripts/setup_venv.sh)")
def test_sampling_fields_rebuild_the_same_sampling_params() -> None:
    """The feed's Sampling crosses the wire as fields and rebuilds the same Sampling and equal SamplingParams in
    the service: a field the feed starts to set (a seed, stop strings) and the wire drops fails here."""
    invoice = load_schema("invoice")
    constrained = [f for f in MARKDOWN_FORMATS.values() if f.regex]
    free = [f for f in MARKDOWN_FORMATS.values() if not f.regex]
    assert constrained and free  # both kinds of markdown constraint are covered
    for markdown in (None, constrained[0], free[0]):
        for attempt in (1, 2):
            made = sampling(invoice, 300, attempt, markdown)
            params = vllm_sampling(made)
            sent = made.fields()
            assert json.loads(json.dumps(sent)) == sent  # JSON, as it crosses the socket
            received = Sampling.of_fields(wire.check_sampling(json.loads(json.dumps(sent))))
            assert received == made and vllm_sampling(received) == params
    assert sampling(invoice, 300, 2).temperature > 0  # attempt 2 samples: the two differ
