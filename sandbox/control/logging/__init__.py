"""The Cloud Logging API v2 stand-in: ``entries.list`` over the Cloud Run stand-in's revision logs."""

from sandbox.control.logging.api import Logging

__all__ = ["Logging"]
