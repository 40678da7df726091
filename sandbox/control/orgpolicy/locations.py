"""The ``gcp.resourceLocations`` organization policy as the APIs that create resources enforce it.

A create in a location the effective policy does not allow is refused with 400 FAILED_PRECONDITION, the message
"Constraint constraints/gcp.resourceLocations violated for [orgpolicy:projects/NUMBER] attempting to create a
secret in [global]. For more information, see https://cloud.google.com/resource-manager/docs/organization-policy/
defining-locations." and a ``google.rpc.PreconditionFailure`` detail (the full body in firebase/firebase-tools
issue 6454; the same text in GoogleCloudPlatform/cluster-toolkit PR 2828 and scion issue 1531). A secret with
automatic replication is created in ``global``, which a policy listing only regions or value groups refuses: the
classic first-run failure in organizations that restrict locations (terraform-dynamic-python-webapp PR 118).
"""

from __future__ import annotations

from sandbox.config import SandboxConfig
from sandbox.control.errors import GoogleApiError

CONSTRAINT = "gcp.resourceLocations"
DOCS = "https://cloud.google.com/resource-manager/docs/organization-policy/defining-locations"
# Continent-wide value groups by region prefix (Org Policy "Resource locations" docs: in:us-locations,
# in:eu-locations, in:asia-locations ...); a region also matches its own in:REGION-locations group.
_GROUPS = {"us": ("us",), "northamerica": ("northamerica",), "europe": ("eu", "europe"), "asia": ("asia",)}


def location_names(location: str) -> set[str]:
    """The values of an allowed or denied list that name ``location``: itself and the value groups holding it."""
    if location == "global":
        return {"global", "in:global"}
    names = {location, f"in:{location}-locations"}
    prefix = location.split("-", 1)[0]
    names |= {f"in:{group}-locations" for group in _GROUPS.get(prefix, ())}
    return names


def location_allowed(config: SandboxConfig, location: str) -> bool:
    """Whether the project's effective ``gcp.resourceLocations`` policy allows a resource in ``location``."""
    names = location_names(location)
    for rule in (config.org_policies.get(CONSTRAINT) or {}).get("rules", []):
        if rule.get("allowAll"):
            return True
        if rule.get("denyAll"):
            return False
        values = rule.get("values") or {}
        if names & set(values.get("deniedValues", [])):
            return False
        if "allowedValues" in values:
            return bool(names & set(values["allowedValues"]))
    return True


def check_location(config: SandboxConfig, project_number: str, location: str, kind: str) -> None:
    """Raise the API's refusal when the policy does not allow a ``kind`` ("secret") in ``location``."""
    if location_allowed(config, location):
        return
    subject = f"orgpolicy:projects/{project_number}"
    message = (
        f"Constraint constraints/{CONSTRAINT} violated for [{subject}] attempting to create a {kind} in "
        f"[{location}]. For more information, see {DOCS}."
    )
    violation = {"type": f"constraints/{CONSTRAINT}", "subject": subject, "description": message}
    details = [{"@type": "type.googleapis.com/google.rpc.PreconditionFailure", "violations": [violation]}]
    raise GoogleApiError(400, message, "FAILED_PRECONDITION", details=details)
