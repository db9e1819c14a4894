"""Strings that leave the process. `terminal_safe`: the one rule for untrusted text that came from a
document or a remote server (a file name, a message, an extraction, an endpoint's error body) and is
printed. `redact_url`: credentials in URLs (`--endpoint http://u:pw@host/v1`) never printed or recorded.

Every character that can move the cursor, retitle or recolour the terminal, hide or reorder a line is
written as its Python escape (`\\x1b`, `\\r`, `\\u202e`), so the printed line shows what was there and
does nothing: C0 controls (tab and newline included: one value stays on one line), DEL and C1 controls,
the line and paragraph separators, and every Unicode format character (category Cf: invisible, and many
steer how text around them is shown: bidi embeddings, overrides and isolates, U+061C, zero-width space,
joiners and marks, the word joiner and invisible operators U+2060-2064, the soft hyphen U+00AD, the Mongolian
vowel separator U+180E, U+FEFF, interlinear annotation marks, prepended concatenation marks) and the whole tag
block U+E0000-E007F (invisible letters that can smuggle text past a reader).
"""
from __future__ import annotations

import ipaddress
import re

# Cf as of Unicode 15.1 (Python 3.11 knows 14.0; 15.0 added U+13439-1343F), written out because `re` has no
# \p{Cf}; tests/transforms/test_text_safety.py checks every Cf character Python's unicodedata knows.
_FORMAT = ("\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u202a-\u202e"
           "\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f"
           "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e007f")
UNSAFE = re.compile(f"[\x00-\x1f\x7f-\x9f\u2028\u2029{_FORMAT}]")


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


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine's loopback by itself (no name is resolved). Pure: what may be sent in
    the clear (a served endpoint, a catalog) or listened on without a warning (the worker pool)."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
