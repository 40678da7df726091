"""Fail early when the identity running the pipeline may not act as a service account the pipeline runs things as.

Deploying a Cloud Run revision that runs as a service account, or a build that runs as one, needs
``iam.serviceAccounts.actAs`` on it (Cloud Run docs, "Service identity: deployer permissions"; Cloud Build docs,
"Configure user-specified service accounts"). Cloud Run's own answer, "Permission 'iam.serviceaccounts.actAs'
denied on service account X (or it may not exist).", is also what it says while a new account has not propagated
(tasks/infra/propagation.py waits on that), so a missing grant would only surface after that wait. IAM's
``serviceAccounts.testIamPermissions`` (no permission needed to call it) tells the two apart at once, before any
weights are staged.
"""

from __future__ import annotations

from google.api_core import exceptions as gexc
from prefect import task

from blocks.target import GcpTarget
from tasks.common.gcp import InfraError
from tasks.common.permissions import ACT_AS, PRINCIPAL, grant_command
from tasks.infra.ensure import iam_call

SERVICE_ACCOUNT_USER = "roles/iam.serviceAccountUser"


def lacks_act_as(target: GcpTarget, email: str) -> bool:
    """True when IAM says the caller does not hold actAs on ``email``; False when it does or cannot say yet (an
    account IAM itself does not show yet: the deploy's propagation wait handles that)."""
    path = f"projects/{target.project}/serviceAccounts/{email}:testIamPermissions"
    try:
        answer = iam_call(target, "POST", path, {"permissions": [ACT_AS]})
    except (gexc.NotFound, gexc.Forbidden):
        return False
    return ACT_AS not in answer.get("permissions", [])


def require_act_as(target: GcpTarget, email: str, why: str) -> None:
    """Raise InfraError naming the permission and the role to grant when the caller may not act as ``email``."""
    if not lacks_act_as(target, email):
        return
    raise InfraError(
        f"{why}: missing permission {ACT_AS} on service account {email}; grant {SERVICE_ACCOUNT_USER}: "
        f"`{grant_command(target.project, SERVICE_ACCOUNT_USER)}` (or on that account only: `gcloud iam "
        f"service-accounts add-iam-policy-binding {email} --project={target.project} --member={PRINCIPAL} "
        f"--role={SERVICE_ACCOUNT_USER}`; {PRINCIPAL}: the identity running this flow, e.g. user:you@example.com)"
    )


# One task run per account in the promotion's run graph, named after the account checked.
iam_check_act_as = task(name="iam_check_act_as", task_run_name="iam_check_act_as {email}")(require_act_as)
