"""The Cloud Build API v1 stand-in: builds whose docker steps fail as they do in the field (seed 000)."""

from sandbox.control.cloudbuild.api import CloudBuild

__all__ = ["CloudBuild"]
