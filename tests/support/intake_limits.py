"""The intake limits of the intake tests: LIMITS.
Moved from tests/transforms/intake/test_accept.py, which other test files imported."""
from __future__ import annotations

from transforms.intake.inspection import IntakeLimits

LIMITS = IntakeLimits(max_bytes=50 * 2**20, max_pages=5000, max_image_pixels=89_478_485)
