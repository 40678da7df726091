"""The network rule of Direct VPC egress, enforced: runtime Hub access works only where egress reaches the internet.

Each service is rendered by the product's own render_service for a profile with hf_token_at_runtime and a gated
Hub tokenizer, then deployed with the raw Cloud Run client: the current rendering (PRIVATE_RANGES_ONLY, online)
starts and its container fetches the tokenizer from the Hub; the old rendering (ALL_TRAFFIC through a VPC with
no Cloud NAT) dies at start the way vLLM does without internet.
"""

from __future__ import annotations

import itertools

import pytest
from google.api_core import exceptions as gexc
from google.cloud import run_v2
from pydantic import SecretStr

from blocks import ModelSource, ServingProfile
from tasks.common import clients
from tasks.deploy.render import Weights, render_service
from tasks.deploy.revision_logs import revision_log_tail
from tasks.infra import access, ensure
from tests.support.models import tiny_model_files, upload_model

# Raw calls grant the bucket and the secret, with no product wait for their propagation.
pytestmark = pytest.mark.usefixtures("grants_propagated")

_ids = itertools.count()
TOKENIZER = "sandbox/gated-chat"  # gated: only HF_TOKEN (the sandbox token) opens it
COMMIT = "0123456789abcdef0123456789abcdef01234567"
ALL_TRAFFIC = run_v2.VpcAccess.VpcEgress.ALL_TRAFFIC


@pytest.fixture(scope="module")
def setup(sandbox, sandbox_target):
    """Bucket with weights, VPC, serving account with access to the bucket and to the Hub token's secret."""
    target = sandbox_target.model_copy(
        update={
            "bucket": "runtime-hub-weights",
            "network": "runtime-hub-vpc",
            "subnet": "runtime-hub-subnet",
            "service_account_name": "runtime-hub-sa",
            "hf_token_secret": "runtime-hub-token",
        }
    )
    for step in (ensure.ensure_bucket, ensure.ensure_network, ensure.ensure_subnet, ensure.ensure_service_account):
        step(target)
    ensure.ensure_secret(target, SecretStr(sandbox.hub_token))
    access.grant_bucket_object_viewer(target)  # these wait for IAM to propagate the new account
    access.grant_secret_accessor(target)
    source = ModelSource(repo_id="sandbox/tiny-chat")
    prefix = f"{target.model_prefix}/{source.repo_id}/{COMMIT}"
    files = tiny_model_files()
    upload_model(clients.storage(target), target.bucket_name, prefix, files)
    weights = Weights(source.repo_id, COMMIT, target.bucket_name, prefix, sum(len(d) for d in files.values()))
    profile = ServingProfile.preset(
        "l4",
        hf_token_at_runtime=True,
        vllm={"max_model_len": 1024, "max_num_seqs": 8, "extra_args": ["--tokenizer", TOKENIZER]},
    )
    return target, profile, source, weights


def rendered(setup, service_id: str) -> run_v2.Service:
    target, profile, source, weights = setup
    return render_service(profile, target, source, weights, profile.image or "", f"{service_id}-r1")


def deploy(target, service_id: str, spec: run_v2.Service) -> run_v2.Service:
    operation = clients.run_services(target).create_service(
        parent=target.location_path, service=spec, service_id=service_id
    )
    return operation.result(timeout=120, polling=clients.operation_polling(target))


def tokenizer_fetches(sb, since: int) -> list[dict]:
    return [
        r
        for r in sb.requests("hub", since=since)
        if r["path"].startswith(f"/{TOKENIZER}/resolve/")
        and "file_type/tokenizer" in r["headers"].get("user-agent", "")
    ]


def test_runtime_hub_access_renders_egress_that_reaches_the_hub(sb, setup):
    target = setup[0]
    service_id = f"egress-hub-{next(_ids)}"
    spec = rendered(setup, service_id)
    assert spec.template.vpc_access.egress == run_v2.VpcAccess.VpcEgress.PRIVATE_RANGES_ONLY
    since = sb.last_request_seq()
    service = deploy(target, service_id, spec)
    assert service.latest_ready_revision.endswith(f"{service_id}-r1")
    fetched = tokenizer_fetches(sb, since)
    assert {r["path"].rsplit("/", 1)[1] for r in fetched} >= {"tokenizer_config.json", "config.json"}
    assert {r["headers"]["authorization"] for r in fetched} == {f"Bearer {sb.hub_token}"}  # HF_TOKEN, from the secret
    assert {r["status"] for r in fetched} <= {200, 302}


def test_the_old_rendering_all_traffic_without_cloud_nat_cannot_reach_the_hub(sb, setup):
    target = setup[0]
    sb.run("POST", "/idle")  # the module's earlier service, idle, holds no memory: a new project holds one L4
    service_id = f"egress-hub-{next(_ids)}"
    spec = rendered(setup, service_id)
    spec.template.vpc_access.egress = ALL_TRAFFIC  # what the renderer sent before issue 12
    since = sb.last_request_seq()
    with pytest.raises(gexc.GoogleAPICallError, match=f"Revision '{service_id}-r1' is not ready"):
        deploy(target, service_id, spec)
    assert tokenizer_fetches(sb, since) == []  # nothing left the VPC
    log = "\n".join(revision_log_tail(target, service_id, f"{service_id}-r1", 60))
    assert "Retrying in 8s [Retry 5/5]." in log  # huggingface_hub gave up after its retries...
    assert "huggingface_hub.errors.LocalEntryNotFoundError" in log
    assert (
        f"OSError: We couldn't connect to 'https://huggingface.co' to load this file, couldn't find it in the cached "
        f"files and it looks like {TOKENIZER} is not the path to a directory containing a file named "
        "tokenizer_config.json." in log
    )  # ...and vLLM died the way it does without internet


def test_runtime_hub_access_in_offline_mode_fails_the_same_way_without_a_request(sb, setup):
    target = setup[0]
    sb.run("POST", "/idle")  # the module's earlier service, idle, holds no memory: a new project holds one L4
    service_id = f"egress-hub-{next(_ids)}"
    spec = rendered(setup, service_id)
    spec.template.containers[0].env.append(run_v2.EnvVar(name="HF_HUB_OFFLINE", value="1"))  # the old default
    since = sb.last_request_seq()
    with pytest.raises(gexc.GoogleAPICallError, match=f"Revision '{service_id}-r1' is not ready"):
        deploy(target, service_id, spec)
    assert tokenizer_fetches(sb, since) == []
    log = "\n".join(revision_log_tail(target, service_id, f"{service_id}-r1", 60))
    assert "outgoing traffic has been disabled" in log and "OSError: We couldn't connect" in log
