"""Cloud Run's own log lines about an instance (run.googleapis.com/varlog/system), in its words and severities.

Sources: Cloud Run docs, "Logging and viewing logs", section "Instance scaling logs format and contents" ("Starting
new instance. Reason: REASON - DESCRIPTION", with its three reasons), and the lines as public reports quote them
(the reference corpus: find_string "Starting new instance. Reason", "STARTUP HTTP probe succeeded", "Default
STARTUP TCP probe succeeded", "Container called exit", "LIVENESS HTTP probe failed"). Where the docs' table words a
reason differently from the logged line, the logged line is used.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandbox.control.run.instances import ProbeSpec


class StartReason(Enum):
    """Why Cloud Run started an instance, as "Starting new instance. Reason: ..." gives it."""

    # Logged for a request that found no instance (public reports; the docs' table words it "such as CPU
    # utilization, request throughput, and so forth) or not enough existing capacity").
    AUTOSCALING = (
        "AUTOSCALING - Instance started due to configured scaling factors (e.g. CPU utilization, request "
        "throughput, etc.) or no existing capacity for current traffic."
    )
    # A deploy starts an instance with no request (its health check).
    DEPLOYMENT_ROLLOUT = (
        "DEPLOYMENT_ROLLOUT - Instance started due to traffic shifting between revisions due to deployment, "
        "traffic split adjustment, or deployment health check."
    )
    # A minimum (min-instances, manual scaling) keeps the revision up. Quoted in full by public reports (corpus ids
    # 25670553771, 52206922347); the docs' table: "Instance started because of customer-configured minimum
    # instances or manual scaling".
    MIN_INSTANCE = (
        "MANUAL_OR_CUSTOMER_MIN_INSTANCE - Instance started because of customer-configured min-instances or manual "
        "scaling."
    )


def start_line(reason: StartReason) -> str:
    """The instance-start line (severity INFO: ``gcloud functions logs read`` shows ``LEVEL: I`` on it)."""
    return f"Starting new instance. Reason: {reason.value}"


def _where(probe: ProbeSpec) -> str:
    return f'on port {probe.port} path "{probe.path}"' if probe.kind == "http" else f"on port {probe.port}"


def startup_passed_line(probe: ProbeSpec, attempts: int, container: str) -> str:
    """The startup probe passed at attempt ``attempts`` (severity INFO). Cloud Run's automatic TCP probe is the
    "Default" one: ``Default STARTUP TCP probe succeeded after 1 attempt for container "repurpose-worker-1" on port
    8080.``; a configured one is not: ``STARTUP HTTP probe succeeded after 2 attempts for container "worker-1" on port
    8080 path "/health".``"""
    kind = f"{'Default ' if probe.default else ''}STARTUP {probe.kind.upper()}"
    tries = "1 attempt" if attempts == 1 else f"{attempts} attempts"
    return f'{kind} probe succeeded after {tries} for container "{container}" {_where(probe)}.'


def liveness_failed_line(probe: ProbeSpec, misses: int, container: str) -> str:
    """The liveness probe failed ``misses`` times in a row and the instance was shut down (severity ERROR; the
    quoting follows its STARTUP sibling: ``STARTUP HTTP probe failed 3 times consecutively for container "..." on port
    8080 path "/health/ready". The instance was not started.``)."""
    times = "1 time" if misses == 1 else f"{misses} times"
    return (
        f'LIVENESS {probe.kind.upper()} probe failed {times} consecutively for container "{container}" '
        f"{_where(probe)}. The instance has been shut down."
    )


def exit_line(code: int | None) -> str:
    """A container that ended (severity WARNING): "Container called exit(1)." for an exit code, "Container terminated
    on signal 9." for a signal."""
    if code is not None and code < 0:
        return f"Container terminated on signal {-code}."
    return f"Container called exit({code})."
