"""The Cloud Resource Manager API v3 stand-in: the sandbox project and its IAM policy."""

from sandbox.control.resourcemanager.api import ResourceManager

__all__ = ["ResourceManager"]
