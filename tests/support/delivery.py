"""Run settings shared by the tests of other steps than progressive delivery."""

from __future__ import annotations

# The post-promotion watch off: tests of staging, images, roles... judge other steps, and a watch without traffic
# lasts its whole window plus the metrics delay (tests/e2e/test_progressive_delivery.py covers the watch).
NO_WATCH = {"samples": 0}
