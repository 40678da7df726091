"""First runs the way they go on a real project: a brand-new service account, and runtime Hub access."""

from __future__ import annotations

import itertools

import pytest

from blocks import ServingProfile
from flows.promote import promote_model
from tasks.common import clients
from tasks.deploy.probe import VerifyOptions
from tasks.infra import access, ensure
from tests.support.delivery import NO_WATCH
from tests.support.run_log import run_logs

pytestmark = pytest.mark.prefect
FAST = VerifyOptions(health_period_s=0.05)
_ids = itertools.count()


def promote(service: str, **kwargs):
    return promote_model(model="sandbox/tiny-chat", service=service, token_secret_block="sandbox-hf-token",
                         verify=FAST, **{"watch": NO_WATCH, **kwargs})  # fmt: skip


def test_the_first_promotion_with_a_new_service_account_waits_for_iam(sb, flow_env, iam_propagation):
    """ensure infrastructure creates the account and grants it the bucket at once; the grant waits for IAM."""
    n = next(_ids)
    target = flow_env.model_copy(update={"service_account_name": f"first-run-sa-{n}"})
    target.save(f"e2e-first-run-{n}", overwrite=True)
    iam_propagation(200)  # 2 s at the default clock: the grant right after the create certainly meets it
    since = sb.last_request_seq()
    report = promote(f"e2e-first-run-{n}", target=f"e2e-first-run-{n}")
    assert report.outcome == "promoted", report.reason
    revision = clients.run_revisions(target).get_revision(
        name=f"{target.location_path}/services/e2e-first-run-{n}/revisions/{report.serving_revision}"
    )
    assert revision.service_account == target.service_account_email
    bucket_iam = f"/storage/v1/b/{target.bucket_name}/iam"
    puts = [r["status"] for r in sb.requests("gcs", since=since) if r["method"] == "PUT" and r["path"] == bucket_iam]
    assert puts[0] == 400 and puts[-1] == 200  # "does not exist" while IAM propagated, then granted


@pytest.mark.parametrize("grant_s", [120, 420], ids=["grants-typical", "grants-worst-case"])
def test_a_first_promotion_waits_through_googles_worst_case_for_a_new_account_and_logs_each_wait(
    sb, flow_env, iam_propagation, grant_propagation, grant_s
):
    """Google's IAM docs: "typically 2 minutes, potentially 7 minutes or longer". A new account unknown to other
    APIs for 7 simulated minutes and every role grant taking 2 (typical) or 7 (worst case): the promotion still
    succeeds (the waits' deadline is above the worst case) and says at each wait what it waits for."""
    n = next(_ids)
    target = flow_env.model_copy(update={"service_account_name": f"slow-iam-sa-{n}"})
    target.save(f"e2e-slow-iam-{n}", overwrite=True)
    iam_propagation(420)
    grant_propagation(grant_s)
    with run_logs() as log:
        report = promote(f"e2e-slow-iam-{n}", target=f"e2e-slow-iam-{n}")
    assert report.outcome == "promoted", report.reason
    waits = [line for line in log.lines if "is not visible to" in line and "(IAM propagation" in line]
    email = target.service_account_email
    assert any(line.startswith(f"service account {email}, or its new grant, is not visible to Cloud Storage")
               for line in waits), log.text()[-3000:]  # fmt: skip
    # Waited for the whole window at the first call that names the account (how many tries that took depends on the
    # machine's speed): later steps found it visible.
    assert not any("is not visible to Cloud Run" in line for line in waits), waits


def test_a_revision_whose_secret_grant_has_not_propagated_is_deployed_again_once_it_has(
    sb, flow_env, grant_propagation
):
    """The serving account gets its secret (the Hub token, hf_token_at_runtime) in the ensure step; a grant takes
    minutes to count, so the first revision cannot read it and fails ("Permission denied on secret ... for Revision
    service account"). The deploy is made again, logged, until the grant counts; the promotion succeeds."""
    n = next(_ids)
    target = flow_env.model_copy(update={"service_account_name": f"secret-wait-sa-{n}",
                                         "hf_token_secret": f"secret-wait-token-{n}"})  # fmt: skip
    target.save(f"e2e-secret-wait-{n}", overwrite=True)
    ServingProfile.preset("l4", hf_token_at_runtime=True).save("e2e-secret-wait", overwrite=True)
    grant_propagation(500)  # 5 s at the default clock: longer than staging and the image take here
    with run_logs() as log:
        report = promote(f"e2e-secret-wait-{n}", target=f"e2e-secret-wait-{n}", profile="e2e-secret-wait")
    assert report.outcome == "promoted", report.reason
    assert any("cannot read its secret yet" in line for line in log.lines), log.text()[-3000:]
    waits = [line for line in log.lines if "cannot read its secret yet" in line]
    assert len(waits) >= 2, waits  # several tries, each logged: 5 s of propagation, retries from 1 s up


def test_a_revision_that_cannot_mount_its_weights_bucket_yet_is_deployed_again_once_the_grant_counts(
    sb, flow_env, grant_propagation
):
    """The serving account is granted the weights bucket in the ensure step and the revision mounts it moments later:
    until the grant counts the volume never mounts (gcsfuse v3's GetStorageLayout refusal, which names the bucket but
    neither the account nor a permission). The run's own grant, within its deadline, makes the deploy be made again,
    logged, until it mounts."""
    n = next(_ids)
    target = flow_env.model_copy(update={"service_account_name": f"mount-wait-sa-{n}"})
    target.save(f"e2e-mount-wait-{n}", overwrite=True)
    grant_propagation(2000)  # 20 s at the default clock: far longer than the steps from the grant to the deploy
    with run_logs() as log:
        report = promote(f"e2e-mount-wait-{n}", target=f"e2e-mount-wait-{n}")
    assert report.outcome == "promoted", report.reason
    waits = [line for line in log.lines if f"may not mount gs://{target.bucket_name} yet: this run granted it" in line]
    assert waits and all(target.service_account_email in line for line in waits), log.text()[-3000:]
    revision = clients.run_revisions(target).get_revision(
        name=f"{target.location_path}/services/e2e-mount-wait-{n}/revisions/{report.serving_revision}"
    )
    assert [v.gcs.bucket for v in revision.volumes] == [target.bucket_name]  # served from the mounted bucket


def test_runtime_hub_access_reaches_the_hub_from_the_deployed_container(sb, flow_env):
    """hf_token_at_runtime with a gated Hub tokenizer: the container fetches it at start with HF_TOKEN."""
    tokenizer = "sandbox/gated-chat"
    profile = ServingProfile.preset("l4", hf_token_at_runtime=True, vllm={"extra_args": ["--tokenizer", tokenizer]})
    profile.save("e2e-runtime-hub", overwrite=True)
    service = f"e2e-runtime-hub-{next(_ids)}"
    since = sb.last_request_seq()
    report = promote(service, profile="e2e-runtime-hub")
    assert report.outcome == "promoted", report.reason
    hub = sb.requests("hub", since=since)
    fetched = [
        r for r in hub if r["path"].startswith(f"/{tokenizer}/resolve/") and "tokenizer" in r["headers"]["user-agent"]
    ]
    assert fetched and {r["headers"]["authorization"] for r in fetched} == {f"Bearer {sb.hub_token}"}
    spec = clients.run_services(flow_env).get_service(name=f"{flow_env.location_path}/services/{service}")
    assert spec.template.vpc_access.egress.name == "PRIVATE_RANGES_ONLY"
    assert "HF_HUB_OFFLINE" not in {e.name for e in spec.template.containers[0].env}


@pytest.mark.usefixtures("iam_propagated")
def test_a_revision_that_cannot_write_its_compile_cache_yet_is_deployed_again_once_the_grant_counts(
    sb, flow_env, grant_propagation
):
    """An account that already reads the bucket gets, in the ensure step, the right to write compile caches there; the
    revision starts moments later and vLLM, unable to create its cache folder, fails to start. The run's own grant,
    within its deadline, makes the deploy be made again, logged, until vLLM can write."""
    n = next(_ids)
    target = flow_env.model_copy(update={"service_account_name": f"cache-wait-sa-{n}"})
    target.save(f"e2e-cache-wait-{n}", overwrite=True)
    ensure.ensure_bucket(target)
    ensure.ensure_service_account(target)
    grant_propagation(2000)  # 20 s at the default clock: a grant counts long after the deploy right after it
    access.grant_bucket_object_viewer(target)
    assert sb.settle_grants() >= 1  # granted long ago: it already serves an eager model, so its read access counts
    cached = ServingProfile.preset("l4", compile_cache=True, vllm={"enforce_eager": False})
    cached.save("e2e-cache-wait", overwrite=True)
    with run_logs() as log:
        report = promote(f"e2e-cache-wait-{n}", target=f"e2e-cache-wait-{n}", profile="e2e-cache-wait")
    assert report.outcome == "promoted", report.reason
    waits = [line for line in log.lines if f"may not write its compile cache in gs://{target.bucket_name} yet" in line]
    assert waits and all(target.service_account_email in line for line in waits), log.text()[-3000:]
