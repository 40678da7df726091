"""The Organization Policy API v2 stand-in: effective policies on the sandbox project."""

from sandbox.control.orgpolicy.api import OrgPolicy

__all__ = ["OrgPolicy"]
