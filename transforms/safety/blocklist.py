"""Hash blocklists: exact sha256 values and PDQ perceptual hashes, read from files or object storage.

A list is text, one entry a line: `sha256:<64 hex>` or `pdq:<64 hex>`; `#` starts a comment; blank
lines are ignored; anything else is an error that names the list and the line (a typo in a blocklist
must stop the run, not silently let content through).

- sha256 entries match a document's bytes (`doc_sha256`, before anything is rendered) and a page's
  normalised pixels (`page_hash`, as written in the `pages` table), exactly.
- pdq entries match a page as the model would see it, within a Hamming distance (`--pdq-threshold`,
  31 of 256 bits by default: Meta's recommended operating point). PDQ is computed on the page
  downscaled to at most 512 px (as Meta's reference hasher does), and hashes of quality under 50
  (flat or nearly blank images, whose hashes are unstable) never match.

PDQ hashes are written as ThreatExchange writes them: the 256 bits of `pdqhash.compute`, most
significant first, as 64 lower-case hex digits; so lists exchanged with other PDQ users work as-is.
"""
from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

PDQ_SIDE = 512
PDQ_MIN_QUALITY = 50
_ENTRY = re.compile(r"^(sha256|pdq):([0-9a-fA-F]{64})$")


class BlocklistError(ValueError):
    """A list that cannot be read or parsed: a configuration error, reported before the run."""


@dataclass(frozen=True)
class Match:
    kind: str  # "sha256" or "pdq"
    list_uri: str
    line: int
    distance: int = 0
    threshold: int = 0


@dataclass(frozen=True)
class Blocklists:
    """Parsed lists. PDQ entries are an (N, 4) uint64 array so that a page is matched against a
    million entries with one vectorised XOR and popcount."""

    sha256: dict[str, tuple[str, int]] = field(default_factory=dict)
    pdq: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), np.uint64))
    pdq_sources: tuple[tuple[str, int], ...] = ()
    fingerprint: str = ""  # sha256 over the lists' contents: part of the safety configuration

    def __len__(self) -> int:
        return len(self.sha256) + len(self.pdq_sources)

    def match_sha256(self, *digests: str | None) -> Match | None:
        for digest in digests:
            if digest and digest.lower() in self.sha256:
                uri, line = self.sha256[digest.lower()]
                return Match("sha256", uri, line)
        return None

    def match_pdq(self, pdq_hex: str | None, threshold: int) -> Match | None:
        """The nearest entry within `threshold`, or None."""
        if pdq_hex is None or not len(self.pdq_sources):
            return None
        distances = np.bitwise_count(self.pdq ^ pdq_words(pdq_hex)).sum(axis=1)
        best = int(distances.argmin())
        if int(distances[best]) > threshold:
            return None
        uri, line = self.pdq_sources[best]
        return Match("pdq", uri, line, distance=int(distances[best]), threshold=threshold)


def pdq_words(pdq_hex: str) -> np.ndarray:
    return np.frombuffer(bytes.fromhex(pdq_hex), dtype=">u8").astype(np.uint64)


def parse_blocklist(text: str, uri: str) -> tuple[dict[str, tuple[str, int]], list[tuple[str, tuple[str, int]]]]:
    """(sha256 entries, pdq entries) of one list. Raises BlocklistError on a line it cannot read."""
    sha: dict[str, tuple[str, int]] = {}
    pdq: list[tuple[str, tuple[str, int]]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        found = _ENTRY.match(line)
        if found is None:
            raise BlocklistError(f"{uri} line {number}: expected sha256:<64 hex> or pdq:<64 hex>, got {line[:80]!r}")
        kind, value = found.group(1), found.group(2).lower()
        if kind == "sha256":
            sha.setdefault(value, (uri, number))
        else:
            pdq.append((value, (uri, number)))
    return sha, pdq


def read_text(uri: str) -> str:
    """A list from any Beam filesystem (local, s3://, gs://)."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    try:
        with FileSystems.open(uri, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            data = handle.read()
    except Exception as err:
        raise BlocklistError(f"{uri}: cannot read the blocklist ({type(err).__name__}: {err})") from err
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BlocklistError(f"{uri}: a blocklist is UTF-8 text") from err


def load_blocklists(uris: Sequence[str]) -> Blocklists:
    if not uris:
        return Blocklists()
    sha: dict[str, tuple[str, int]] = {}
    pdq: list[tuple[str, tuple[str, int]]] = []
    digest = hashlib.sha256()
    for uri in uris:
        text = read_text(uri)
        digest.update(hashlib.sha256(text.encode()).digest())
        s, p = parse_blocklist(text, uri)
        for key, source in s.items():
            sha.setdefault(key, source)
        pdq.extend(p)
    words = np.stack([pdq_words(h) for h, _ in pdq]) if pdq else np.zeros((0, 4), np.uint64)
    return Blocklists(sha256=sha, pdq=words, pdq_sources=tuple(src for _, src in pdq), fingerprint=digest.hexdigest())


def pdq_hash(img: Image.Image) -> tuple[str, int]:
    """(64-hex PDQ hash, quality 0-100) of an image, computed on a copy at most PDQ_SIDE px."""
    import pdqhash

    # PDQ hashes luminance: a grey image is resized as one channel (a third of the work) and given to
    # pdqhash as three equal channels, which is what converting it to RGB first would give.
    small = img if img.mode in ("RGB", "L") else img.convert("RGB")
    size = thumbnail_size(small.size, PDQ_SIDE)
    if size != small.size:
        # What Image.thumbnail does (its default reducing_gap too), without the in-place copy it needs.
        small = small.resize(size, Image.Resampling.BILINEAR, reducing_gap=2.0)
    pixels = np.asarray(small)
    if pixels.ndim == 2:
        pixels = np.repeat(pixels[..., None], 3, axis=2)
    bits, quality = pdqhash.compute(np.ascontiguousarray(pixels))
    value = int("".join(str(int(b)) for b in bits), 2)
    return f"{value:064x}", int(quality)


def thumbnail_size(size: tuple[int, int], side: int) -> tuple[int, int]:
    """The size Pillow's `Image.thumbnail((side, side))` gives an image of `size` (its aspect rounding)."""
    width, height = size
    if width <= side and height <= side:
        return size
    aspect = width / height
    if aspect <= 1:  # side / side >= aspect: the height is the bound
        x = max(min(math.floor(side * aspect), math.ceil(side * aspect), key=lambda n: abs(aspect - n / side)), 1)
        return x, side
    y = max(min(math.floor(side / aspect), math.ceil(side / aspect),
                key=lambda n: 0 if n == 0 else abs(aspect - side / n)), 1)
    return side, y


def usable_pdq(img: Image.Image) -> str | None:
    """The page's PDQ hash when it is good enough to match on, else None."""
    value, quality = pdq_hash(img)
    return value if quality >= PDQ_MIN_QUALITY else None
