"""Strings that leave the process. `terminal_safe`: the one rule for untrusted text that came from a
document or a remote server (a file name, a message, an extraction, an endpoint's error body) and is
printed. `redact_url`: credentials in URLs (`--endpoint http://u:pw@host/v1`) never printed or recorded.

Every character that can move the cursor, retitle or recolour the terminal, hide or reorder a line is
written as its Python escape (`\\x1b`, `\\r`, `\\u202e`), so the printed line shows what was there and
does nothing: C0 controls (tab and newline included: one value stays on one line), DEL and C1 controls,
the line and paragraph separators, and the invisible direction and width controls (bidi embeddings and
overrides U+202A-202E, isolates U+2066-2069, the Arabic letter mark U+061C, zero-width space, joiners and
marks U+200B-200F, the byte-order mark U+FEFF).
"""
from __future__ import annotations

import re

UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff]")


def _escape(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


def terminal_safe(text: str) -> str:
    """`text` with each unsafe character (UNSAFE) replaced by its Python escape; everything else as it was."""
    return UNSAFE.sub(_escape, text)


# A URL's authority: `scheme://[userinfo@]host[:port]`; the userinfo ends at the authority's last `@`.
_AUTHORITY = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)([^/?#\s]*)")


def _redact_authority(match: re.Match[str]) -> str:
    scheme, authority = match.groups()
    userinfo, at, host = authority.rpartition("@")
    if not at:
        return match.group()
    user, colon, _ = userinfo.partition(":")
    return f"{scheme}{user}:***@{host}" if colon else f"{scheme}***@{host}"  # a lone user part may be a token


def redact_url(text: str) -> str:
    """`text` with the credentials of every URL in it hidden: `http://u:pw@h/v1` becomes `http://u:***@h/v1`
    (the user name stays, to say whose), `https://TOKEN@h` becomes `https://***@h`. For what is printed,
    logged or recorded (the manifest, messages); the URL itself is used as given."""
    return _AUTHORITY.sub(_redact_authority, text)
