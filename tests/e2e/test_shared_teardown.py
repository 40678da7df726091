"""A teardown of one service never breaks another: the serving account, the weights bucket (and the commits staged in
it), the network, the Hub token secret and the registry serve every service on the target (issue 33: a teardown of
svc-a with service_account and staged_weights deleted svc-b's account and weights, and svc-b answered 503 at its next
cold start)."""

from __future__ import annotations

import itertools

import httpx
import pytest

from blocks import GcpTarget, ServingProfile
from flows.teardown import teardown
from tasks.common import clients
from tests.support.artifacts import artifact
from tests.support.promotion import promote, run_service

pytestmark = pytest.mark.prefect
_ids = itertools.count()
EVERYTHING = dict.fromkeys(
    ("network", "service_account", "secret", "staged_weights", "build_bucket", "artifact_repository", "reports"), True
)


@pytest.fixture
def shared_target(flow_env) -> tuple[str, GcpTarget, str]:
    """A target of its own (account, bucket, network, secret, registry), saved under a name, and a profile whose
    services read the Hub token from Secret Manager: every shared kind of resource is in use."""
    n = next(_ids)
    name = f"shared-{n}"
    gcp = GcpTarget.model_validate({
        **flow_env.model_dump(), "network": f"sh-net-{n}", "subnet": f"sh-subnet-{n}",
        "service_account_name": f"sh-serving-{n}", "build_service_account_name": f"sh-build-{n}",
        "hf_token_secret": f"sh-token-{n}", "bucket": f"sh-weights-{n}", "build_bucket": f"sh-builds-{n}",
        "artifact_repository": f"sh-images-{n}",  # not the session's: teardown deletes it
    })  # fmt: skip
    gcp.save(name, overwrite=True)
    profile = f"sh-runtime-token-{n}"
    ServingProfile.preset("l4", hf_token_at_runtime=True).save(profile, overwrite=True)
    return name, gcp, profile


def staged(gcp: GcpTarget) -> set[str]:
    """The commit folders in the weights bucket (gs://bucket/model-cache/ORG/NAME/COMMIT)."""
    names = (b.name for b in clients.storage(gcp).list_blobs(gcp.bucket_name, prefix="model-cache/"))
    return {"/".join(name.split("/")[:4]) for name in names}  # the reports/ beside them are no weights


def chat(gcp: GcpTarget, service: str) -> httpx.Response:
    url = run_service(gcp, service).uri
    token = clients.identity_token(gcp, url).get_secret_value()
    body = {"model": "sandbox/tiny-chat", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {token}"},
                      timeout=180)  # fmt: skip


@pytest.mark.usefixtures("raised_quota")  # two L4 services at once, and a candidate beside one (64 GiB of 40)
def test_a_teardown_of_one_service_with_every_option_leaves_the_other_serving(sb, shared_target, ip_hold):
    target, gcp, profile = shared_target
    svc_a, svc_b = f"shared-a-{next(_ids)}", f"shared-b-{next(_ids)}"
    only_a = promote(svc_a, revision="dev", target=target, profile=profile)
    both = promote(svc_a, revision="main", target=target, profile=profile)
    b = promote(svc_b, revision="main", target=target, profile=profile)
    assert [r.outcome for r in (only_a, both, b)] == ["promoted"] * 3
    commits = staged(gcp)
    assert len(commits) == 2, commits  # main (both services) and dev (svc-a's earlier revision only)
    dev_prefix = next(c for c in commits if c.endswith(only_a.commit))
    main_prefix = next(c for c in commits if c.endswith(b.commit))

    results = teardown(service=svc_a, target=target, **EVERYTHING)
    actions = {(r.kind, r.name): (r.action, " ".join(r.changes)) for r in results}
    assert actions[("service", f"{gcp.location_path}/services/{svc_a}")][0] == "deleted"
    shared = [("service-account", gcp.service_account_email), ("secret", gcp.hf_token_secret),
              ("network", f"projects/{gcp.project}/global/networks/{gcp.network}"),
              ("subnet", f"projects/{gcp.project}/regions/{gcp.region}/subnetworks/{gcp.subnet}")]  # fmt: skip
    for kind, name in shared:
        action, why = actions[(kind, name)]
        assert action == "kept" and svc_b in why, (kind, action, why)  # named: the service that still needs it
    bucket_action, bucket_why = actions[("bucket", f"gs://{gcp.bucket_name}")]
    assert bucket_action == "kept" and f"deleted gs://{gcp.bucket_name}/{dev_prefix}" in bucket_why
    assert f"kept gs://{gcp.bucket_name}/{main_prefix}: {svc_b}" in bucket_why
    assert staged(gcp) == {main_prefix}  # svc-a's own commit went; the one svc-b serves stayed
    text = artifact(f"teardown-{svc_a}")
    assert "| service-account |" in text and "| kept |" in text and svc_b in text

    # svc-b's next cold start: a new instance mounts the bucket as the account, reads its weights and its secret.
    stopped = sb.run("POST", "/idle")["stopped"]
    assert any(f"/services/{svc_b}/" in name for name in stopped), stopped
    answer = chat(gcp, svc_b)
    assert answer.status_code == 200, answer.text[-2000:]
    assert answer.json()["choices"][0]["message"]["content"]

    # The last service's teardown deletes what is left: nothing else uses it any more.
    ip_hold(0)  # as if Cloud Run had released the subnet's IPs (test_teardown_network_hold.py covers the hold)
    last = teardown(service=svc_b, target=target, **EVERYTHING)
    # its reports: "deleted" once promotions archive theirs (tasks/report/archive.py), "absent" otherwise
    assert {(r.kind, r.action) for r in last if r.action != "absent" and r.kind != "reports"} == {
        ("service", "deleted"), ("subnet", "deleted"), ("network", "deleted"), ("service-account", "deleted"),
        ("secret", "deleted"), ("bucket", "deleted"),
    }  # fmt: skip
    assert clients.storage(gcp).lookup_bucket(gcp.bucket_name) is None


def test_staged_weights_of_a_commit_staged_for_no_service_keep_the_bucket(sb, shared_target, ip_hold):
    """Weights staged by a promotion that has not deployed yet (or failed) are no service's: a teardown keeps them,
    and the bucket with them, saying so."""
    target, gcp, profile = shared_target
    service = f"shared-c-{next(_ids)}"
    promote(service, revision="main", target=target, profile=profile)
    clients.storage(gcp).bucket(gcp.bucket_name).blob("model-cache/other/model/0123/config.json").upload_from_string(
        "{}"
    )
    ip_hold(0)
    results = teardown(service=service, target=target, staged_weights=True)
    (bucket,) = [r for r in results if r.kind == "bucket"]
    assert bucket.action == "kept" and "staged for no service" in " ".join(bucket.changes)
    assert staged(gcp) == {"model-cache/other/model/0123"}
