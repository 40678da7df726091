"""Which API answers mean "IAM has not propagated this service account yet" (tasks/infra/propagation.py)."""

from __future__ import annotations

import itertools

import pytest
from google.api_core import exceptions as gexc

from tasks.deploy.cloudrun import GPU_RELEASE_DEADLINE_S, REVISION_NAMES
from tasks.infra.propagation import DEADLINE_S, is_not_visible_yet, note_grant, redeploy_pauses, unreadable_on_new_grant

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
# gcsfuse's mount of the weights bucket, in the revision's log tail (SetUpBucket lists the bucket).
MOUNT_DENIED = (
    "revision r-1 of s did not become ready: Revision 'r-1' is not ready and cannot serve traffic. The user-provided "
    "container failed the configured startup probe checks.\ncontainer log (last lines):\nmountWithArgs: "
    "mountWithStorageHandle: fs.NewServer: create file system: SetUpBucket: Error in iterating through objects: "
    "googleapi: Error 403: {email} does not have storage.objects.list access to the Google Cloud Storage bucket. "
    "Permission 'storage.objects.list' denied on resource (or it may not exist)., forbidden"
)


@pytest.mark.parametrize(
    ("failure", "unreadable"),
    [(SECRET_DENIED, "its secret"), (MOUNT_DENIED, "the weights bucket"),
     ("revision r-1 of s did not become ready: ...\ncontainer log (last lines):\nOSError: no model here", None)],
)  # fmt: skip
def test_a_revision_failing_on_a_grant_of_this_run_is_deployed_again_and_no_other(failure, unreadable):
    email = f"serving-{len(failure)}@acme-ml-prod.iam.gserviceaccount.com"
    assert unreadable_on_new_grant(failure.format(email=email), email) is None  # no grant of this run yet
    note_grant(email)
    assert unreadable_on_new_grant(failure.format(email=email), email) == unreadable
    # Another account's refusal is not this revision's propagation.
    assert unreadable_on_new_grant(failure.format(email="other@x.iam.gserviceaccount.com"), email) is None


def test_the_redeploys_of_a_propagating_grant_reach_the_deadline_before_the_revision_names_run_out():
    """Each redeploy takes a new revision name; with deploys taking no time at all, the pauses alone between the
    REVISION_NAMES deploys outlast the propagation deadline (above Google's "7 minutes or longer") and the wait for a
    stopped revision's GPU (a replace rollout)."""
    pauses = list(itertools.islice(redeploy_pauses(), REVISION_NAMES - 1))
    assert sum(pauses) >= max(DEADLINE_S, GPU_RELEASE_DEADLINE_S), pauses
    assert pauses[0] <= 1.0  # a quick propagation costs a second, not a minute
