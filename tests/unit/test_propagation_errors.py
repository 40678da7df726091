"""Which API answers mean "IAM has not propagated this service account yet" (tasks/infra/propagation.py)."""

from __future__ import annotations

import itertools

import pytest
from google.api_core import exceptions as gexc

from tasks.deploy.cloudrun import GPU_RELEASE_DEADLINE_S, REVISION_NAMES
from tasks.infra.propagation import (
    DEADLINE_S,
    is_not_visible_yet,
    names_bucket,
    note_grant,
    propagating_bucket_grant,
    redeploy_pauses,
    unreadable_on_new_grant,
)

EMAIL = "hf-cloudrun-build@acme-ml-prod.iam.gserviceaccount.com"


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (gexc.BadRequest(f"Service account {EMAIL} does not exist."), True),
        (
            gexc.Forbidden(
                f"Permission 'iam.serviceaccounts.actAs' denied on service account {EMAIL} (or it may not exist)."
            ),
            True,
        ),
        # Cloud Build names the account by its unique id (BusyaPrime/Operator-OS-Dev's CI log): a propagation wait.
        (
            gexc.Forbidden(
                "generic::permission_denied: caller does not have permission to act as service account "
                "projects/acme-ml-prod/serviceAccounts/112288884898868582499."
            ),
            True,
        ),
        # Cloud Build's create before the account's new grant on the source bucket is effective (pulumi-defang#115).
        (
            gexc.BadRequest(
                f"could not resolve source: googleapi: Error 403: {EMAIL} does not have storage.objects.get access "
                "to the Google Cloud Storage object. Permission 'storage.objects.get' denied on resource (or it may "
                "not exist)., forbidden"
            ),
            True,
        ),
        # The same words for another account, and a missing source object, are not this build's propagation.
        (
            gexc.BadRequest(
                "could not resolve source: googleapi: Error 403: 123-compute@developer.gserviceaccount.com does not "
                "have storage.objects.get access to the Google Cloud Storage object., forbidden"
            ),
            False,
        ),
        (gexc.BadRequest("could not resolve source: googleapi: Error 404: No such object: b/o, notFound"), False),
        # Its logs bucket check names no account: the build's own (google/trillian PR 2349).
        (
            gexc.BadRequest(
                'invalid bucket "acme-ml-prod-europe-west4-hf-builds"; builder service account does not have access '
                "to the bucket"
            ),
            True,
        ),
        # Another account in the policy, new too (two first promotions on one bucket): the same wait.
        (gexc.BadRequest("Service account other@acme-ml-prod.iam.gserviceaccount.com does not exist."), True),
        (gexc.BadRequest("Invalid argument: member user:nobody is not valid."), False),
        (gexc.Forbidden(f"Permission 'run.services.create' denied on resource '{EMAIL}'"), False),
        (gexc.NotFound(f"Service account {EMAIL} does not exist."), False),
    ],
)
def test_only_the_apis_words_for_an_unpropagated_account_are_waited_on(error, expected):
    note_grant(EMAIL)  # the grant-based refusals are waited on after this run's own grant only
    assert is_not_visible_yet(error, EMAIL) is expected


def test_a_grant_refusal_without_a_grant_of_this_run_is_not_waited_on():
    """The same 400 for a grant nobody made in this run: a missing grant, reported at once with its fix."""
    other = "never-granted@acme-ml-prod.iam.gserviceaccount.com"
    refusal = gexc.BadRequest(
        f"could not resolve source: googleapi: Error 403: {other} does not have storage.objects.get access to the "
        "Google Cloud Storage object., forbidden"
    )
    assert is_not_visible_yet(refusal, other) is False
    note_grant(other)
    assert is_not_visible_yet(refusal, other) is True


SECRET_DENIED = (
    "revision r-1 of s did not become ready: Revision 'r-1' is not ready and cannot serve traffic. Permission denied "
    "on secret: projects/p/secrets/hf-token/versions/latest for Revision service account {email}. The service "
    "account used must be granted the 'Secret Manager Secret Accessor' role (roles/secretmanager.secretAccessor) at "
    "the secret, project or higher level."
)
# gcsfuse v3's mount of the weights bucket, in the revision's log tail (GetStorageLayout: gcsfuse v3.11.2's words,
# which name the bucket but neither the account nor the permission).
MOUNT_DENIED = (
    "revision r-1 of s did not become ready: Revision 'r-1' is not ready and cannot serve traffic. The user-provided "
    "container failed the configured startup probe checks.\ncontainer log (last lines):\nError: "
    "mountWithStorageHandle: fs.NewServer: create file system: SetUpBucket: BucketHandle: storageLayout call failed: "
    'GetStorageLayout for "projects/_/buckets/acme-weights/storageLayout" failed: InvocationID: 0f2c, Attempt: 1, '
    "with error: rpc error: code = PermissionDenied desc = The caller does not have permission"
)


def test_a_revision_failing_on_a_secret_grant_of_this_run_is_deployed_again_and_no_other():
    email = "serving-secret@acme-ml-prod.iam.gserviceaccount.com"
    failure = SECRET_DENIED.format(email=email)
    assert unreadable_on_new_grant(failure, email) is None  # no grant of this run yet
    note_grant(email)
    assert unreadable_on_new_grant(failure, email) == "its secret"
    # Another account's refusal is not this revision's propagation, nor is any other failure.
    assert unreadable_on_new_grant(SECRET_DENIED.format(email="other@x.iam.gserviceaccount.com"), email) is None
    assert unreadable_on_new_grant(MOUNT_DENIED, email) is None


def test_a_mount_is_waited_on_for_this_runs_own_grant_of_the_bucket_whatever_gcsfuse_says():
    """The wait is keyed on what the run did (its grant of the mounted bucket, within the deadline), not on gcsfuse's
    words: v3's refusal names neither the account nor storage.objects.list."""
    email = "serving-mount@acme-ml-prod.iam.gserviceaccount.com"
    assert propagating_bucket_grant(email, ["acme-weights"]) is None  # no grant of this run yet
    note_grant(email)  # a grant elsewhere (its secret) is not one of the bucket
    assert propagating_bucket_grant(email, ["acme-weights"]) is None
    note_grant(email, "acme-weights")
    bucket, age = propagating_bucket_grant(email, ["other-bucket", "acme-weights"])
    assert bucket == "acme-weights" and 0 <= age < DEADLINE_S
    assert propagating_bucket_grant("other@x.iam.gserviceaccount.com", ["acme-weights"]) is None
    assert propagating_bucket_grant(email, ["other-bucket"]) is None  # a revision mounting another bucket
    assert names_bucket(MOUNT_DENIED, "acme-weights")
    assert not names_bucket(MOUNT_DENIED, "acme") and not names_bucket(MOUNT_DENIED, "acme-weights-2")
    assert not names_bucket("container log (last lines):\nOSError: no model here", "acme-weights")


def test_the_redeploys_of_a_propagating_grant_reach_the_deadline_before_the_revision_names_run_out():
    """Each redeploy takes a new revision name; with deploys taking no time at all, the pauses alone between the
    REVISION_NAMES deploys outlast the propagation deadline (above Google's "7 minutes or longer") and the wait for a
    stopped revision's GPU (a replace rollout)."""
    pauses = list(itertools.islice(redeploy_pauses(), REVISION_NAMES - 1))
    assert sum(pauses) >= max(DEADLINE_S, GPU_RELEASE_DEADLINE_S), pauses
    assert pauses[0] <= 1.0  # a quick propagation costs a second, not a minute
