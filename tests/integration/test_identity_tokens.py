"""Identity tokens have an audience: the sandbox's metadata server mints Google-style ID tokens and Cloud Run's
front ends check them as Cloud Run does (signature, expiry, audience, then run.routes.invoke).

The product mints its token through google-auth (``tasks.common.clients.identity_token``: ``fetch_id_token`` -> the
metadata server) with the SERVICE URL as audience, also when it probes the candidate's tag URL; a token minted for
the tag URL, for another service, or signed by another key is refused 401; no token, or a caller without
run.routes.invoke, 403.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Iterator

import httpx
import pytest
from google.api_core import exceptions
from google.cloud import run_v2
from google.protobuf import field_mask_pb2

from sandbox.identity import TokenIssuer
from tasks.common import clients
from tasks.deploy.cloudrun import Candidate, verify_candidate
from tasks.deploy.probe import VerificationFailed, VerifyOptions
from tasks.infra import ensure
from tasks.infra.propagation import when_visible
from tests.support.identity import bearer, id_token
from tests.support.models import tiny_model_files, upload_model
from tests.support.sandbox_config import sandbox_settings
from tests.support.services import SERVED_NAME, SMALLEST_L4, gpu_service, vllm_args

BUCKET = "identity-test-weights"
SERVICE_ID = "ident-svc"
REVISION_TYPE = run_v2.TrafficTargetAllocationType.TRAFFIC_TARGET_ALLOCATION_TYPE_REVISION
FAST = VerifyOptions(health_window_s=1.5, health_period_s=0.1, request_timeout_s=30)
STRANGER = "serviceAccount:stranger@sandbox-project.iam.gserviceaccount.com"


def claims(token: str) -> dict:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


@pytest.fixture(scope="module")
def service(sandbox, sandbox_target) -> Iterator[tuple[run_v2.Service, str]]:
    """A private service with a serving revision and a `candidate` tag on a second one: (service, tag URL). Both
    revisions' instances run at once: SMALLEST_L4 fits them in a new project's 40 GiB."""
    sandbox.run("POST", "/idle")  # what earlier tests left idle holds nothing: Cloud Run's idle time has passed
    # The weights bucket is granted with raw calls right before the deploys, which have no product wait for it.
    with sandbox_settings(sandbox, grant_propagation_seconds=0):
        upload_model(clients.storage(sandbox_target), BUCKET, "models/tiny", tiny_model_files())
        services = clients.run_services(sandbox_target)
        polling = clients.operation_polling(sandbox_target)
        first = services.create_service(
            parent=sandbox_target.location_path, service=gpu_service(BUCKET, **SMALLEST_L4), service_id=SERVICE_ID
        ).result(timeout=60, polling=polling)
        old = first.latest_ready_revision.rsplit("/", 1)[1]
        candidate = f"{SERVICE_ID}-candidate-1"
        spec = gpu_service(
            BUCKET,
            **SMALLEST_L4,
            args=vllm_args("--dtype=bfloat16"),
            revision=candidate,
            traffic=[
                run_v2.TrafficTarget(type_=REVISION_TYPE, revision=old, percent=100),
                run_v2.TrafficTarget(type_=REVISION_TYPE, revision=candidate, percent=0, tag="candidate"),
            ],
        )
        second = services.update_service(service=run_v2.Service(spec, name=first.name)).result(
            timeout=60, polling=polling
        )
        tag_url = next(t.uri for t in second.traffic_statuses if t.tag == "candidate")
        try:
            yield second, tag_url
        finally:
            with contextlib.suppress(exceptions.NotFound):
                services.delete_service(name=first.name).result(polling=polling)


@pytest.fixture
def caller(sb) -> Iterator:
    """Change who the metadata server's tokens name (the sandbox's caller); restored after the test."""
    before = sb.configure()["caller"]
    try:
        yield lambda principal: sb.configure(caller=principal)
    finally:
        sb.configure(caller=before)


def test_the_metadata_server_mints_google_style_id_tokens_for_the_caller(sb):
    metadata = sb.info["metadata_url"]
    refused = httpx.get(f"{metadata}/computeMetadata/v1/instance/service-accounts/default/email")
    assert refused.status_code == 403 and "Missing Metadata-Flavor:Google header." in refused.text
    flavor = {"Metadata-Flavor": "Google"}
    ping = httpx.get(metadata, headers=flavor)
    assert ping.status_code == 200 and ping.headers["metadata-flavor"] == "Google"
    email = httpx.get(f"{metadata}/computeMetadata/v1/instance/service-accounts/default/email", headers=flavor).text
    assert email == sb.configure()["caller"].split(":", 1)[1]
    no_audience = httpx.get(f"{metadata}/computeMetadata/v1/instance/service-accounts/default/identity", headers=flavor)
    assert no_audience.status_code == 400 and no_audience.text == "non-empty audience parameter required"

    token = id_token("https://example-123456789012.us-central1.run.app")  # google-auth's own path
    header = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))
    body = claims(token)
    assert header["alg"] == "RS256" and header["kid"]
    assert body["iss"] == "https://accounts.google.com"
    assert body["aud"] == "https://example-123456789012.us-central1.run.app"
    assert body["email"] == email and body["email_verified"] is True
    assert body["sub"] == body["azp"] and body["sub"].isdigit()
    assert body["exp"] - body["iat"] == 3600


def test_the_products_probe_of_the_candidate_passes_with_a_token_for_the_service_url(sandbox_target, service):
    svc, tag_url = service
    candidate = Candidate(service=svc.name, service_url=svc.uri, revision=f"{SERVICE_ID}-candidate-1", url=tag_url)
    token = clients.identity_token(sandbox_target, candidate.service_url)
    assert claims(token.get_secret_value())["aud"] == svc.uri
    verification = verify_candidate(sandbox_target, candidate, SERVED_NAME, FAST)
    assert verification.url == tag_url and verification.served_models == [SERVED_NAME]


def test_a_probe_with_a_token_minted_for_the_tag_url_is_refused(sandbox_target, service):
    """What the product did before: the tag URL as audience. Cloud Run answers 401, so verification fails."""
    svc, tag_url = service
    wrong = Candidate(service=svc.name, service_url=tag_url, revision=f"{SERVICE_ID}-candidate-1", url=tag_url)
    with pytest.raises(VerificationFailed):
        verify_candidate(sandbox_target, wrong, SERVED_NAME, FAST)
    answer = httpx.get(f"{tag_url}/v1/models", headers=bearer(tag_url), timeout=30)
    assert answer.status_code == 401
    assert "<h1>Error: Unauthorized</h1>" in answer.text
    assert "Your client does not have permission to the requested URL <code>/v1/models</code>." in answer.text
    assert 'error="invalid_token"' in answer.headers["www-authenticate"]


def test_tokens_for_another_service_forged_tokens_and_no_token_are_refused(service):
    svc, tag_url = service
    other = bearer("https://other-service-123456789012.us-central1.run.app")
    assert httpx.get(f"{svc.uri}/v1/models", headers=other, timeout=30).status_code == 401
    forged = TokenIssuer().mint(claims(id_token(svc.uri))["email"], svc.uri)  # right claims, another key
    for url in (svc.uri, tag_url):
        assert (
            httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {forged}"}, timeout=30).status_code == 401
        )
        assert (
            httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer not-a-jwt"}, timeout=30).status_code == 401
        )
        no_token = httpx.get(f"{url}/v1/models", timeout=30)
        assert no_token.status_code == 403 and "<h1>Error: Forbidden</h1>" in no_token.text


def test_every_url_of_the_service_is_an_audience_and_x_serverless_authorization_counts(service):
    svc, tag_url = service
    deterministic = f"https://{SERVICE_ID}-123456789012.us-central1.run.app"
    assert deterministic in svc.urls
    for audience in (svc.uri, f"{svc.uri}/", deterministic):
        assert httpx.get(f"{tag_url}/v1/models", headers=bearer(audience), timeout=30).status_code == 200
    serverless = {"X-Serverless-Authorization": f"Bearer {id_token(svc.uri)}"}
    assert httpx.get(f"{svc.uri}/v1/models", headers=serverless, timeout=30).status_code == 200


def test_a_custom_audience_set_on_the_service_is_accepted(sandbox_target, service):
    svc, _ = service
    services = clients.run_services(sandbox_target)
    audience = "https://models.example.com"
    assert httpx.get(f"{svc.uri}/v1/models", headers=bearer(audience), timeout=30).status_code == 401
    services.update_service(
        service=run_v2.Service(name=svc.name, custom_audiences=[audience]),
        update_mask=field_mask_pb2.FieldMask(paths=["custom_audiences"]),
    ).result(timeout=60, polling=clients.operation_polling(sandbox_target))
    try:
        assert httpx.get(f"{svc.uri}/v1/models", headers=bearer(audience), timeout=30).status_code == 200
    finally:
        services.update_service(
            service=run_v2.Service(name=svc.name, custom_audiences=[]),
            update_mask=field_mask_pb2.FieldMask(paths=["custom_audiences"]),
        ).result(timeout=60, polling=clients.operation_polling(sandbox_target))


@pytest.mark.usefixtures("grants_propagated")  # the invoker role is granted raw, with no product wait for it
def test_a_valid_token_of_a_caller_without_run_invoker_is_forbidden_until_granted(sb, sandbox_target, service, caller):
    svc, _ = service
    owner = sb.configure()["caller"]
    caller(STRANGER)
    token = bearer(svc.uri)
    assert claims(token["Authorization"].split()[1])["email"] == STRANGER.split(":", 1)[1]
    refused = httpx.get(f"{svc.uri}/v1/models", headers=token, timeout=30)
    assert refused.status_code == 403 and "<h1>Error: Forbidden</h1>" in refused.text
    services = clients.run_services(sandbox_target)
    caller(owner)  # the owner creates the account and grants it the invoker role on the service
    stranger = sandbox_target.model_copy(update={"service_account_name": "stranger"})
    ensure.ensure_service_account(stranger)
    policy = services.get_iam_policy(request={"resource": svc.name})
    policy.bindings.add(role="roles/run.invoker", members=[STRANGER])
    when_visible(
        lambda: services.set_iam_policy(request={"resource": svc.name, "policy": policy}),
        stranger.service_account_email,
        "Cloud Run",
    )
    try:
        assert httpx.get(f"{svc.uri}/v1/models", headers=token, timeout=30).status_code == 200
    finally:
        policy = services.get_iam_policy(request={"resource": svc.name})
        del policy.bindings[:]
        services.set_iam_policy(request={"resource": svc.name, "policy": policy})


def test_a_users_token_from_gcloud_or_adc_names_gclouds_client_and_is_accepted(service):
    """The product's user-credentials path (``gcloud auth application-default login``): google-auth's refresh
    returns an ID token whose ``aud`` is gcloud's OAuth client id, which Cloud Run trusts on every service; another
    OAuth client's id is no audience of the service."""
    svc, tag_url = service
    adc_client = "764086051850-6qr4p6gpi6hn506pt8ejuq83di341hur.apps.googleusercontent.com"
    for url in (svc.uri, tag_url):
        assert httpx.get(f"{url}/v1/models", headers=bearer(adc_client), timeout=30).status_code == 200
    stranger_client = "123456789012-abcdefghijklmnopqrstuvwxyz012345.apps.googleusercontent.com"
    assert httpx.get(f"{svc.uri}/v1/models", headers=bearer(stranger_client), timeout=30).status_code == 401
