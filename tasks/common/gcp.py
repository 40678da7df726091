"""What every GCP call shares: the retry policy, errors that say which API to enable or role to grant, and
the small result every ensure step returns.

Retries go through google-api-core (429 and 5xx, with backoff); a 403 becomes an InfraError naming the API to
enable or the role to grant, because retrying cannot fix either.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal, TypeVar

from google.api_core import exceptions as gexc
from google.api_core.retry import Retry, if_exception_type
from pydantic import BaseModel, Field

from blocks.target import GcpTarget
from tasks.common import clients
from tasks.common.permissions import explain_denied, explain_permission

T = TypeVar("T")

TRANSIENT = (
    gexc.TooManyRequests,
    gexc.InternalServerError,
    gexc.BadGateway,
    gexc.ServiceUnavailable,
    gexc.GatewayTimeout,
)
GCP_RETRY = Retry(predicate=if_exception_type(*TRANSIENT), initial=0.5, maximum=30.0, multiplier=2.0, timeout=300.0)
# A read-modify-write that lost a race (etag mismatch) starts over with a fresh read.
POLICY_CONFLICT_RETRY = Retry(
    predicate=if_exception_type(gexc.Conflict, gexc.Aborted, gexc.PreconditionFailed, *TRANSIENT),
    initial=0.2,
    maximum=5.0,
    multiplier=2.0,
    timeout=60.0,
)

# held: in use, retry later; kept: another service uses it, so a teardown left it
Action = Literal["created", "found", "updated", "deleted", "absent", "held", "kept"]


class InfraError(RuntimeError):
    """A GCP step that cannot succeed as configured; the message names the resource and the fix."""


class EnsureResult(BaseModel):
    """What an ensure (or teardown) step did to one resource."""

    kind: str = Field(description="bucket, artifact-registry, network, subnet, service-account, secret, iam ...")
    name: str = Field(description="Resource name or URI.")
    action: Action
    changes: list[str] = Field(default_factory=list, description="What was repaired or removed, if anything.")


SERVICES = {
    "storage": ("Cloud Storage", "storage.googleapis.com"),
    "run": ("Cloud Run Admin", "run.googleapis.com"),
    "compute": ("Compute Engine", "compute.googleapis.com"),
    "iam": ("Identity and Access Management", "iam.googleapis.com"),
    "secretmanager": ("Secret Manager", "secretmanager.googleapis.com"),
    "artifactregistry": ("Artifact Registry", "artifactregistry.googleapis.com"),
    "cloudbuild": ("Cloud Build", "cloudbuild.googleapis.com"),
    "logging": ("Cloud Logging", "logging.googleapis.com"),
    "monitoring": ("Cloud Monitoring", "monitoring.googleapis.com"),
    "serviceusage": ("Service Usage", "serviceusage.googleapis.com"),
    "cloudresourcemanager": ("Cloud Resource Manager", "cloudresourcemanager.googleapis.com"),
}
DISABLED_MARKERS = ("has not been used in project", "it is disabled", "SERVICE_DISABLED", "API has not been")


def explain_forbidden(
    exc: gexc.GoogleAPICallError, api: str, role: str, what: str, project: str, member: str | None = None
) -> InfraError:
    title, service = SERVICES[api]
    text = str(exc)
    if any(marker in text for marker in DISABLED_MARKERS):
        return InfraError(
            f"{what}: the {title} API is not enabled in project {project}; enable it with "
            f"`gcloud services enable {service} --project {project}` and run again"
        )
    # Google's message names the missing permission (each API in its own words): name it and the role to grant.
    named = explain_denied(text, project, member)
    permission = (getattr(exc, "metadata", None) or {}).get("permission")
    if named is None and permission:  # e.g. Cloud Build's "The caller does not have permission" + its ErrorInfo
        named = explain_permission(permission, project, member)
    if named is not None:
        return InfraError(f"{what}: permission denied in project {project}: {named}; then run again")
    return InfraError(
        f"{what}: permission denied in project {project}; grant the identity running this flow {role} "
        f"(or a role that includes it) and run again"
    )


@contextmanager
def gcp_errors(api: str, role: str, what: str, target: GcpTarget) -> Iterator[None]:
    """Turn a 403 into an InfraError that says which API to enable or which role to grant, and to whom when the
    target's credentials name the identity (a service-account key: a flow run in a Cloud Run job, say)."""
    try:
        yield
    except (gexc.Forbidden, gexc.PermissionDenied) as exc:
        raise explain_forbidden(exc, api, role, what, target.project, clients.principal(target)) from None


# Creating a build is not idempotent: retry only what was refused before anything was created (429).
CREATE_RETRY = Retry(predicate=if_exception_type(gexc.TooManyRequests), initial=1.0, maximum=30.0, timeout=300.0)


def wait_for(operation, polling, timeout: float | None = None):
    """A long-running operation's result; the polling GETs themselves are retried on 429 and 5xx too."""
    return operation.result(timeout=timeout, retry=GCP_RETRY, polling=polling)


def with_retry(fn: Callable[[], T], retry: Retry = GCP_RETRY) -> T:
    """Call ``fn`` under ``retry``: for client calls that do not take a ``retry=`` argument themselves."""
    return retry(fn)()
