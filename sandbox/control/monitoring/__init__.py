"""Cloud Monitoring API v3 stand-in: Cloud Run revision metrics from the requests the sandbox really served."""

from sandbox.control.monitoring.api import Monitoring

__all__ = ["Monitoring"]
