"""Whether a cloud-run-v2 pool's jobs can reach the Prefect API at PREFECT_API_URL, and which Prefect credentials
are set here: the checks bootstrap and doctor share (tasks/report/prefect_api.py makes the pool fit them).

A cloud-run-v2 worker copies its own settings into every job it creates: ``BaseWorker._base_environment()``
(prefect/workers/base.py) is ``get_current_settings().to_environment_variables(exclude_unset=True)``, so the job gets
the worker's PREFECT_API_URL and, in plain text, its PREFECT_API_KEY or PREFECT_API_AUTH_STRING. A loopback URL
(127.0.0.0/8, ::1, localhost, 0.0.0.0) then names the job's own container on Cloud Run: the flow run never reaches
the API and crashes (prefect-archive/prefect-gcp#266, PrefectHQ/prefect#17513). A private address is reached only
through the VPC (Direct VPC egress).

Host names other than ``localhost`` are not resolved: what a name means on this machine (a hosts entry, a private
zone) says nothing about what it means inside a Cloud Run job, so a name counts as reachable, and a server behind a
private DNS name needs the VPC set up by its owner.
"""

from __future__ import annotations

import ipaddress
from typing import Literal
from urllib.parse import urlsplit

from prefect.settings import get_current_settings

Reach = Literal["unset", "loopback", "private", "public"]
# Addresses a job reaches only through the VPC. Cloud Run's "Networking best practices" page: with
# --vpc-egress=private-ranges-only (the default) "internal IP address requests" go to the VPC network. RFC 1918's
# ranges are internal; 100.64.0.0/10 (RFC 6598 shared space, valid for VPC subnets) is counted with them
# (unconfirmed for egress routing: the docs page does not list the ranges).
PRIVATE_RANGES = tuple(
    ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10")
)
POOL_TYPE = "cloud-run-v2"
# (pool variable, the setting it replaces, the secret's id, the prefect setting's field). The ids are prefect-gcp's own
# examples for these variables (CloudRunWorkerV2Variables).
CREDENTIALS = (
    ("prefect_api_key_secret", "PREFECT_API_KEY", "prefect-api-key", "key"),
    ("prefect_api_auth_string_secret", "PREFECT_API_AUTH_STRING", "prefect-api-auth-string", "auth_string"),
)


class PrefectApiError(ValueError):
    """A Prefect API the Cloud Run pool's jobs could not reach; the message names PREFECT_API_URL and the ways out."""


def api_url() -> str | None:
    """PREFECT_API_URL as Prefect resolves it (environment, then the active profile)."""
    return get_current_settings().api.url


def api_reach(url: str | None) -> Reach:
    """Where ``url`` points, seen from a Cloud Run job: unset, the job itself (loopback), a private range, or not."""
    if not url:
        return "unset"
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):  # RFC 6761 6.3: always the loopback interface
        return "loopback"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return "unset" if not host else "public"
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback or address.is_unspecified:
        return "loopback"
    return "private" if any(address in network for network in PRIVATE_RANGES) else "public"


def unreachable_message(url: str | None, process_fix: str) -> str:
    """Why the pool's jobs cannot use ``url`` and the three ways out (``process_fix`` says how to pick a process
    pool from where the message is shown)."""
    said = "is not set (Prefect would start a temporary server on this machine)" if not url else f"is {url}"
    return (
        f"PREFECT_API_URL {said}: a {POOL_TYPE} pool's worker copies this URL into every Cloud Run job, where it "
        "names the job's own container, so every flow run would crash. Set PREFECT_API_URL to a Prefect API the jobs "
        "reach: Prefect Cloud (`prefect cloud login`), or a self-hosted server at a private address in the target's "
        "VPC (GcpTarget.network / subnet: the pool's jobs get Direct VPC egress there) or at a public address; or "
        f"keep this server and {process_fix} (flow runs then run on the worker's machine)"
    )


def require_reachable_api(pool_type: str, process_fix: str = "use --pool-type process") -> Reach:
    """The current PREFECT_API_URL's reach; PrefectApiError when a ``cloud-run-v2`` pool's jobs could not use it."""
    url = api_url()
    reach = api_reach(url)
    if pool_type == POOL_TYPE and reach in ("unset", "loopback"):
        raise PrefectApiError(unreachable_message(url, process_fix))
    return reach


def credential_settings() -> dict[str, str]:
    """The Prefect credentials set here (PREFECT_API_KEY, PREFECT_API_AUTH_STRING), by setting name; never logged."""
    api = get_current_settings().api
    found = {}
    for _variable, setting, _secret, field in CREDENTIALS:
        value = getattr(api, field)
        if value is not None and value.get_secret_value():
            found[setting] = value.get_secret_value()
    return found
