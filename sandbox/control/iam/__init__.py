"""The IAM API v1 stand-in: service accounts and the IAM policies on them."""

from sandbox.control.iam.api import DEFAULT_PROJECT_NUMBER, Iam, project_number
from sandbox.control.iam.policy import ResourcePolicy

__all__ = ["DEFAULT_PROJECT_NUMBER", "Iam", "ResourcePolicy", "project_number"]
