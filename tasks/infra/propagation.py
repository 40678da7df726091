"""Bounded, logged waits for IAM to propagate a new service account, or a new grant to one, to the APIs that use it.

IAM is eventually consistent: a new account, and a role newly granted, take effect "typically 2 minutes,
potentially 7 minutes or longer" later (Google's IAM docs, "Access change propagation", for policy changes).
Until then:

- a bucket, secret, repository or service policy naming a new account answers 400 "Service account X does not
  exist." (GoogleCloudPlatform/data-migration-tool issue 58);
- a Cloud Run deploy running as it answers 403 "Permission 'iam.serviceaccounts.actAs' denied on service account X
  (or it may not exist)." (terraform-provider-google issue 16350: the first apply fails, the second succeeds);
- a build run as it answers 403 PERMISSION_DENIED "generic::permission_denied: caller does not have permission to
  act as service account projects/P/serviceAccounts/UNIQUE_ID." (BusyaPrime/Operator-OS-Dev's CI log; kohei321dev/
  spot-diggz issue 164; GoogleCloudPlatform/cloud-run-mcp PR 91: createBuild PERMISSION_DENIED in a new project
  until IAM caught up): it names the account by its numeric unique id, not its email;
- a build whose account was just granted read access to the source bucket answers 400 INVALID_ARGUMENT "could not
  resolve source: googleapi: Error 403: X does not have storage.objects.get access to the Google Cloud Storage
  object. Permission 'storage.objects.get' denied on resource (or it may not exist)., forbidden"
  (DefangLabs/pulumi-defang issue 115 and doughayden/answer-app's README: a propagation race; a rerun passes);
  its logs bucket is checked at create too: 400 'invalid bucket "B"; builder service account does not have access
  to the bucket' (google/trillian PR 2349), which names no account: only the build's own account applies;
- a revision whose account was just granted its secret fails to start: "Permission denied on secret: S for Revision
  service account X. The service account used must be granted the 'Secret Manager Secret Accessor' role ..."
  (GoogleCloudPlatform/terraform-docs-samples PR 168's words; a propagation delay behind them in a write-up of the
  same error); one just granted the weights bucket cannot mount its Cloud Storage volume, and the instance never
  starts. Its words are not relied on: gcsfuse changed them in v3 (pre-v3 listed the bucket, "... does not have
  storage.objects.list access ..."; v3 asks for the bucket's storage layout and its error names the bucket,
  "storageLayout call failed: GetStorageLayout for "projects/_/buckets/B/storageLayout" failed: ...", without the
  account or the permission: gcsfuse v3.11.2 internal/storage/storage_handle.go). What the product knows decides:
  this run granted the account a role on a bucket the revision mounts (``note_grant``), that grant is within its
  propagation deadline, and the failure names that bucket (Cloud Run's log of the mount, however worded). Either
  way the deploy is made again (a new revision) until the grant has taken effect. Unconfirmed: that Cloud Run puts
  gcsfuse's error in the revision's log in time for the failure's log tail; without it the deploy fails at once,
  saying that a grant of this run may still be propagating, and a rerun passes;
- a build whose account was just granted roles/artifactregistry.writer on the image's repository runs, then fails
  at its push: docker push's 'denied: Permission "artifactregistry.repositories.uploadArtifacts" denied on resource
  "projects/P/locations/L/repositories/R" (or it may not exist)' (GoogleCloudPlatform/cymbal-superstore PR 4's
  words; newer pushes say "... denied on resource (or it may not exist). Remediate access with this Troubleshooter
  URL ...", without the repository: flutter/flutter issue 188342; doughayden/answer-app's README: "a race condition
  where the Cloud Build service account IAM role bindings have not yet propagated"). Here too what the product knows
  decides: this run granted the account that role on the repository it pushes to (``note_resource_grant``), within its
  deadline, and the build's log names the permission; the build is run again (tasks/image/builds.py). A build
  longer than the propagation never meets it.

Terraform sleeps a fixed 10 s after creating an account (magic-modules PR 10813) and still sees these errors;
here the step retries exactly those answers, with exponential backoff, a deadline above the documented worst case,
and a log line for each wait.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from google.api_core import exceptions as gexc
from google.api_core.retry import Retry

from tasks.common.gcp import InfraError
from tasks.common.logs import run_logger

T = TypeVar("T")

# Real-world timings: the first retry within a second, then doubling up to 15 s between tries, for up to ten
# minutes in all: above the "7 minutes or longer" Google gives as the worst case. A sandbox window (0.6 s at its
# default clock) needs one or two tries.
INITIAL_S = 1.0
MULTIPLIER = 2.0
MAXIMUM_S = 15.0
DEADLINE_S = 600.0
# A revision that failed on a grant is deployed again under a new name (Cloud Run refuses to delete a service's
# latest revision, and a failed one keeps its name): pauses grow to a minute, so that the deadline comes before the
# service's revision names for one promotion run out (tasks/cloudrun.REVISION_NAMES).
REDEPLOY_MAXIMUM_S = 60.0


def redeploy_pauses() -> Iterator[float]:
    """The pauses between deploys of a revision that waits for its account's new grant: 1 s, doubling to a minute."""
    pause = INITIAL_S
    while True:
        yield pause
        pause = min(pause * MULTIPLIER, REDEPLOY_MAXIMUM_S)


OTHER_NEW_ACCOUNT = re.compile(r"Service account [\w.+-]+@[\w.-]+\.gserviceaccount\.com does not exist")
# Grants this process made, by account email: a 400 that a missing grant would also explain is waited on only
# while a grant of this run may still be propagating (the same refusal for a grant nobody made fails at once).
_granted: dict[str, float] = {}
# ... and which resources they were on, by (account email, bucket name or resource path): a revision mounting the
# bucket may not start meanwhile, a build may not push to the repository.
_resource_grants: dict[tuple[str, str], float] = {}
_granted_lock = threading.Lock()


def note_grant(email: str, bucket: str | None = None) -> None:
    """Record that this run just granted ``email`` a role (on ``bucket``, for a bucket's policy): its refusals
    meanwhile are IAM propagation."""
    with _granted_lock:
        _granted[email] = time.monotonic()
    if bucket is not None:
        note_resource_grant(email, bucket)


def note_resource_grant(email: str, resource: str) -> None:
    """Record that this run just granted ``email`` a role on ``resource`` (a bucket's name, a repository's path) and
    nothing else: only failures on that resource are its propagation (a role on the image repository explains no
    bucket's refusal)."""
    with _granted_lock:
        _resource_grants[(email, resource)] = time.monotonic()


def _granted_recently(email: str) -> bool:
    with _granted_lock:
        at = _granted.get(email)
    return at is not None and time.monotonic() - at < DEADLINE_S


def is_not_visible_yet(exc: BaseException, email: str) -> bool:
    """Whether ``exc`` is an API's answer for a service account, or a grant to it, IAM has not propagated yet."""
    message = getattr(exc, "message", None) or str(exc)
    if isinstance(exc, gexc.Forbidden) and "caller does not have permission to act as service account" in message:
        # Cloud Build's words; they name the account by its numeric unique id, so the email is not required here.
        return True
    if isinstance(exc, gexc.BadRequest) and "builder service account does not have access to the bucket" in message:
        return _granted_recently(email)  # Cloud Build's logs bucket check, before this run's grant is effective
    if isinstance(exc, gexc.BadRequest) and OTHER_NEW_ACCOUNT.search(message):
        # Another new account the policy names is not visible yet either (two first promotions sharing a bucket,
        # each creating its account): the same wait. A deleted account is written "deleted:serviceAccount:...".
        return True
    if email not in message:
        return False
    if isinstance(exc, gexc.BadRequest):  # setIamPolicy on buckets, secrets, repositories, services, projects
        if "could not resolve source" in message:  # Cloud Build: the account's new grant on the source bucket
            return f"{email} does not have storage.objects.get access" in message and _granted_recently(email)
        return f"Service account {email} does not exist" in message
    if isinstance(exc, gexc.Forbidden):  # deploys and builds: their actAs check cannot see the account either
        return "iam.serviceaccounts.actAs" in message and "may not exist" in message  # Cloud Run's words
    return False


def unreadable_on_new_grant(message: str, email: str) -> str | None:
    """What a revision of ``email`` could not read only because this run's grant to it has not propagated yet (its
    secret), from its failure; None for any other failure. Cloud Run's words for a secret (module docstring)."""
    if not _granted_recently(email):
        return None
    if "Permission denied on secret" in message and f"for Revision service account {email}" in message:
        return "its secret"
    return None


def propagating_grant(email: str, resources: list[str]) -> tuple[str, float] | None:
    """The resource of ``resources`` (as it was noted) this run granted ``email`` a role on most recently,
    with the seconds since, while that grant may still be propagating (``DEADLINE_S``); else None."""
    now = time.monotonic()
    with _granted_lock:
        ages = [(now - at, name) for name in resources if (at := _resource_grants.get((email, name))) is not None]
    recent = [(age, name) for age, name in ages if age < DEADLINE_S]
    if not recent:
        return None
    age, name = min(recent)
    return name, age


def propagating_bucket_grant(email: str, buckets: list[str]) -> tuple[str, float] | None:
    """``propagating_grant`` for the buckets of a revision's Cloud Storage volumes."""
    return propagating_grant(email, buckets)


def names_bucket(message: str, bucket: str) -> bool:
    """Whether ``message`` names ``bucket`` as a whole name (``projects/_/buckets/B/...``, ``gs://B``), not as a
    part of a longer one."""
    return re.search(rf"(?<![\w.-]){re.escape(bucket)}(?![\w.-])", message) is not None


def propagation_retry(email: str, seen_by: str, deadline_s: float = DEADLINE_S) -> Retry:
    """A Retry for calls that name ``email`` and fail only until IAM has propagated it to ``seen_by``."""
    log = run_logger()
    delay = {"next": INITIAL_S}

    def on_error(_exc: Exception) -> None:
        # google-api-core sleeps a random share of the current bound (full jitter): log the bound.
        log.info(
            "service account %s, or its new grant, is not visible to %s yet (IAM propagation, typically 2 minutes, up "
            "to 7 or more); retrying in up to %.0f s",
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
            f"service account {email}, or its new grant, is still not visible to {seen_by} after {deadline_s:.0f} s: "
            f"IAM has not propagated it yet (run again in a few minutes), or, for a deploy or a build, the identity "
            f"running this flow lacks iam.serviceAccounts.actAs on it (grant roles/iam.serviceAccountUser on "
            f"{email}); last error: {exc.cause}"
        ) from None
