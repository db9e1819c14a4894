"""Pictures whose PDQ moves between details, and their hashes: stripes.
Moved from tests/transforms/output/test_cache_reuse.py, which other test files imported."""
from __future__ import annotations

import random

from PIL import Image, ImageDraw


def stripes(seed: int, size: tuple[int, int] = (1000, 750)) -> Image.Image:
    """Fine slanted lines: a picture whose PDQ moves a few bits between full and low detail."""
    rng = random.Random(seed)
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    for x in range(0, size[0], rng.choice([3, 5, 7])):
        draw.line([(x, 0), (x + rng.randrange(-300, 300), size[1])], fill=(0, 0, 0), width=1)
    return img


def entry_between(full: str, low: str, to_low: int = 28) -> str:
    """A PDQ entry `to_low` bits from the low-detail hash and 32 (33 when the two hashes differ in an odd number
    of bits) from the full page's: moved a bits of their difference toward the full hash and the rest elsewhere,
    so d(entry, low) = to_low and d(entry, full) = D - 2a + to_low."""
    diff = int(full, 16) ^ int(low, 16)
    differ = [i for i in range(256) if diff >> i & 1]
    same = [i for i in range(256) if not diff >> i & 1]
    a = (len(differ) - 4) // 2
    assert 0 <= a <= to_low, len(differ)
    entry = int(low, 16)
    for bit in differ[:a] + same[:to_low - a]:
        entry ^= 1 << bit
    assert hamming(entry, int(low, 16)) == to_low and hamming(entry, int(full, 16)) in (32, 33)
    return f"{entry:064x}"


def hamming(a: int, b: int) -> int:
    return bin(a ^ b).count("1")
