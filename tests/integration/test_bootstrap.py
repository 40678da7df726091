"""`python -m flows.bootstrap gcp` on the Prefect side: credentials, target, work pool, worker image.

docs/using.md's process-pool path (deploy included) is tests/e2e/test_walkthrough.py; here are the other routes:
a Cloud Run pool whose worker image Cloud Build makes from ./Dockerfile, a key file instead of ADC, and the
refusals, each naming the option to fix.
"""

from __future__ import annotations

import json

import pytest
from prefect.client.orchestration import get_client
from prefect_gcp import GcpCredentials

from blocks.target import GcpTarget
from tests.support.bootstrap import bootstrap, unique
from tests.support.cloud_run_job import key_file_block_data

RUNNER_ELSEWHERE = "flow-runner@shared-ci-project.iam.gserviceaccount.com"


def test_a_cloud_run_pool_gets_the_worker_image_built_from_the_dockerfile(
    sandbox, endpoints, cloud_run_pool, capsys, iam_propagated, reachable_prefect_api
):
    name, credentials = unique("prod"), unique("creds")
    args = ["--name", name, "--credentials-block", credentials, "--endpoints", endpoints, "--pool-type",
            "cloud-run-v2", "--build-worker-image", "--no-deploy"]  # fmt: skip
    code, out, err = bootstrap(sandbox, capsys, *args)
    assert code == 0, out + err
    [image] = [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("worker image: ")]
    target = GcpTarget.load(name)
    assert image.startswith(f"{target.region}-docker.pkg.dev/{target.project}/") and "@sha256:" in image
    assert f"work pool '{cloud_run_pool}' (cloud-run-v2): created" in out
    # The jobs' identity exists, and the owner is told which roles to grant it.
    runner = f"pipeline-runner@{target.project}.iam.gserviceaccount.com"
    assert f"service account {runner}: created" in out
    member = f"--member=serviceAccount:{runner}"
    assert f"gcloud projects add-iam-policy-binding {target.project} {member} --role=roles/run.admin" in out
    with get_client(sync_client=True) as client:
        pool = client.read_work_pool(cloud_run_pool)
        block = client.read_block_document_by_name(credentials, block_type_slug="gcp-credentials")
    defaults = {key: value.get("default") for key, value in pool.base_job_template["variables"]["properties"].items()}
    assert pool.type == "cloud-run-v2"
    assert defaults["image"] == image and defaults["region"] == target.region
    assert defaults["credentials"] is None  # ADC: the worker's own identity (a key file is referenced, below)
    assert block.data  # saved all the same: the GcpTarget nests it
    # Again: the image is found by its content tag (no build), and nothing else changes.
    code, again, err = bootstrap(sandbox, capsys, *args)
    assert code == 0, again + err
    assert f"worker image: {image}" in again and f"service account {runner}: found" in again
    assert f"work pool '{cloud_run_pool}' (cloud-run-v2): unchanged" in again
    assert again.count(": unchanged") == 3, again  # credentials, target, pool


def test_a_cloud_run_pool_without_an_image_is_refused_naming_the_options(
    sandbox, endpoints, capsys, reachable_prefect_api
):
    code, _out, err = bootstrap(sandbox, capsys, "--name", unique("prod"), "--endpoints", endpoints,
                               "--pool-type", "cloud-run-v2", "--no-deploy")  # fmt: skip
    assert code == 2
    assert "--worker-image" in err and "--build-worker-image" in err


def test_a_key_file_is_stored_in_the_credentials_block_the_target_and_the_pool_use(
    sandbox, endpoints, capsys, tmp_path, cloud_run_pool, reachable_prefect_api
):
    key = tmp_path / "key.json"
    key.write_text(json.dumps(key_file_block_data("sandbox-project")["service_account_info"]))
    name, credentials = unique("prod"), unique("creds")
    image = "us-central1-docker.pkg.dev/sandbox-project/vllm-images/hf-cloudrun-pipeline:v1"
    code, out, err = bootstrap(sandbox, capsys, "--name", name, "--credentials-block", credentials, "--key-file",
                               str(key), "--endpoints", endpoints, "--pool-type", "cloud-run-v2", "--worker-image",
                               image, "--worker-service-account", RUNNER_ELSEWHERE, "--no-deploy")  # fmt: skip
    assert code == 0, out + err
    assert f"GcpCredentials '{credentials}': created" in out and "BEGIN PRIVATE KEY" not in out
    # The team's own image: bootstrap cannot tell whether it holds this tree, says so, and goes on.
    assert f"warning: work pool 'hf-pipeline' runs {image}: whether it holds this tree" in err
    # An account of another project is not bootstrap's to make (nor, with a made-up key, could it call IAM): only
    # the grants are printed.
    assert "service account" not in out and f"--member=serviceAccount:{RUNNER_ELSEWHERE} --role=roles/run.admin" in out
    saved = GcpCredentials.load(credentials)
    assert saved.service_account_info.get_secret_value()["client_email"].startswith("pipeline-runner@")
    target = GcpTarget.load(name)
    assert target.gcp_credentials.service_account_info == saved.service_account_info
    assert target.endpoints.run == sandbox.info["target"]["endpoints"]["run"]
    with get_client(sync_client=True) as client:
        pool = client.read_work_pool(cloud_run_pool)
        block = client.read_block_document_by_name(credentials, block_type_slug="gcp-credentials")
    properties = pool.base_job_template["variables"]["properties"]
    assert properties["image"]["default"] == image
    assert properties["service_account_name"]["default"] == RUNNER_ELSEWHERE
    assert properties["credentials"]["default"] == {"$ref": {"block_document_id": str(block.id)}}


@pytest.mark.parametrize(
    "content, problem",
    [
        ("not json", "is not a readable service account key file"),
        ('{"type": "authorized_user"}', "is not a service account key"),
    ],
)
def test_a_bad_key_file_is_refused_naming_the_option(sandbox, capsys, tmp_path, prefect_api, content, problem):
    key = tmp_path / "key.json"
    key.write_text(content)
    code, _out, err = bootstrap(sandbox, capsys, "--name", unique("prod"), "--key-file", str(key), "--no-deploy")
    assert code == 2 and "--key-file" in err and problem in err


def test_the_pools_jobs_are_sized_for_the_largest_model_file(sandbox, monkeypatch, capsys, prefect_api):
    """Bootstrap reads each model file's weights on the Hub and sizes the jobs for the largest
    (tasks/report/work_pool.py)."""
    from huggingface_hub import HfApi

    from flows.bootstrap import pool_job_size
    from flows.project import PROJECT_DIR
    from tasks.report.work_pool import job_size

    monkeypatch.setenv("HF_ENDPOINT", sandbox.hub_url)
    monkeypatch.setenv("HF_TOKEN", sandbox.hub_token)
    size = pool_job_size(PROJECT_DIR / "deployments" / "sandbox", 100)
    out = capsys.readouterr().out
    hub = HfApi(endpoint=sandbox.hub_url, token=sandbox.hub_token)
    weights = {
        repo: sum(
            f.size for f in hub.model_info(repo, files_metadata=True).siblings if f.rfilename.endswith(".safetensors")
        )
        for repo in ("sandbox/tiny-chat", "sandbox/tiny-llama")
    }
    assert size == job_size(max(weights.values()), 100)
    assert "tiny-chat.yaml: sandbox/tiny-chat@main" in out and "tiny-llama.yaml: sandbox/tiny-llama@main" in out
    assert f"jobs: {size.describe()}" in out
