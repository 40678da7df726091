"""The Artifact Registry API v1 stand-in: repositories, IAM policies, Docker images and tags."""

from sandbox.control.artifactregistry.api import ArtifactRegistry

__all__ = ["ArtifactRegistry"]
