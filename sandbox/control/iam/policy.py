"""IAM policies on resources (``google.iam.v1.Policy``) as every Google API keeps them.

Service accounts and secrets (and other stand-ins that want it) hold one ``ResourcePolicy`` each. The JSON
is what the REST front ends send: ``{"version": 1, "etag": "ACAB"}`` for an empty policy, with no
``bindings`` key at all until something is bound (product code that reads ``policy["bindings"]`` must cope
with that on GCP too). ``setIamPolicy`` is a read-modify-write: a stale etag is 409 ABORTED.
"""

from __future__ import annotations

import base64
import copy
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from sandbox.control.errors import GoogleApiError, invalid_argument

# The etag of a policy nobody has set yet: base64 of 0x000001, what GCP sends for an empty policy.
EMPTY_POLICY_ETAG = "ACAB"
PUBLIC_MEMBERS = {"allUsers", "allAuthenticatedUsers"}
MEMBER_PREFIXES = (
    "user:",
    "serviceAccount:",
    "group:",
    "domain:",
    "principal:",
    "principalSet:",
    "deleted:",
    "projectOwner:",
    "projectEditor:",
    "projectViewer:",
)
ROLE = re.compile(r"^(roles/[A-Za-z0-9_.]+|(projects|organizations)/[^/]+/roles/[A-Za-z0-9_.]+)$")
CONCURRENT_CHANGE = (
    "There were concurrent policy changes. Please retry the whole read-modify-write with exponential backoff."
)

# Called with a service account email; raises GoogleApiError when the policy must not name it.
MemberCheck = Callable[[str], None]


def new_etag() -> str:
    """A fresh policy etag (``bytes`` in the proto, so base64 in JSON)."""
    return base64.b64encode(secrets.token_bytes(8)).decode()


@dataclass
class ResourcePolicy:
    """One resource's IAM policy."""

    version: int = 1
    etag: str = EMPTY_POLICY_ETAG
    bindings: list[dict] = field(default_factory=list)
    audit_configs: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        body: dict = {"version": self.version, "etag": self.etag}
        if self.bindings:
            body["bindings"] = copy.deepcopy(self.bindings)
        if self.audit_configs:
            body["auditConfigs"] = copy.deepcopy(self.audit_configs)
        return body

    def members_of(self, role: str) -> set[str]:
        """Members bound to ``role`` without a condition (a conditional grant is not a plain grant)."""
        found: set[str] = set()
        for binding in self.bindings:
            if binding.get("role") == role and not binding.get("condition"):
                found.update(binding.get("members", []))
        return found

    def set_from_request(self, body: dict, check_service_account: MemberCheck | None = None) -> dict:
        """Apply a ``SetIamPolicyRequest`` body (``{"policy": {...}, "updateMask": "..."}``); returns the JSON."""
        policy = body.get("policy")
        if not isinstance(policy, dict):
            raise invalid_argument("Request contains an invalid argument: policy is required.")
        if policy.get("etag") and policy["etag"] != self.etag:
            raise GoogleApiError(409, CONCURRENT_CHANGE, "ABORTED")
        version = int(policy.get("version") or 1)
        if version not in (0, 1, 3):
            raise invalid_argument(f"Invalid policy version {version}: use 1 or 3.")
        bindings = [_binding(b, check_service_account) for b in policy.get("bindings", []) or []]
        if any("condition" in b for b in bindings) and version < 3:
            raise invalid_argument("Policies with conditional role bindings must use version 3.")
        self.bindings = [b for b in bindings if b["members"]]  # GCP drops bindings left without members
        self.version = 1 if version == 0 else version
        mask = [p for p in str(body.get("updateMask", "")).split(",") if p]
        if "auditConfigs" in mask or "audit_configs" in mask:
            self.audit_configs = copy.deepcopy(policy.get("auditConfigs", []))
        self.etag = new_etag()
        return self.to_json()


def _binding(binding: dict, check_service_account: MemberCheck | None) -> dict:
    if not isinstance(binding, dict):
        raise invalid_argument("Request contains an invalid argument: each binding must be an object.")
    role = binding.get("role", "")
    if not ROLE.match(role):
        raise invalid_argument(f"Role ({role}) does not exist in the resource's hierarchy.")
    members: list[str] = []
    for member in binding.get("members", []) or []:
        if member not in PUBLIC_MEMBERS and not member.startswith(MEMBER_PREFIXES):
            raise invalid_argument(
                f"Invalid principal '{member}': use a prefix such as user:, serviceAccount:, group:."
            )
        if member.startswith("serviceAccount:") and check_service_account is not None:
            check_service_account(member.removeprefix("serviceAccount:"))
        if member not in members:
            members.append(member)
    result: dict = {"role": role, "members": members}
    if binding.get("condition"):
        result["condition"] = copy.deepcopy(binding["condition"])
    return result
