"""The engine service's frames: a JSON header and raw bytes, in both directions; never a pickle.

A frame is one multiprocessing message (`Connection.send_bytes`: its own 4-byte length, then the bytes):
a 4-byte big-endian header length, the header (a UTF-8 JSON object with a `kind`), and the payload (raw
bytes: a page's encoded image, or nothing). `recv` refuses a message over MAX_FRAME before reading it, and
checks the header against its kind's fields and types; anything else is a FrameError, on which the receiver
closes that connection (the service goes on serving its other workers; a worker fails what it had in flight,
and the feed resubmits it). Multiprocessing's HMAC authkey handshake runs before any frame and unpickles
nothing.

Messages: worker -> service `submit` (rid, prompt, sampling fields, page detail_side and size; payload: the
page's encoded bytes), `restart` (seen) and `abort` (rid: --answer-timeout-s gave up on it); service -> worker
`done` (the answer's text, finish reason and token counts as the service's engine counted them: image, text,
output, and the prompt tokens the prefix cache held), `error` (rejected | engine) and `starts`.
"""
from __future__ import annotations

import io
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from PIL import Image

MAX_HEADER = 8 << 20  # prompt, sampling (a JSON schema), or a reply's token ids and text: far below this
MAX_PAYLOAD = 64 << 20  # one page's encoded image
MAX_FRAME = 4 + MAX_HEADER + MAX_PAYLOAD
MAX_SIDE = 1 << 15  # px: a page's target size is resized to in the service, so it is bounded too
_LENGTH = struct.Struct(">I")
SAMPLING_FIELDS = {"temperature": float, "top_p": float, "max_tokens": int, "json": dict, "regex": str}
SAMPLING_REQUIRED = ("temperature", "top_p", "max_tokens")
ERROR_KINDS = ("rejected", "engine")
KINDS: dict[str, dict[str, type]] = {
    "submit": {"rid": int, "prompt": str, "sampling": dict, "detail_side": int, "size": list},
    "restart": {"seen": int},
    "done": {"rid": int, "text": str, "finish_reason": object, "tokens": list, "gpu_seconds": float, "starts": int,
             "cached_tokens": int},
    "abort": {"rid": int},
    "error": {"rid": int, "error": str, "message": str, "starts": int},
    "starts": {"starts": int},
}
TO_SERVICE = ("submit", "restart", "abort")
TO_WORKER = ("done", "error", "starts")


class FrameError(ValueError):
    """A frame that is not one of the protocol's: its connection is closed."""


@dataclass(frozen=True)
class Submit:
    """One page request as the service received it."""

    rid: int
    prompt: str
    sampling: dict[str, Any]
    detail_side: int
    size: tuple[int, int]
    image: bytes


def encode(header: Mapping[str, Any], payload: bytes = b"") -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode()
    if len(head) > MAX_HEADER or len(payload) > MAX_PAYLOAD:
        raise FrameError(f"frame over the limits: header {len(head)} B, payload {len(payload)} B")
    return _LENGTH.pack(len(head)) + head + payload


def _typed(value: Any, kind: type) -> bool:
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(_typed(v, int) for v in value)


def check_sampling(fields: Any) -> dict[str, Any]:
    """The sampling fields as pagemill sets them (transforms/engines/base.py Sampling.fields), or FrameError."""
    if (not isinstance(fields, dict) or not set(SAMPLING_REQUIRED) <= fields.keys()
            or not fields.keys() <= SAMPLING_FIELDS.keys()
            or not all(_typed(fields[k], SAMPLING_FIELDS[k]) for k in fields) or fields["max_tokens"] < 1):
        raise FrameError(f"bad sampling fields: {str(fields)[:200]}")
    return fields


def _check(header: dict[str, Any], payload: bytes) -> None:
    """Kind-specific checks beyond the fields' types (FrameError)."""
    kind = header["kind"]
    if kind == "submit":
        size = header["size"]
        if (len(size) != 2 or not _ints(size) or min(size) < 1 or max(size) > MAX_SIDE or not payload
                or not 0 <= header["detail_side"] <= MAX_SIDE):
            raise FrameError("bad submit: size, detail_side or image")
        check_sampling(header["sampling"])
    elif payload:
        raise FrameError(f"a {kind} frame carries no payload")
    if kind == "done":
        tokens, reason = header["tokens"], header["finish_reason"]
        if len(tokens) != 3 or not _ints(tokens) or min(tokens) < 0 or not (reason is None or isinstance(reason, str)):
            raise FrameError("bad done: token counts or finish reason")
    if kind == "error" and header["error"] not in ERROR_KINDS:
        raise FrameError(f"bad error kind {header['error'][:50]!r}")


def decode(frame: bytes, allowed: tuple[str, ...]) -> tuple[dict[str, Any], bytes]:
    """(header, payload) of one frame whose kind is in `allowed`, checked; else FrameError."""
    if len(frame) < _LENGTH.size:
        raise FrameError("frame shorter than its header length")
    (size,) = _LENGTH.unpack_from(frame)
    if size > MAX_HEADER or _LENGTH.size + size > len(frame):
        raise FrameError(f"bad header length {size}")
    try:
        header = json.loads(frame[_LENGTH.size:_LENGTH.size + size])
    except (UnicodeDecodeError, ValueError) as err:
        raise FrameError(f"header is not JSON: {err}") from err
    payload = frame[_LENGTH.size + size:]
    if not isinstance(header, dict) or header.get("kind") not in allowed:
        raise FrameError(f"unexpected frame: {str(header)[:100]}")
    fields = KINDS[header["kind"]]
    if header.keys() != {"kind", *fields} or not all(_typed(header[k], t) for k, t in fields.items()):
        raise FrameError(f"bad {header['kind']} header: {str(header)[:200]}")
    _check(header, payload)
    return header, payload


def send(conn: Connection, header: Mapping[str, Any], payload: bytes = b"") -> None:
    conn.send_bytes(encode(header, payload))


def recv(conn: Connection, allowed: tuple[str, ...]) -> tuple[dict[str, Any], bytes]:
    """The next frame. EOFError/OSError: the peer is gone (or sent more than MAX_FRAME); FrameError: malformed."""
    return decode(conn.recv_bytes(MAX_FRAME), allowed)


def submit_header(rid: int, prompt: str, sampling: Mapping[str, Any], detail_side: int,
                  size: tuple[int, int]) -> dict[str, Any]:
    return {"kind": "submit", "rid": rid, "prompt": prompt, "sampling": dict(sampling), "detail_side": detail_side,
            "size": list(size)}


def as_submit(header: dict[str, Any], payload: bytes) -> Submit:
    return Submit(header["rid"], header["prompt"], header["sampling"], header["detail_side"],
                  (header["size"][0], header["size"][1]), payload)


def encode_png(img: Image.Image) -> bytes:
    """A request that carries only a PIL image (no encoded page): lossless PNG at compress_level=1, the
    fastest (docs/development.md's render figures); RGB, as the engine's decoder gives every page."""
    buf = io.BytesIO()
    (img if img.mode == "RGB" else img.convert("RGB")).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()
