"""doctor's rows: what one check found and its fix, the grants the failed rows ask for, and how a read that failed
becomes a row (the API to enable, the role to grant) instead of an exception."""

from __future__ import annotations

import re
from typing import Literal

from google.api_core import exceptions as gexc
from pydantic import BaseModel, Field

from blocks.target import GcpTarget
from tasks.common import clients
from tasks.common.permissions import DEPLOYER_ROLES, DOCTOR_ROLES, PROJECT_ROLES, denied_permission, grant_command

Status = Literal["ok", "warn", "fail"]
ME = 'user:"$(gcloud config get-value account)"'  # the member a fix command grants to: whoever runs it
PROJECT_GET = "resourcemanager.projects.get"
BROWSER = "roles/browser"


class Check(BaseModel):
    """One doctor finding: what was checked, how it stands, and the command that fixes it."""

    name: str
    status: Status
    detail: str
    fix: str = Field("", description="The exact command (or setting) that fixes it; empty when nothing to fix.")
    roles: list[str] = Field(
        default_factory=list,
        description="Predefined roles the caller lacks on the project for this row: doctor prints one grant command "
        "per role, for all rows at once, instead of the row's own fix.",
    )
    summary: str = Field("", description="The row's one terminal line when the detail is too long for one.")

    @property
    def line(self) -> str:
        """What the terminal shows for the row (the artifact and DoctorFailed keep the whole detail)."""
        return self.summary or self.detail


# The order grants are printed in: seeing the project first (every other call is refused without it), then what
# doctor reads with (its next run then sees more), then the deployer's roles in docs/first-run.md's table order.
_GRANT_ORDER = [need.role for need in (*PROJECT_ROLES, *DOCTOR_ROLES, *DEPLOYER_ROLES)]


def roles_to_grant(checks: list[Check]) -> list[str]:
    """The roles the failed rows ask for, each once, in ``_GRANT_ORDER`` (roles it does not know last, by name)."""
    wanted = {role for c in checks if c.status == "fail" for role in c.roles}
    return sorted(wanted, key=lambda r: (_GRANT_ORDER.index(r) if r in _GRANT_ORDER else len(_GRANT_ORDER), r))


def other_fixes(checks: list[Check]) -> list[str]:
    """The fixes of failed and warned rows that are not project grants, each once, in row order."""
    return list(dict.fromkeys(c.fix for c in checks if c.status != "ok" and c.fix and not c.roles))


def grant_block(project: str, roles: list[str], member: str | None = None) -> list[str]:
    """Copyable shell lines that grant ``roles`` on the project: the member set once (the caller's principal when
    the credentials name it, else the gcloud account), then one ``add-iam-policy-binding`` per role."""
    head = f"MEMBER={member}" if member else f"MEMBER={ME}  # or serviceAccount:EMAIL, the account the flows run as"
    return [head, *(grant_command(project, role, '"$MEMBER"') for role in roles)]


class DoctorFailed(RuntimeError):
    """The project is not ready: the message lists each failed check, then the fixes (grants last)."""

    def __init__(self, checks: list[Check], fixes: list[str] | None = None) -> None:
        self.checks = [c for c in checks if c.status == "fail"]
        self.fixes = list(dict.fromkeys(fixes if fixes is not None else [c.fix for c in self.checks if c.fix]))
        # The first line is what a promotion report shows as its reason; the fixes follow, one a line.
        summary = "doctor: project not ready: " + " | ".join(f"{c.name}: {c.detail}" for c in self.checks)
        super().__init__("\n".join([summary, *self.fixes]))

    def __reduce__(self) -> tuple[type[DoctorFailed], tuple[list[Check], list[str]]]:
        # A Prefect result store pickles it with the run's Failed state: rebuilt from its rows, not its message.
        return (type(self), (self.checks, self.fixes))


TEST_PERMISSIONS_BATCH = 100  # testIamPermissions takes at most 100 permissions per call


def enable_command(services: list[str], project: str) -> str:
    return f"gcloud services enable {' '.join(services)} --project {project}"


def disabled_service(exc: Exception) -> str | None:
    """The service a 403 SERVICE_DISABLED names (ErrorInfo metadata), else None."""
    if isinstance(exc, gexc.GoogleAPICallError) and exc.reason == "SERVICE_DISABLED":
        return (exc.metadata or {}).get("service")
    return None


def json_error(response) -> tuple[str, str | None]:
    """(message, disabled service) of an error answered to an AuthorizedSession call."""
    try:
        error = response.json().get("error", {})
    except ValueError:
        return response.text[:300], None
    for detail in error.get("details", []):
        if detail.get("reason") == "SERVICE_DISABLED":
            return error.get("message", ""), detail.get("metadata", {}).get("service")
    return error.get("message", response.text[:300]), None


# The REST transport prefixes Google's message with the request ("GET https://...?names=projects%2F...: "), and
# Storage and Service Usage add a second sentence that repeats the first: neither helps the reader.
_REQUEST_LINE = re.compile(r"^(?:\d{3} )?(?:GET|POST|PUT|PATCH|DELETE) \S+: ")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s")
MAX_GOOGLE_TEXT = 160


def google_text(error: Exception | str) -> str:
    """Google's error message as a reader needs it: without the request line, its first sentence, at most
    ``MAX_GOOGLE_TEXT`` characters."""
    text = error.message if isinstance(error, gexc.GoogleAPICallError) else str(error)
    text = _REQUEST_LINE.sub("", " ".join(str(text).split()))
    first = _SENTENCE_END.split(text, maxsplit=1)[0]
    return first if len(first) <= MAX_GOOGLE_TEXT else first[: MAX_GOOGLE_TEXT - 1] + "…"


def unreadable(name: str, target: GcpTarget, exc: Exception, role: str) -> Check:
    """A check whose read failed: a disabled API names the enable command, a 403 the role that allows the read."""
    service = disabled_service(exc)
    if service:
        return Check(name=name, status="fail", detail=f"{service} is not enabled, so this could not be checked.",
                     fix=enable_command([service], target.project))  # fmt: skip
    if isinstance(exc, gexc.Forbidden | gexc.PermissionDenied):
        return read_denied(name, target, exc.message, role)
    return Check(name=name, status="warn", detail=f"could not be checked: {google_text(exc)}")


def read_denied(name: str, target: GcpTarget, message: str, role: str) -> Check:
    """A read doctor was refused (403): the permission Google's message names and the role that holds it; Google's
    own words only when they name no permission."""
    permission = denied_permission(message)
    said = f"missing permission {permission}" if permission else f"Google: {google_text(message)}"
    detail = f"cannot read: {said}; grant {role}"
    return Check(name=name, status="fail", detail=detail, fix=grant_command(target.project, role, ME), roles=[role])


def granted(target: GcpTarget, permissions: list[str]) -> set[str]:
    projects = clients.projects(target)
    granted: set[str] = set()
    for start in range(0, len(permissions), TEST_PERMISSIONS_BATCH):
        batch = permissions[start : start + TEST_PERMISSIONS_BATCH]
        answer = projects.test_iam_permissions(request={"resource": f"projects/{target.project}", "permissions": batch})
        granted |= set(answer.permissions)
    return granted


def holds(target: GcpTarget, permission: str) -> bool:
    """Whether the caller holds ``permission`` on the project; False when even that cannot be asked."""
    try:
        return permission in granted(target, [permission])
    except gexc.GoogleAPICallError:
        return False


def by_caller_permission(
    name: str, target: GcpTarget, permission: str, ok: str, fail: str, fix: str, roles: list[str] | None = None
) -> Check:
    """The row that depends on whether the caller holds ``permission`` on the project (or says it could not be
    read). ``roles``: what the failed row asks the caller to be granted (none when the fix grants someone else)."""
    try:
        held = permission in granted(target, [permission])
    except gexc.GoogleAPICallError as exc:
        return unreadable(name, target, exc, BROWSER)  # the project itself is out of sight
    if held:
        return Check(name=name, status="ok", detail=ok)
    return Check(name=name, status="fail", detail=fail, fix=fix, roles=roles or [])
