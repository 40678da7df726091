"""The sandbox refuses what Google's front end refuses for its shape, with Google's status and message.

Requests go over real HTTP to the session sandbox, as a product bug or a raw client call would send them.
"""

from __future__ import annotations

import httpx
import pytest
from google.api_core import exceptions

from tasks.common import clients


@pytest.fixture
def services_url(sb, sandbox_target) -> str:
    return f"{sandbox_target.endpoints.run}/v2/{sandbox_target.location_path}/services"


def field_violations(response: httpx.Response) -> list[dict]:
    [detail] = response.json()["error"]["details"]
    assert detail["@type"] == "type.googleapis.com/google.rpc.BadRequest"
    return detail["fieldViolations"]


def test_an_unknown_field_deep_in_a_cloud_run_service_is_refused_and_nothing_is_created(services_url, sandbox_target):
    service = {"template": {"containers": [{"image": "us-docker.pkg.dev/x/y/z:1", "fooBar": True}]}}
    refused = httpx.post(services_url, params={"serviceId": "conformance-unknown"}, json=service)
    expected = (
        "Invalid JSON payload received. Unknown name \"fooBar\" at 'service.template.containers[0]': Cannot find field."
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == expected
    assert refused.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert field_violations(refused) == [{"field": "service.template.containers[0]", "description": expected}]
    with pytest.raises(exceptions.NotFound):
        clients.run_services(sandbox_target).get_service(
            name=f"{sandbox_target.location_path}/services/conformance-unknown"
        )


def test_a_bad_enum_is_refused_naming_its_type_and_a_bad_number_too(services_url):
    refused = httpx.post(services_url, params={"serviceId": "conformance-enum"}, json={"ingress": "FOO"})
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == (
        "Invalid value at 'service.ingress' (type.googleapis.com/google.cloud.run.v2.IngressTraffic), \"FOO\""
    )
    out_of_range = httpx.post(services_url, params={"serviceId": "conformance-enum"}, json={"ingress": 42})
    assert out_of_range.status_code == 400
    assert field_violations(out_of_range)[0]["field"] == "service.ingress"


def test_an_unknown_query_parameter_is_refused_and_the_clients_system_parameters_are_not(services_url):
    refused = httpx.get(services_url, params={"pageSize": 5, "foo": "1"})
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == (
        'Invalid JSON payload received. Unknown name "foo": Cannot bind query parameter. '
        "Field 'foo' could not be found in request message."
    )
    # What google-api-core's REST transport sends on every call, plus the proto-name spelling of a field.
    listed = httpx.get(services_url, params={"$alt": "json;enum-encoding=int", "page_size": 5, "fields": "services"})
    assert listed.status_code == 200


def test_an_unknown_path_or_verb_gets_the_front_ends_plain_404(sandbox_target, services_url):
    base = sandbox_target.endpoints.run
    for response in (
        httpx.get(f"{base}/v2/{sandbox_target.location_path}/gizmos"),
        httpx.put(f"{services_url}/some-service", json={}),
        httpx.get(f"{base}/v9/anything"),
    ):
        assert response.status_code == 404
        assert response.headers["content-type"].startswith("text/html")
        assert f"The requested URL <code>{response.request.url.path}</code> was not found" in response.text


def test_a_published_method_the_sandbox_lacks_says_so(sandbox_target):
    pools = httpx.get(f"{sandbox_target.endpoints.run}/v2/{sandbox_target.location_path}/workerPools")
    assert pools.status_code == 501
    assert pools.json()["error"]["status"] == "UNIMPLEMENTED"
    assert "run.projects.locations.workerPools.list" in pools.json()["error"]["message"]


def test_the_real_client_surfaces_the_refusal_as_bad_request(sandbox_target):
    """What the product sees when it sends a field Google does not know: google-api-core's BadRequest with
    Google's message (here through the IAM client's own authorized session, as tasks.common.clients builds it)."""
    iam = clients.iam(sandbox_target)
    url = iam.url(f"projects/{sandbox_target.project}/serviceAccounts")
    response = iam.session.post(url, json={"accountId": "conformance-sa", "serviceAccount": {"displayNam": "typo"}})
    error = exceptions.from_http_response(response)
    assert isinstance(error, exceptions.BadRequest)
    assert "Unknown name \"displayNam\" at 'service_account': Cannot find field." in error.message


def test_the_session_sandbox_has_recorded_no_response_violations(sb):
    assert sb.conformance_violations() == []
