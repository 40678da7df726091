"""How a cloud-run-v2 pool's jobs reach the Prefect API, through `python -m flows.bootstrap gcp` and doctor, against
the sandbox and a real Prefect API.

- A loopback PREFECT_API_URL is refused before anything is saved (every job would crash: the worker copies the URL
  into each job, prefect-archive/prefect-gcp#266), naming the ways out; doctor fails the pool the same way.
- A private API gets Direct VPC egress on the target's network and subnet in the pool's job body.
- A Prefect API key goes to Secret Manager, readable by the pool's job account only, and the job the worker builds
  (prefect-gcp's own ``prepare_for_flow_run``) and creates in Cloud Run holds a secret reference, never the value.
The Prefect API these tests bootstrap against is the harness relayed to this host's own address
(``reachable_prefect_api``), as a team's server is on a private or public address.
"""

from __future__ import annotations

import argparse
import json
import uuid
from pathlib import Path

import pytest
import yaml
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from googleapiclient import discovery
from prefect.client.orchestration import get_client
from prefect.exceptions import ObjectNotFound
from prefect.settings import PREFECT_API_KEY, PREFECT_API_URL, temporary_settings

from blocks.target import GcpTarget
from flows.bootstrap import ensure_pool
from flows.doctor import doctor
from tasks.checks.doctor import DoctorFailed, check_prefect_api
from tasks.common import clients
from tasks.infra.access import SECRET_ACCESSOR
from tasks.report.work_pool import cloud_run_base_job_template, ensure_work_pool
from tests.support.bootstrap import bootstrap, unique
from tests.support.cloud_run_job import prepare_job, problems

ROOT = Path(__file__).resolve().parents[2]
PREFECT_YAML = yaml.safe_load((ROOT / "prefect.yaml").read_text())
# An image the sandbox's Cloud Run knows (a public one), so the rendered job can really be created.
IMAGE = "us-docker.pkg.dev/vertex-ai/vertex-vision-model-garden-dockers/pytorch-vllm-serve:20250312_0916_RC01"
POOL = "hf-pipeline"  # prefect.yaml's definitions.work_pools.pipeline


def pool_template(name: str) -> dict:
    with get_client(sync_client=True) as client:
        return client.read_work_pool(name).base_job_template


def worker_job(template: dict) -> dict:
    """The jobs.create body prefect-gcp's worker builds for a flow run of the first deployment (its own code)."""
    configuration, _ = prepare_job(PREFECT_YAML["deployments"][0], template, {}, PREFECT_YAML.get("pull", []), POOL,
                                   api_url=None)  # fmt: skip
    return configuration.job_body


def created_job(sandbox, target: GcpTarget, body: dict) -> dict:
    """``body`` created as a Cloud Run job with the worker's own client (discovery ``run`` v2), read back."""
    options = ClientOptions(api_endpoint=sandbox.info["control_url"])
    jobs = discovery.build("run", "v2", client_options=options, credentials=AnonymousCredentials())
    jobs = jobs.projects().locations().jobs()
    job_id = unique("prefect-job")
    jobs.create(parent=target.location_path, jobId=job_id, body=body).execute()
    name = f"{target.location_path}/jobs/{job_id}"
    try:
        return jobs.get(name=name).execute()
    finally:
        jobs.delete(name=name).execute()


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_a_loopback_api_url_is_refused_for_a_cloud_run_pool_before_anything_is_saved(
    sandbox, endpoints, capsys, cloud_run_pool, host
):
    url = PREFECT_API_URL.value().replace("127.0.0.1", host)  # the harness: a server on this machine
    name = unique("prod")
    with temporary_settings({PREFECT_API_URL: url}):
        code, out, err = bootstrap(sandbox, capsys, "--name", name, "--endpoints", endpoints,
                                   "--pool-type", "cloud-run-v2", "--worker-image", IMAGE, "--no-deploy")  # fmt: skip
    assert code == 2 and out == ""
    assert err.startswith(f"error: PREFECT_API_URL is {url}: "), err
    assert "Prefect Cloud" in err and "private address in the target's VPC" in err and "--pool-type process" in err
    with get_client(sync_client=True) as client:
        with pytest.raises(ObjectNotFound):
            client.read_work_pool(cloud_run_pool)
        with pytest.raises(ObjectNotFound):
            client.read_block_document_by_name(name, block_type_slug=GcpTarget.get_block_type_slug())
    # The way out the message names: the same server runs a process pool (flow runs beside the worker).
    with temporary_settings({PREFECT_API_URL: url}):
        code, out, err = bootstrap(sandbox, capsys, "--name", name, "--endpoints", endpoints, "--no-deploy")
    assert code == 0, out + err
    assert f"work pool '{cloud_run_pool}' (process): created" in out


def test_a_private_api_gets_direct_vpc_egress_on_the_targets_network(
    sandbox, sandbox_target, cloud_run_pool, capsys, iam_propagated
):
    n = uuid.uuid4().hex[:6]
    target = sandbox_target.model_copy(update={"network": f"prefect-net-{n}", "subnet": f"prefect-subnet-{n}"})
    args = argparse.Namespace(name="production", worker_image=IMAGE, build_worker_image=False,
                              worker_service_account=None, staging_mb_s=100.0, credentials_block="pipeline",
                              key_file=None)  # fmt: skip
    # What bootstrap gcp does once require_reachable_api found PREFECT_API_URL at a private address (10.x, ...).
    assert ensure_pool(cloud_run_pool, "cloud-run-v2", target, args, "private") == "created"
    out = capsys.readouterr().out
    assert f"network projects/{target.project}/global/networks/{target.network}: created" in out
    assert f"subnet projects/{target.project}/regions/{target.region}/subnetworks/{target.subnet}: created" in out
    egress = {"networkInterfaces": [{"network": target.network, "subnetwork": target.subnet}],
              "egress": "PRIVATE_RANGES_ONLY"}  # fmt: skip
    template = pool_template(cloud_run_pool)
    assert template["job_configuration"]["job_body"]["template"]["template"]["vpcAccess"] == egress
    # The worker's job keeps it, run.v2's schema holds it, and Cloud Run creates the job with it.
    body = worker_job(template)
    assert body["template"]["template"]["vpcAccess"] == egress
    assert problems(body) == []
    job = created_job(sandbox, target, body)
    assert job["template"]["template"]["vpcAccess"]["networkInterfaces"] == egress["networkInterfaces"]
    # Again: the network and subnet are found, the pool is unchanged.
    assert ensure_pool(cloud_run_pool, "cloud-run-v2", target, args, "private") == "unchanged"
    assert f"networks/{target.network}: found" in capsys.readouterr().out


def test_a_prefect_api_key_goes_to_secret_manager_and_the_job_gets_a_reference(
    sandbox, sandbox_target, endpoints, capsys, cloud_run_pool, iam_propagated, reachable_prefect_api
):
    key = f"pnu_{uuid.uuid4().hex}"
    args = ["--name", unique("prod"), "--endpoints", endpoints, "--pool-type", "cloud-run-v2", "--worker-image", IMAGE,
            "--no-deploy"]  # fmt: skip
    with temporary_settings({PREFECT_API_KEY: key}):  # as `prefect cloud login` leaves it, or the environment
        code, out, err = bootstrap(sandbox, capsys, *args)
        assert code == 0, out + err
        code, again, err_again = bootstrap(sandbox, capsys, *args)
        assert code == 0, again + err_again
        # The worker runs with the key in its settings too: prefect-gcp drops the plain value for the reference.
        body = worker_job(pool_template(cloud_run_pool))
    target = sandbox_target
    secret = f"projects/{target.project}/secrets/prefect-api-key"
    runner = f"pipeline-runner@{target.project}.iam.gserviceaccount.com"
    assert key not in out + err + again + err_again
    assert f"secret {secret} (from PREFECT_API_KEY): created; secretAccessor for {runner}: granted" in out
    assert f"secret {secret} (from PREFECT_API_KEY): unchanged; secretAccessor for {runner}: already held" in again
    assert f"work pool '{cloud_run_pool}' (cloud-run-v2): unchanged" in again

    manager = clients.secret_manager(target)
    assert manager.access_secret_version(name=f"{secret}/versions/latest").payload.data == key.encode()
    policy = manager.get_iam_policy(request={"resource": secret})
    assert [list(b.members) for b in policy.bindings if b.role == SECRET_ACCESSOR] == [[f"serviceAccount:{runner}"]]

    template = pool_template(cloud_run_pool)
    reference = {"secret": secret, "version": "latest"}
    assert template["variables"]["properties"]["prefect_api_key_secret"]["default"] == reference
    assert key not in json.dumps(template)
    env = body["template"]["template"]["containers"][0]["env"]
    assert {"name": "PREFECT_API_KEY", "valueSource": {"secretKeyRef": reference}} in env
    assert key not in json.dumps(body)
    # What anyone with run.jobs.get reads from the created job: the reference, not the key.
    job = created_job(sandbox, target, body)
    [api_key] = [e for e in job["template"]["template"]["containers"][0]["env"] if e["name"] == "PREFECT_API_KEY"]
    assert api_key["valueSource"]["secretKeyRef"]["secret"] == secret
    assert key not in json.dumps(job)


# doctor ---------------------------------------------------------------------------------------------------------
def doctor_target(sandbox_target: GcpTarget) -> GcpTarget:
    """The sandbox target with a bucket and service account of its own (neither exists yet), as doctor's tests."""
    n = uuid.uuid4().hex[:6]
    return sandbox_target.model_copy(update={"bucket": f"doctor-api-{n}", "service_account_name": f"doctor-api-{n}"})


def test_doctor_fails_a_cloud_run_pool_whose_jobs_cannot_reach_a_loopback_api(sb, sandbox_target, cloud_run_pool):
    target = doctor_target(sandbox_target)
    ensure_work_pool(cloud_run_pool, "cloud-run-v2", cloud_run_base_job_template(target, IMAGE, credentials_block=None))
    row = check_prefect_api(cloud_run_pool, target)
    assert row.status == "fail"
    assert row.detail.startswith(f"PREFECT_API_URL is {PREFECT_API_URL.value()}: ")
    assert "Prefect Cloud" in row.detail and "--pool-type process" in row.detail
    assert "PREFECT_API_URL" in row.fix and "--pool-type process" in row.fix
    # The doctor flow fails on that row.
    target.save("doctor-prefect-api", overwrite=True)
    with pytest.raises(DoctorFailed) as failed:
        doctor(target="doctor-prefect-api", profile="l4")
    assert "Prefect API" in [c.name for c in failed.value.checks]


def test_doctor_passes_a_reachable_api_and_warns_of_a_key_the_pool_would_copy_in_plain_text(
    sandbox_target, cloud_run_pool, reachable_prefect_api
):
    ensure_work_pool(cloud_run_pool, "cloud-run-v2", cloud_run_base_job_template(sandbox_target, IMAGE,
                                                                                 credentials_block=None))  # fmt: skip
    row = check_prefect_api(cloud_run_pool, sandbox_target)
    assert row.status == "ok" and reachable_prefect_api in row.detail
    key = f"pnu_{uuid.uuid4().hex}"
    with temporary_settings({PREFECT_API_KEY: key}):
        row = check_prefect_api(cloud_run_pool, sandbox_target)
    assert row.status == "warn" and "PREFECT_API_KEY would be copied in plain text" in row.detail
    assert "bootstrap gcp" in row.fix and key not in row.model_dump_json()
    # No pool at all: nothing to check yet.
    with get_client(sync_client=True) as client:
        client.delete_work_pool(cloud_run_pool)
    assert check_prefect_api(cloud_run_pool, sandbox_target).status == "ok"
