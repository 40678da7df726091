"""The Cloud Run pool's base job template as bootstrap fills it, proven with prefect-gcp's own code.

Deployments on the pool carry no job variables: everything a job needs comes from the variable defaults that
``cloud_run_base_job_template`` writes into prefect-gcp's own template. The job is built the worker's way
(tests/support/cloud_run_job.py) and checked against run.v2 ``GoogleCloudRunV2Job``. The credentials block
reference is resolved through a real Prefect API in tests/integration/test_work_pool.py.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from prefect_gcp.workers.cloud_run_v2 import CloudRunWorkerV2

from blocks.target import GcpTarget
from tasks.report.work_pool import cloud_run_base_job_template, default_base_job_template
from tests.support.cloud_run_job import key_file_block_data, prepare_job, problems

ROOT = Path(__file__).resolve().parents[2]
PREFECT_YAML = yaml.safe_load((ROOT / "prefect.yaml").read_text())
DEPLOYMENTS = PREFECT_YAML["deployments"]
PULL = PREFECT_YAML.get("pull", [])
TARGET = GcpTarget(project="acme-ml-prod", region="europe-west4")
IMAGE = "europe-west4-docker.pkg.dev/acme-ml-prod/vllm-images/hf-cloudrun-pipeline@sha256:" + "a" * 64


def template(**overrides: Any) -> dict[str, Any]:
    """The filled template, its credentials default set to what the worker resolves the block reference to (the
    block's data; the reference itself is resolved through a real API in tests/integration/test_work_pool.py).
    Without credentials prefect-gcp falls back to ADC, which this machine does not have."""
    filled = cloud_run_base_job_template(TARGET, IMAGE, credentials_block=None, **overrides)
    filled["variables"]["properties"]["credentials"]["default"] = key_file_block_data(TARGET.project)
    return filled


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=[d["name"] for d in DEPLOYMENTS])
def test_job_of_every_deployment_built_from_the_filled_template_alone_fits_the_cloud_run_v2_job_schema(deployment):
    configuration, _ = prepare_job(deployment, template(), {}, PULL, "hf-pipeline")
    assert problems(configuration.job_body) == []


def test_job_runs_our_image_in_our_region_as_the_pipeline_runner_with_the_pool_resources():
    configuration, flow_run = prepare_job(DEPLOYMENTS[0], template(), {}, PULL, "hf-pipeline")
    task = configuration.job_body["template"]["template"]
    [container] = task["containers"]
    assert container["image"] == IMAGE
    assert container["resources"]["limits"] == {"cpu": "2", "memory": "4Gi"}
    assert task["serviceAccount"] == "pipeline-runner@acme-ml-prod.iam.gserviceaccount.com"
    assert task["timeout"] == "10800s"  # 3 h: a first promotion stages weights and may build an image
    assert configuration.region == "europe-west4"
    assert configuration.project == "acme-ml-prod"  # from the credentials: the job is created in this project
    # prefect-gcp replaces the image's ENTRYPOINT with the engine, which runs the pull steps, then the entrypoint.
    assert container["command"] == ["prefect", "flow-run", "execute"]
    assert "workingDir" not in container  # the image's WORKDIR, where ./Dockerfile installs the project
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["PREFECT__FLOW_RUN_ID"] == str(flow_run.id)


def test_arguments_override_the_defaults_and_a_job_variable_still_overrides_the_pool():
    filled = template(service_account="runner@acme-ml-prod.iam.gserviceaccount.com", cpu="4", memory="8Gi", timeout=600)
    configuration, _ = prepare_job(DEPLOYMENTS[0], filled, {"memory": "16Gi"}, PULL, "hf-pipeline")
    task = configuration.job_body["template"]["template"]
    assert task["serviceAccount"] == "runner@acme-ml-prod.iam.gserviceaccount.com"
    assert task["containers"][0]["resources"]["limits"] == {"cpu": "4", "memory": "16Gi"}
    assert task["timeout"] == "600s"


def test_only_variable_defaults_are_filled_in_prefect_gcps_own_template():
    filled = cloud_run_base_job_template(TARGET, IMAGE, credentials_block=None)
    default = CloudRunWorkerV2.get_default_base_job_template()
    assert filled["job_configuration"] == default["job_configuration"]
    changed = {
        key
        for key, schema in filled["variables"]["properties"].items()
        if schema != default["variables"]["properties"][key]
    }
    assert changed == {"image", "region", "service_account_name", "cpu", "memory", "timeout"}
    assert "default" not in filled["variables"]["properties"]["credentials"]  # None: the worker's own ADC


@pytest.mark.parametrize(
    ("overrides", "field"),
    [({"memory": "4GB"}, "memory"), ({"timeout": 0}, "timeout"), ({"timeout": 604801}, "timeout")],
    ids=["memory-unit", "timeout-zero", "timeout-over-7-days"],
)
def test_values_the_pools_schema_refuses_fail_when_the_template_is_made(overrides, field):
    with pytest.raises(ValueError, match=rf"^{field} .*\(the Cloud Run pool's variables\)$"):
        template(**overrides)


def test_the_template_is_a_fresh_copy_each_time():
    first = cloud_run_base_job_template(TARGET, IMAGE, credentials_block=None)
    first["variables"]["properties"]["image"]["default"] = "changed"
    second = cloud_run_base_job_template(TARGET, IMAGE, credentials_block=None)
    assert second["variables"]["properties"]["image"]["default"] == IMAGE
    assert default_base_job_template("cloud-run-v2") == CloudRunWorkerV2.get_default_base_job_template()


def test_an_invented_field_in_a_job_from_the_filled_template_is_reported():
    configuration, _ = prepare_job(DEPLOYMENTS[0], template(), {}, PULL, "hf-pipeline")
    body = copy.deepcopy(configuration.job_body)
    body["template"]["template"]["containers"][0]["workingDirectory"] = "/opt/hf-cloudrun-pipeline"
    assert problems(body) == [
        'Invalid JSON payload received. Unknown name "workingDirectory" at '
        "'template.template.containers[0]': Cannot find field."
    ]
