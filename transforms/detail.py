"""Detail: the resolution a page is sent to the model at. One function, used by the safety gate
(which checks the page as the model will see it) and by the extraction stage (which sends it)."""
from __future__ import annotations

from PIL import Image


def low_detail_size(width: int, height: int, side: int) -> tuple[int, int]:
    """The page scaled so its longest side is at most `side` (never enlarged)."""
    if side <= 0 or max(width, height) <= side:
        return width, height
    scale = side / max(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


def resize_for_detail(img: Image.Image, side: int) -> Image.Image:
    size = low_detail_size(img.width, img.height, side)
    if size == img.size:
        return img
    return img.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)
