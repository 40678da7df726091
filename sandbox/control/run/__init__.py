"""The Cloud Run Admin API v2 stand-in."""

from sandbox.control.run.api import CloudRun

__all__ = ["CloudRun"]
