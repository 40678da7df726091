"""The screenshots the real-browser check (tests/browser) took: its ``shots`` fixture adds each one, and the folder's
conftest prints them at the end of the run."""

from __future__ import annotations

SCREENSHOTS: list[str] = []
