"""The Cloud Run job prefect-gcp's ``cloud-run-v2`` worker would create for a flow run, built with its own code.

The body is the one the worker sends to ``jobs.create`` (``prefect_gcp/workers/cloud_run_v2.py``:
``JobV2.create(body=configuration.job_body)``), built the worker's way (``prefect/workers/base.py``
``resolve_for_flow_run``): ``CloudRunWorkerJobV2Configuration.from_template_and_values`` with the pool's base job
template and the deployment's job variables, then ``prepare_for_flow_run``. ``problems`` checks a body against
``GoogleCloudRunV2Job`` of Google's run.v2 discovery document.
"""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import uuid4

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.objects import Flow, FlowRun, WorkPool
from prefect.client.schemas.responses import DeploymentResponse
from prefect_gcp.workers.cloud_run_v2 import CloudRunWorkerJobV2Configuration, CloudRunWorkerV2

from sandbox import discovery
from sandbox.conformance.schema import walker

PROJECT = "YOUR_PROJECT"
# After deploy-time resolution no block or variable placeholder is left, so the worker's API client is never
# called; if one were, a request to this closed port would fail the test instead of passing silently.
CLOSED_API = "http://127.0.0.1:9/api"


def key_file_block_data(project: str = PROJECT) -> dict[str, Any]:
    """The data of a ``gcp-credentials`` block saved from a service account key file (one of bootstrap's two
    routes; the other, ADC, would need the machine's credentials). The key is made here: a real key file's fields,
    so prefect-gcp builds real google-auth credentials from it without any request."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    info = {
        "type": "service_account",
        "project_id": project,
        "private_key_id": "0" * 40,
        "private_key": pem.decode(),
        "client_email": f"pipeline-runner@{project}.iam.gserviceaccount.com",
        "client_id": "1" * 21,
        "token_uri": "https://oauth2.googleapis.com/token",
    }
    return {"project": project, "service_account_info": info}


def prepare_job(
    deployment: dict[str, Any],
    base_job_template: dict[str, Any],
    job_variables: dict[str, Any],
    pull_steps: list[dict[str, Any]],
    pool_name: str,
    api_url: str | None = CLOSED_API,
) -> tuple[CloudRunWorkerJobV2Configuration, FlowRun]:
    """The configuration (and its job body) the cloud-run-v2 worker prepares for one flow run of ``deployment``
    (a prefect.yaml deployment entry) on a pool with ``base_job_template``. ``api_url`` None uses the current
    Prefect API (block references in the template are then read from it, as the worker does)."""
    flow = Flow(id=uuid4(), name=deployment["entrypoint"].rpartition(":")[2].replace("_", "-"))
    api_deployment = DeploymentResponse(
        id=uuid4(),
        name=deployment["name"],
        flow_id=flow.id,
        entrypoint=deployment["entrypoint"],
        job_variables=job_variables,
        pull_steps=pull_steps,
        work_pool_name=pool_name,
    )
    flow_run = FlowRun(id=uuid4(), name="brave-otter", flow_id=flow.id, deployment_id=api_deployment.id)
    work_pool = WorkPool(name=pool_name, type=CloudRunWorkerV2.type, base_job_template=base_job_template)

    async def configure() -> CloudRunWorkerJobV2Configuration:
        if api_url is not None:  # never entered: nothing may be requested from it
            return await CloudRunWorkerJobV2Configuration.from_template_and_values(
                base_job_template=base_job_template, values=job_variables, client=PrefectClient(api=api_url)
            )
        async with get_client() as client:
            return await CloudRunWorkerJobV2Configuration.from_template_and_values(
                base_job_template=base_job_template, values=job_variables, client=client
            )

    configuration = asyncio.run(configure())
    configuration.prepare_for_flow_run(
        flow_run=flow_run, deployment=api_deployment, flow=flow, work_pool=work_pool, worker_name="cloud-run-worker"
    )
    return configuration, flow_run


def job_create_schema() -> str:
    """The request schema of run.v2 ``jobs.create``, the call the worker makes with the body."""
    found = discovery.match("POST", f"/v2/projects/{PROJECT}/locations/us-central1/jobs", ("run.v2",))
    assert found is not None and found.id == "run.projects.locations.jobs.create"
    schema = found.method.request_schema
    assert schema == "GoogleCloudRunV2Job"
    return schema


def problems(body: dict[str, Any]) -> list[str]:
    """What Cloud Run would refuse in a ``jobs.create`` body: unknown fields, bad enums, wrong types."""
    return [p.message for p in walker("run.v2", "request").check(job_create_schema(), body)]
