"""Bounded, logged waits for IAM to propagate a new service account to the APIs that name it.

Service accounts are eventually consistent: for a minute or so after its creation (Google's IAM docs,
"Access change propagation": typically 2 minutes, up to 7), other APIs do not know the account. A bucket,
secret, repository or service policy naming it answers 400 "Service account X does not exist."
(GoogleCloudPlatform/data-migration-tool issue 58), and a Cloud Run deploy running as it answers 403
"Permission 'iam.serviceaccounts.actAs' denied on service account X (or it may not exist)."
(terraform-provider-google issue 16350: the first apply fails, the second succeeds); a build run as it answers 403
"caller does not have permission to act as service account X" (GoogleCloudPlatform/cloud-run-mcp PR 91: createBuild
PERMISSION_DENIED in a new project until IAM caught up). Terraform sleeps a fixed
10 s after creating one (magic-modules PR 10813) and still sees these errors; here the step that names the
account retries exactly that error, with exponential backoff and a deadline, and says why it waits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from google.api_core import exceptions as gexc
from google.api_core.retry import Retry

from tasks.gcp import InfraError
from tasks.logs import run_logger

T = TypeVar("T")

# Real-world timings: the first retry within a second, then doubling up to 10 s between tries, for up to two
# minutes in all (most accounts propagate within one). A sandbox window (0.6 s at its default clock) needs one
# or two tries.
INITIAL_S = 1.0
MULTIPLIER = 2.0
MAXIMUM_S = 10.0
DEADLINE_S = 120.0


def is_not_visible_yet(exc: BaseException, email: str) -> bool:
    """Whether ``exc`` is an API's answer for a service account IAM has not propagated to it yet."""
    message = getattr(exc, "message", None) or str(exc)
    if isinstance(exc, gexc.Forbidden) and "permission to act as service account" in message:
        # Cloud Build's words; it may name the account by its numeric unique id rather than its email
        # (kohei321dev/spot-diggz issue 164), so the email is not required here.
        return True
    if email not in message:
        return False
    if isinstance(exc, gexc.BadRequest):  # setIamPolicy on buckets, secrets, repositories, services, projects
        return f"Service account {email} does not exist" in message
    if isinstance(exc, gexc.Forbidden):  # deploys and builds: their actAs check cannot see the account either
        return "iam.serviceaccounts.actAs" in message and "may not exist" in message  # Cloud Run's words
    return False


def propagation_retry(email: str, seen_by: str, deadline_s: float = DEADLINE_S) -> Retry:
    """A Retry for calls that name ``email`` and fail only until IAM has propagated it to ``seen_by``."""
    log = run_logger()
    delay = {"next": INITIAL_S}

    def on_error(_exc: Exception) -> None:
        # google-api-core sleeps a random share of the current bound (full jitter): log the bound.
        log.info(
            "service account %s is not visible to %s yet (IAM propagation); retrying in up to %.0f s",
            email,
            seen_by,
            delay["next"],
        )
        delay["next"] = min(delay["next"] * MULTIPLIER, MAXIMUM_S)

    return Retry(
        predicate=lambda exc: is_not_visible_yet(exc, email),
        initial=INITIAL_S,
        multiplier=MULTIPLIER,
        maximum=MAXIMUM_S,
        timeout=deadline_s,
        on_error=on_error,
    )


def when_visible(call: Callable[[], T], email: str, seen_by: str, deadline_s: float = DEADLINE_S) -> T:
    """``call()``, retried while ``seen_by`` cannot see ``email`` yet; an InfraError after ``deadline_s``."""
    try:
        return propagation_retry(email, seen_by, deadline_s)(call)()
    except gexc.RetryError as exc:
        raise InfraError(
            f"service account {email} is still not visible to {seen_by} after {deadline_s:.0f} s: IAM has not "
            f"propagated it yet (run again in a few minutes), or, for a deploy or a build, the identity running this "
            f"flow lacks iam.serviceAccounts.actAs on it (grant roles/iam.serviceAccountUser on {email}); last "
            f"error: {exc.cause}"
        ) from None
