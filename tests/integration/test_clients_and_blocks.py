"""The client module reaches the sandbox through real clients; blocks round-trip through a Prefect API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from google.cloud import run_v2
from pydantic import SecretStr

from blocks import GcpTarget, ModelSource, ServingProfile
from blocks.target import ApiEndpoints
from tasks.common import clients
from tests.support.cloud_run_job import key_file_block_data

ROOT = Path(__file__).resolve().parents[2]
# `python -m flows.bootstrap ARGS` with an audit hook that records every host the process resolves or connects to.
RUN_WATCHING_THE_NETWORK = """
import atexit, json, runpy, sys
reached = []
def hook(event, args):
    if event == "socket.connect" and isinstance(args[1], tuple):
        reached.append([str(args[1][0]), args[1][1]])
    elif event == "socket.getaddrinfo":
        reached.append([str(args[0]), args[1]])
sys.addaudithook(hook)
report, sys.argv = sys.argv[1], ["flows.bootstrap", *sys.argv[2:]]
atexit.register(lambda: open(report, "w").write(json.dumps(reached)))
runpy.run_module("flows.bootstrap", run_name="__main__", alter_sys=True)
"""


def test_storage_client_from_the_target_reaches_the_emulator(sandbox_target):
    storage = clients.storage(sandbox_target)
    bucket = storage.create_bucket("clients-test-bucket", location=sandbox_target.region)
    bucket.blob("a/b.txt").upload_from_string(b"staged")
    assert storage.bucket("clients-test-bucket").blob("a/b.txt").download_as_bytes() == b"staged"
    assert storage.get_bucket("clients-test-bucket").location == sandbox_target.region.upper()


def test_run_client_from_the_target_reaches_the_control_plane(sb, sandbox_target):
    since = sb.last_request_seq()
    listed = clients.run_services(sandbox_target).list_services(parent=sandbox_target.location_path)
    assert isinstance(list(listed), list)
    calls = sb.requests("control", since=since)
    assert [c["path"] for c in calls] == [f"/v2/{sandbox_target.location_path}/services"]
    assert "authorization" not in calls[0]["headers"]  # anonymous credentials send nothing


def test_real_target_uses_googles_endpoints():
    target = GcpTarget(project="acme-ml-prod", region="us-central1")
    assert clients.client_options(target, "run") is None
    assert clients.operation_polling(target) is clients.polling.DEFAULT_POLLING


def test_hub_access_from_a_model_source_uses_its_endpoint_and_token(sb):
    source = ModelSource(repo_id="sandbox/tiny-chat", hub_endpoint=sb.hub_url)
    access = clients.hub(source, SecretStr(sb.hub_token))
    info = access.api().model_info(source.repo_id)
    assert info.id == "sandbox/tiny-chat"
    assert len(info.sha) == 40


def test_hub_token_falls_back_to_the_environment(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_fromTheEnvironment")
    token = clients.hub_token(ModelSource(repo_id="org/model"))
    assert token is not None and token.get_secret_value() == "hf_fromTheEnvironment"
    monkeypatch.delenv("HF_TOKEN")
    assert clients.hub_token(ModelSource(repo_id="org/model")) is None


@pytest.mark.prefect
def test_blocks_save_and_load_and_token_comes_from_a_secret_block(prefect_api, sandbox_target, monkeypatch):
    from prefect.blocks.system import Secret

    for block in (GcpTarget, ServingProfile, ModelSource):
        block.register_type_and_schema()  # what `prefect block register -m blocks` does
    sandbox_target.save("sandbox", overwrite=True)
    loaded = GcpTarget.load("sandbox")
    assert loaded.endpoint("run") == sandbox_target.endpoint("run")
    assert loaded.anonymous_credentials is True

    ServingProfile.preset("l4", max_instances=2).save("l4-two", overwrite=True)
    assert ServingProfile.load("l4-two").max_instances == 2

    Secret(value="hf_fromASecretBlock").save("hf-token", overwrite=True)
    monkeypatch.setenv("HF_TOKEN", "hf_fromTheEnvironment")
    token = clients.hub_token(ModelSource(repo_id="org/model", token_secret_block="hf-token"))
    assert token is not None and token.get_secret_value() == "hf_fromASecretBlock"
    assert "hf_fromASecretBlock" not in repr(token)


def test_run_v2_is_the_rest_transport(sandbox_target):
    assert clients.run_services(sandbox_target).transport.kind == "rest"
    assert isinstance(clients.run_revisions(sandbox_target), run_v2.RevisionsClient)


@pytest.mark.prefect
def test_bootstrap_for_a_real_project_saves_a_target_with_googles_endpoints(prefect_api, tmp_path):
    from prefect.settings import PREFECT_API_URL

    api_url = PREFECT_API_URL.value()
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN" and not k.startswith("GOOGLE_")}
    env |= {
        "PREFECT_API_URL": api_url,
        "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "absent.json"),  # an ADC lookup would fail, not go out
        "GCE_METADATA_HOST": "127.0.0.1:9",
        "GCE_METADATA_IP": "127.0.0.1:9",
    }
    reached_file = tmp_path / "reached.json"
    args = [sys.executable, "-c", RUN_WATCHING_THE_NETWORK, str(reached_file), "gcp", "--project", "acme-ml-prod",
            "--region", "europe-west4", "--name", "bootstrap-real", "--invoker", "group:ml-apps@example.com",
            "--credentials-block", "bootstrap-real", "--no-deploy"]  # fmt: skip
    # No ADC here: refused naming both ways to give credentials, before anything is saved.
    refused = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "gcloud auth application-default login" in refused.stderr and "--key-file" in refused.stderr
    assert "GcpTarget" not in refused.stdout
    key = tmp_path / "key.json"
    key.write_text(json.dumps(key_file_block_data("acme-ml-prod")["service_account_info"]))
    done = subprocess.run([*args, "--key-file", str(key)], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "GcpTarget 'bootstrap-real' (acme-ml-prod/europe-west4): created" in done.stdout
    server = urlsplit(api_url)
    reached = {(host, int(port)) for host, port in json.loads(reached_file.read_text())}
    assert reached and reached <= {(server.hostname, server.port), ("localhost", server.port)}, reached

    loaded = GcpTarget.load("bootstrap-real")
    assert (loaded.project, loaded.region) == ("acme-ml-prod", "europe-west4")
    assert loaded.endpoints is None and all(
        clients.client_options(loaded, api) is None for api in ApiEndpoints.model_fields
    )
    assert loaded.anonymous_credentials is False
    assert loaded.gcp_credentials.service_account_info.get_secret_value()["project_id"] == "acme-ml-prod"
    assert loaded.bucket_name == "acme-ml-prod-europe-west4-hf-model-cache"
    assert loaded.invokers == ["group:ml-apps@example.com"]
