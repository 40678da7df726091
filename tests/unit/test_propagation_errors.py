"""Which API answers mean "IAM has not propagated this service account yet" (tasks/propagation.py)."""

from __future__ import annotations

import pytest
from google.api_core import exceptions as gexc

from tasks.propagation import is_not_visible_yet

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
        # Cloud Build names the account by its unique id (kohei321dev/spot-diggz issue 164): still a propagation wait.
        (gexc.Forbidden("caller does not have permission to act as service account 109095503163182759798"), True),
        (gexc.BadRequest("Service account other@acme-ml-prod.iam.gserviceaccount.com does not exist."), False),
        (gexc.Forbidden(f"Permission 'run.services.create' denied on resource '{EMAIL}'"), False),
        (gexc.NotFound(f"Service account {EMAIL} does not exist."), False),
    ],
)
def test_only_the_apis_words_for_an_unpropagated_account_are_waited_on(error, expected):
    assert is_not_visible_yet(error, EMAIL) is expected
