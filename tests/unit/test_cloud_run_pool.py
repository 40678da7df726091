"""The Cloud Run work pool in prefect.yaml, proven with prefect-gcp's own code.

The job body is the one prefect-gcp's ``cloud-run-v2`` worker sends to ``jobs.create``
(``prefect_gcp/workers/cloud_run_v2.py``: ``JobV2.create(body=configuration.job_body)``), built the worker's way
(``prefect/workers/base.py`` ``resolve_for_flow_run``): the pool's default base job template
(``CloudRunWorkerV2.get_default_base_job_template()``, what ``prefect work-pool create --type cloud-run-v2`` stores),
``CloudRunWorkerJobV2Configuration.from_template_and_values`` with the deployment's job variables, then
``prepare_for_flow_run``. The body is checked against ``GoogleCloudRunV2Job`` of Google's run.v2 discovery document.
"""

from __future__ import annotations

import asyncio
import copy
import re
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.objects import Flow, FlowRun, WorkPool
from prefect.client.schemas.responses import DeploymentResponse
from prefect.utilities.templating import PlaceholderType, find_placeholders
from prefect_gcp.workers.cloud_run_v2 import (
    CloudRunWorkerJobV2Configuration,
    CloudRunWorkerV2,
    CloudRunWorkerV2Variables,
)

from sandbox import discovery
from sandbox.conformance.schema import walker

ROOT = Path(__file__).resolve().parents[2]
PREFECT_YAML = yaml.safe_load((ROOT / "prefect.yaml").read_text())
POOL = PREFECT_YAML["definitions"]["work_pools"]["cloud_run"]
CLOUD_RUN_PULL = PREFECT_YAML["definitions"]["cloud_run_pull"]
DEPLOYMENTS = PREFECT_YAML["deployments"]
SET_WORKING_DIRECTORY = "prefect.deployments.steps.set_working_directory"
PROJECT = "YOUR_PROJECT"


def dockerfile_workdir() -> str:
    """The last WORKDIR of ./Dockerfile: where the image copies the project (``COPY . .``) and starts."""
    found = re.findall(r"^WORKDIR\s+(\S+)\s*$", (ROOT / "Dockerfile").read_text(), flags=re.MULTILINE)
    assert found, "Dockerfile has no WORKDIR"
    return found[-1]


def pull_directory(steps: list[dict[str, Any]]) -> str:
    """The directory the deployment's pull steps move a flow run to (the last set_working_directory)."""
    found = [step[SET_WORKING_DIRECTORY]["directory"] for step in steps if SET_WORKING_DIRECTORY in step]
    assert found, f"no {SET_WORKING_DIRECTORY} pull step in {steps}"
    return found[-1]


def key_file_block_data() -> dict[str, Any]:
    """The data of the ``gcp-credentials/pipeline`` block saved from a service account key file (one of bootstrap's
    two routes; the other, ADC, would need the machine's credentials). The key is made here: a real key file's
    fields, so prefect-gcp builds real google-auth credentials from it without any request."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    info = {
        "type": "service_account",
        "project_id": PROJECT,
        "private_key_id": "0" * 40,
        "private_key": pem.decode(),
        "client_email": f"pipeline-runner@{PROJECT}.iam.gserviceaccount.com",
        "client_id": "1" * 21,
        "token_uri": "https://oauth2.googleapis.com/token",
    }
    return {"project": PROJECT, "service_account_info": info}


def resolved_at_deploy(value: Any, blocks: dict[str, dict[str, Any]]) -> Any:
    """What ``prefect deploy`` stores: it resolves ``{{ prefect.blocks.<type>.<name> }}`` in the deployment to the
    block document's data (prefect/cli/deploy/_core.py calls ``resolve_block_document_references`` on the deploy
    config). Here the block documents come from ``blocks`` instead of an API, so nothing is read over HTTP."""
    if isinstance(value, dict):
        return {key: resolved_at_deploy(item, blocks) for key, item in value.items()}
    if isinstance(value, list):
        return [resolved_at_deploy(item, blocks) for item in value]
    if isinstance(value, str):
        found = [p for p in find_placeholders(value) if p.type is PlaceholderType.BLOCK_DOCUMENT]
        if found:
            assert len(found) == 1 and found[0].full_match == value, f"inline block reference {value!r}"
            name = found[0].name.removeprefix("prefect.blocks.")
            assert name in blocks, f"job variables reference block {name!r} that the test does not know"
            return copy.deepcopy(blocks[name])
    return value


def cloud_run_job(deployment: dict[str, Any]) -> tuple[CloudRunWorkerJobV2Configuration, FlowRun]:
    """The configuration (and its job body) the cloud-run-v2 worker prepares for one flow run of ``deployment``
    on the Cloud Run pool of prefect.yaml."""
    base_job_template = CloudRunWorkerV2.get_default_base_job_template()
    job_variables = resolved_at_deploy(POOL["job_variables"], {"gcp-credentials.pipeline": key_file_block_data()})
    # The server checks a deployment's job variables against the pool's variables schema; the worker's own
    # variables model is that schema's source (memory pattern, timeout bounds, credentials block).
    CloudRunWorkerV2Variables.model_validate(job_variables)

    flow = Flow(id=uuid4(), name=deployment["entrypoint"].rpartition(":")[2].replace("_", "-"))
    api_deployment = DeploymentResponse(
        id=uuid4(),
        name=deployment["name"],
        flow_id=flow.id,
        entrypoint=deployment["entrypoint"],
        job_variables=job_variables,
        pull_steps=CLOUD_RUN_PULL,
        work_pool_name=POOL["name"],
    )
    flow_run = FlowRun(id=uuid4(), name="brave-otter", flow_id=flow.id, deployment_id=api_deployment.id)
    work_pool = WorkPool(name=POOL["name"], type=CloudRunWorkerV2.type, base_job_template=base_job_template)

    # After deploy-time resolution no block or variable placeholder is left, so the worker's API client is never
    # called; if one were, the request to this closed port would fail the test instead of passing silently.
    client = PrefectClient(api="http://127.0.0.1:9/api")
    configuration = asyncio.run(
        CloudRunWorkerJobV2Configuration.from_template_and_values(
            base_job_template=base_job_template, values=job_variables, client=client
        )
    )
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
    return [p.message for p in walker("run.v2", "request").check(job_create_schema(), body)]


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=[d["name"] for d in DEPLOYMENTS])
def test_job_body_of_every_deployment_on_the_cloud_run_pool_fits_the_cloud_run_v2_job_schema(deployment):
    configuration, _ = cloud_run_job(deployment)
    assert problems(configuration.job_body) == []


def test_job_runs_our_image_with_the_pool_settings():
    configuration, flow_run = cloud_run_job(DEPLOYMENTS[0])
    body = configuration.job_body
    task = body["template"]["template"]
    [container] = task["containers"]
    variables = POOL["job_variables"]
    assert container["image"] == variables["image"]
    assert container["resources"]["limits"] == {"cpu": variables["cpu"], "memory": variables["memory"]}
    assert task["serviceAccount"] == variables["service_account_name"]
    assert task["timeout"] == f"{variables['timeout']}s"
    assert configuration.region == variables["region"]
    assert configuration.project == PROJECT  # from the credentials block: the job is created in this project
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["PREFECT__FLOW_RUN_ID"] == str(flow_run.id)


def test_job_starts_the_flow_run_engine_where_the_pull_step_and_the_image_put_the_project():
    configuration, _ = cloud_run_job(DEPLOYMENTS[0])
    [container] = configuration.job_body["template"]["template"]["containers"]
    # prefect-gcp replaces the image's ENTRYPOINT with the engine, which runs the deployment's pull steps and
    # then loads its entrypoint (flows/...py:flow) relative to the directory they set.
    assert container["command"] == ["prefect", "flow-run", "execute"]
    assert container.get("args", []) == []  # nothing appended to the engine command
    # prefect-gcp sets no workingDir, so the container starts in the image's WORKDIR (Cloud Run v2 Container:
    # "If not specified, the container runtime's default will be used, which might be configured in the container
    # image", https://cloud.google.com/run/docs/reference/rest/v2/Container). The pull step must name that folder.
    workdir = dockerfile_workdir()
    assert container.get("workingDir", workdir) == workdir
    assert pull_directory(CLOUD_RUN_PULL) == workdir
    # The image copies the whole project there (COPY . .), so every deployment's entrypoint file is found.
    assert re.search(r"^COPY\s+\.\s+\.\s*$", (ROOT / "Dockerfile").read_text(), flags=re.MULTILINE)
    ignored = (ROOT / ".dockerignore").read_text().split() if (ROOT / ".dockerignore").exists() else []
    for deployment in DEPLOYMENTS:
        path = deployment["entrypoint"].partition(":")[0]
        assert (ROOT / path).is_file(), path
        assert path.split("/")[0] not in ignored, f"{path} is left out of the image by .dockerignore"
    # A deployment put on the pool takes that pull step, not the top-level one ({{ $PWD }} of the deploying machine).
    for deployment in DEPLOYMENTS:
        if deployment.get("work_pool", {}).get("name") == POOL["name"]:
            assert pull_directory(deployment.get("pull", PREFECT_YAML.get("pull", []))) == workdir, deployment["name"]


def test_an_invented_field_or_a_bad_enum_in_the_job_body_is_reported():
    configuration, _ = cloud_run_job(DEPLOYMENTS[0])
    body = copy.deepcopy(configuration.job_body)
    body["template"]["template"]["containers"][0]["workingDirectory"] = "/opt/hf-cloudrun-pipeline"
    body["launchStage"] = "PREVIEW"
    assert problems(body) == [
        "Invalid value at 'launch_stage' (type.googleapis.com/google.api.LaunchStage), \"PREVIEW\"",
        'Invalid JSON payload received. Unknown name "workingDirectory" at '
        "'template.template.containers[0]': Cannot find field.",
    ]
