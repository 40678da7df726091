"""The Compute Engine API v1 stand-in: VPC networks, subnetworks and their operations (see api.py)."""

from __future__ import annotations

from sandbox.control.compute.api import Compute

__all__ = ["Compute"]
