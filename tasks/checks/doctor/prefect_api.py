"""doctor's Prefect row: whether the deployments' work pool can run flow runs that reach the Prefect API.

A cloud-run-v2 pool's jobs get the worker's PREFECT_API_URL and credentials (tasks/checks/api_reach.py says why):
doctor reads the pool from the Prefect API (its type and base job template) and PREFECT_API_URL as Prefect resolves
it here, the same URL a worker started from this shell would copy into every job.
"""

from __future__ import annotations

from typing import Any

from prefect.client.orchestration import get_client
from prefect.exceptions import ObjectNotFound

from blocks.target import GcpTarget
from tasks.checks import api_reach as api
from tasks.checks.doctor.rows import Check, google_text

NAME = "Prefect API"
BOOTSTRAP = "python -m flows.bootstrap gcp --project PROJECT --region REGION --pool-type cloud-run-v2 ..."


def _job_vpc_access(template: dict[str, Any]) -> dict[str, Any]:
    body = template.get("job_configuration", {}).get("job_body", {})
    return body.get("template", {}).get("template", {}).get("vpcAccess") or {}


def check_prefect_api(pool: str, target: GcpTarget) -> Check:
    """The pool ``pool`` (prefect.yaml's ``definitions.work_pools.pipeline``) against PREFECT_API_URL: a cloud-run-v2
    pool with a loopback or unset URL fails; a private URL without Direct VPC egress in the pool's job body, or a
    Prefect credential the pool would copy into jobs in plain text, warns."""
    url = api.api_url()
    try:
        with get_client(sync_client=True) as client:
            work_pool = client.read_work_pool(pool)
    except ObjectNotFound:
        return Check(name=NAME, status="ok", detail=f"work pool '{pool}' does not exist yet: bootstrap gcp creates it.")
    except Exception as exc:  # the API itself out of reach: say so in the row rather than crash the others
        return Check(name=NAME, status="fail", detail=f"PREFECT_API_URL {url}: work pool '{pool}' could not be read "
                     f"({google_text(exc)})", fix="start the server, or point PREFECT_API_URL at one")  # fmt: skip
    if work_pool.type != api.POOL_TYPE:
        return Check(name=NAME, status="ok", detail=f"work pool '{pool}' is a {work_pool.type} pool: flow runs run on "
                     "the worker's machine and reach PREFECT_API_URL from there.")  # fmt: skip
    reach = api.api_reach(url)
    if reach in ("unset", "loopback"):
        process = f"make '{pool}' a process pool (`prefect work-pool delete {pool}`, bootstrap gcp --pool-type process)"
        return Check(
            name=NAME, status="fail", detail=api.unreachable_message(url, process),
            summary=f"PREFECT_API_URL {url or '(unset)'}: the {api.POOL_TYPE} pool's jobs cannot reach this machine",
            fix="set PREFECT_API_URL to Prefect Cloud or a server the jobs reach (a private address in the target's "
            f"VPC, or a public one), then run `{BOOTSTRAP}` again; or use --pool-type process",
        )  # fmt: skip
    template = work_pool.base_job_template or {}
    if reach == "private" and not _job_vpc_access(template).get("networkInterfaces"):
        return Check(
            name=NAME, status="warn",
            detail=f"PREFECT_API_URL {url} is a private address, but the pool's jobs have no Direct VPC egress: they "
            f"cannot reach it; bootstrap gcp adds the target's network {target.network} / subnet {target.subnet}",
            fix=f"run `{BOOTSTRAP}` again with PREFECT_API_URL={url}",
        )  # fmt: skip
    properties = template.get("variables", {}).get("properties", {})
    set_here = api.credential_settings()
    plain = [setting for variable, setting, _secret, _field in api.CREDENTIALS
             if setting in set_here and not (properties.get(variable) or {}).get("default")]  # fmt: skip
    if plain:
        return Check(
            name=NAME, status="warn",
            detail=f"{' and '.join(plain)} would be copied in plain text into every job (anyone with run.jobs.get "
            "reads it); bootstrap gcp stores it in Secret Manager and the pool references the secret",
            fix=f"run `{BOOTSTRAP}` again with {' and '.join(plain)} set",
        )  # fmt: skip
    how = {"private": "through the target's VPC (Direct VPC egress)", "public": "at its address"}[reach]
    return Check(name=NAME, status="ok", detail=f"the {api.POOL_TYPE} pool's jobs reach PREFECT_API_URL {url} {how}.")
