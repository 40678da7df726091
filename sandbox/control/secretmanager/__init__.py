"""The Secret Manager API v1 stand-in."""

from sandbox.control.secretmanager.api import SecretManager

__all__ = ["SecretManager"]
