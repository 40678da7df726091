"""Role grants take effect some time after the setIamPolicy call that made them, as on Google Cloud.

Google's IAM docs, "Access change propagation": a change to an allow policy takes "Typically 2 minutes,
potentially 7 minutes or longer" to be effective everywhere. The sandbox counts a binding that a setIamPolicy call
added (a role newly granted to a member on the project or on a resource) only ``grant_propagation_seconds`` of
simulated time after the call; bindings that were there before are not touched. Revocations take effect at once
here (Google's docs say a revoked role may still work for a while: not modelled). Observed effects of such a
window, which the product must wait through: DefangLabs/pulumi-defang issue 115 (a build refused right after its
account was granted the source bucket), doughayden/answer-app's README ("a race condition where the Cloud Build
service account IAM role bindings have not yet propagated").
"""

from __future__ import annotations

import threading
import time


def policy_key(resource: str) -> str:
    """Which policy a permission check on ``resource`` reads besides the project's: the resource holding it
    ("projects/_/buckets/b", "projects/p/secrets/s", "projects/p/locations/l/services/s", ...)."""
    parts = resource.split("/")
    if len(parts) < 4:
        return "project"
    parts[1] = "_"  # one project: named by id, number or "-" alike
    if len(parts) >= 6 and parts[2] == "locations":
        return "/".join([*parts[:5], parts[5].split(":")[0]])
    return "/".join(parts[:4])


def grant_role(binding: dict) -> str:
    """The ledger's name for what a binding grants: its role, and for a conditional binding its condition too (a
    conditional grant of a role the member already held unconditionally is a new grant, and propagates as one)."""
    condition = binding.get("condition")
    return f"{binding['role']} if {condition.get('expression', '')}" if condition else binding["role"]


def bindings_of(policy: dict | None) -> set[tuple[str, str]]:
    """The (grant_role, member) pairs a policy grants, conditional bindings included."""
    pairs: set[tuple[str, str]] = set()
    for binding in (policy or {}).get("bindings", []) or []:
        pairs.update((grant_role(binding), member) for member in binding.get("members", []))
    return pairs


class GrantLedger:
    """When each binding was added, per policy ("project" for the project's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._added: dict[tuple[str, str, str], float] = {}

    def record(self, key: str, before: set[tuple[str, str]], after: set[tuple[str, str]]) -> None:
        now = time.monotonic()
        with self._lock:
            for role, member in after - before:
                self._added[(key, role, member)] = now

    def settle(self) -> int:
        """Every grant made so far counts from now on (minutes passed: the next ones still wait); returns how many."""
        with self._lock:
            count = len(self._added)
            self._added.clear()
        return count

    def pending(self, key: str, role: str, member: str, window_s: float) -> bool:
        """Whether the binding was added less than ``window_s`` (real seconds) ago."""
        if window_s <= 0:
            return False
        with self._lock:
            added = self._added.get((key, role, member))
        return added is not None and time.monotonic() - added < window_s
