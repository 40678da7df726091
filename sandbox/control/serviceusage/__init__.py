"""The Service Usage API stand-in (enabled services, Cloud Run GPU quotas) and the gate that makes a disabled
API refuse every call."""

from sandbox.control.serviceusage.api import ServiceUsage
from sandbox.control.serviceusage.gate import ServiceGate, service_disabled_body

__all__ = ["ServiceGate", "ServiceUsage", "service_disabled_body"]
