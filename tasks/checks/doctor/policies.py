"""doctor's checks of organisation policies (Org Policy v2 effective policies) that would refuse what promote-model
creates: resource locations, Cloud Run ingress and VPC egress, domain-restricted sharing."""

from __future__ import annotations

from collections.abc import Callable

from google.api_core import exceptions as gexc

from blocks.target import GcpTarget
from tasks.checks.doctor.rows import Check, unreadable
from tasks.common import clients

# What the rendered service uses (tasks/deploy/render.py): ingress "all" (private through IAM) and all-traffic egress.
INGRESS = "all"
VPC_EGRESS = "all-traffic"


# Location value groups a region belongs to (Org Policy "Resource locations" docs: in:us-locations,
# in:eu-locations, in:asia-locations, in:REGION-locations ...); approximate for the groups that cross continents.
_GEO_GROUPS = {
    "us": ("us", "northamerica", "americas"),
    "northamerica": ("northamerica", "americas"),
    "southamerica": ("southamerica", "americas"),
    "europe": ("eu", "europe"),
    "asia": ("asia", "asia-pacific"),
    "australia": ("australia", "asia-pacific"),
    "me": ("me",),
    "africa": ("africa",),
}


def location_values(region: str) -> set[str]:
    """The policy values that name ``region``: itself, its value group and its geography's groups."""
    geo = region.split("-", 1)[0]
    values = {region, f"in:{region}-locations", f"{region}-locations"}
    values |= {f"in:{group}-locations" for group in _GEO_GROUPS.get(geo, ())}
    return values


def _normal(value: str) -> str:
    return value.removeprefix("is:").lower()


def list_policy_allows(policy, values: set[str]) -> bool:
    """Whether an effective list policy lets any of ``values`` through: denyAll refuses, denied values win over
    allowed ones, a rule with allowed values admits only those, and no rule at all (unset) admits everything."""
    wanted = {_normal(v) for v in values}
    allowed_lists: list[set[str]] = []
    for rule in policy.spec.rules if policy.spec else []:
        if rule.deny_all:
            return False
        if rule.allow_all:
            return True
        if rule.values:
            if wanted & {_normal(v) for v in rule.values.denied_values}:
                return False
            if rule.values.allowed_values:
                allowed_lists.append({_normal(v) for v in rule.values.allowed_values})
    return not allowed_lists or any(wanted & allowed for allowed in allowed_lists)


def _restricted_values(policy) -> list[str]:
    return [v for rule in (policy.spec.rules if policy.spec else []) if rule.values for v in rule.values.allowed_values]


def _allow_fix(constraint: str, value: str, project: str) -> str:
    # An organisation policy administrator (roles/orgpolicy.policyAdmin) can add the value for this project.
    return f"gcloud resource-manager org-policies allow {constraint} {value} --project {project}"


def check_org_policies(target: GcpTarget) -> list[Check]:
    """Effective organisation policies that would refuse what the pipeline creates (Org Policy v2)."""
    client = clients.org_policy(target)

    def effective(constraint: str):
        return client.get_effective_policy(name=f"projects/{target.project}/policies/{constraint}")

    checks: list[Check] = []
    for constraint, wanted, why in (
        ("gcp.resourceLocations", location_values(target.region), f"bucket, registry and service in {target.region}"),
        ("run.allowedIngress", {INGRESS}, f"ingress '{INGRESS}' (private through IAM)"),
        ("run.allowedVPCEgress", {VPC_EGRESS}, f"Direct VPC egress '{VPC_EGRESS}'"),
    ):  # fmt: skip
        name = f"org policy {constraint}"
        try:
            policy = effective(constraint)
        except gexc.GoogleAPICallError as exc:
            checks.append(unreadable(name, target, exc, "roles/orgpolicy.policyViewer"))
            continue
        if list_policy_allows(policy, wanted):
            checks.append(Check(name=name, status="ok", detail=f"allows {why}."))
            continue
        value = f"in:{target.region}-locations" if constraint == "gcp.resourceLocations" else next(iter(wanted))
        shown = ", ".join(_restricted_values(policy)) or "nothing"
        checks.append(Check(name=name, status="fail", detail=f"refuses {why}; it allows {shown}.",
                            fix=_allow_fix(constraint, value, target.project)))  # fmt: skip
    checks.append(_check_member_domains(target, effective))
    return checks


def _check_member_domains(target: GcpTarget, effective: Callable) -> Check:
    """Domain-restricted sharing: granting run.invoker to a principal outside the allowed organisations fails."""
    constraint = "iam.allowedPolicyMemberDomains"
    name = f"org policy {constraint}"
    try:
        policy = effective(constraint)
    except gexc.GoogleAPICallError as exc:
        return unreadable(name, target, exc, "roles/orgpolicy.policyViewer")
    rules = policy.spec.rules if policy.spec else []
    if not rules or any(r.allow_all for r in rules):
        return Check(name=name, status="ok", detail="no domain restriction on IAM members.")
    if not target.invokers:
        return Check(name=name, status="ok", detail="domains are restricted; the target grants no invokers.")
    allowed = ", ".join(_restricted_values(policy)) or "no customer"
    return Check(
        name=name, status="warn",
        detail=f"IAM members are restricted to {allowed}; granting run.invoker to {', '.join(target.invokers)} "
        "fails unless each belongs to one of them (the customer IDs cannot be matched to e-mail domains here).",
        fix=f"gcloud org-policies describe {constraint} --effective --project {target.project}",
    )  # fmt: skip
