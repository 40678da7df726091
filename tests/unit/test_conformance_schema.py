"""The discovery-schema validator on plain dicts: what the sandbox refuses and what it flags in its own answers."""

from __future__ import annotations

import json

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from sandbox import discovery
from sandbox.conformance import ConformanceLog, ConformanceMiddleware, body_problems, exempt_prefix, query_problems
from sandbox.conformance.request import body_field
from sandbox.conformance.schema import walker

SERVICES = "/v2/projects/p/locations/us-central1/services"


def run_create() -> discovery.Method:
    found = discovery.match("POST", SERVICES, ("run.v2",))
    assert found is not None
    return found.method


def messages(method: discovery.Method, body: dict) -> list[str]:
    problems, error = body_problems(method, json.dumps(body).encode())
    assert error is None
    return [p.message for p in problems]


def test_unknown_field_is_named_with_its_proto_path_at_any_depth():
    body = {"template": {"containers": [{"image": "i"}, {"image": "j", "fooBar": 1}]}}
    assert messages(run_create(), body) == [
        "Invalid JSON payload received. Unknown name \"fooBar\" at 'service.template.containers[1]': Cannot find field."
    ]


def test_map_values_are_entries_and_a_top_level_unknown_names_the_body_field():
    body = {"template": {"containers": [{"resources": {"limits": {"cpu": "8"}}}]}, "foo": 1}
    assert messages(run_create(), body) == [
        "Invalid JSON payload received. Unknown name \"foo\" at 'service': Cannot find field."
    ]
    # Build.timing is map<string, TimeSpan>: each entry is walked, named as Google names map entries.
    build = {"id": "b", "timing": {"BUILD": {"startTime": "2026-01-01T00:00:00Z"}, "PUSH": {"bogus": 1}}}
    problems = walker("cloudbuild.v1", "response").check("Build", build)
    assert [p.message for p in problems] == [
        "Invalid JSON payload received. Unknown name \"bogus\" at 'timing[1].value': Cannot find field."
    ]


def test_proto_field_names_are_accepted_in_requests_but_not_in_responses():
    body = {"template": {"scaling": {"max_instance_count": 3}}}
    assert messages(run_create(), body) == []
    service = {"name": "s", "template": {"scaling": {"max_instance_count": 3}}}
    problems = walker("run.v2", "response").check("GoogleCloudRunV2Service", service)
    assert [p.message for p in problems] == [
        "Invalid JSON payload received. Unknown name \"max_instance_count\" at 'template.scaling': Cannot find field."
    ]


def test_enum_strings_must_be_listed_and_integers_in_range():
    method = run_create()
    assert messages(method, {"ingress": "INGRESS_TRAFFIC_ALL", "launchStage": 6}) == []
    assert messages(method, {"ingress": 1}) == []
    assert messages(method, {"ingress": "FOO", "launchStage": 99}) == [
        "Invalid value at 'service.ingress' (type.googleapis.com/google.cloud.run.v2.IngressTraffic), \"FOO\"",
        "Invalid value at 'service.launch_stage' (type.googleapis.com/google.api.LaunchStage), 99",
    ]


def test_request_message_bodies_have_no_prefix_and_compute_names_its_resource_field():
    set_policy = discovery.match("POST", f"{SERVICES}/s:setIamPolicy", ("run.v2",))
    assert set_policy is not None and body_field(set_policy.method) == ""
    assert messages(set_policy.method, {"policy": {"bindings": [{"role": "r", "member": "m"}]}}) == [
        "Invalid JSON payload received. Unknown name \"member\" at 'policy.bindings[0]': Cannot find field."
    ]
    insert = discovery.match("POST", "/compute/v1/projects/p/global/networks", ("compute.v1",))
    assert insert is not None
    assert messages(insert.method, {"name": "n", "autoCreateSubnetworks": False, "x": 1}) == [
        "Invalid JSON payload received. Unknown name \"x\" at 'network_resource': Cannot find field."
    ]


def test_query_parameters_bind_to_the_method_or_the_system_parameters():
    method = run_create()
    ok = "serviceId=s&validateOnly=true&%24alt=json%3Benum-encoding%3Dint&validate_only=false&fields=name"
    assert query_problems(method, ok) == []
    assert query_problems(method, "serviceId=s&foo=1") == [
        'Invalid JSON payload received. Unknown name "foo": Cannot bind query parameter. '
        "Field 'foo' could not be found in request message."
    ]
    get_policy = discovery.match("GET", f"{SERVICES}/s:getIamPolicy", ("run.v2",))
    assert get_policy is not None
    assert query_problems(get_policy.method, "options.requestedPolicyVersion=3") == []


def test_an_operations_any_payload_is_checked_against_the_type_it_names():
    op = {
        "name": "projects/p/locations/l/operations/o",
        "done": True,
        "metadata": {"@type": "type.googleapis.com/google.cloud.run.v2.Service", "name": "s"},
        "response": {
            "@type": "type.googleapis.com/google.cloud.run.v2.Service",
            "name": "s",
            "terminalCondition": {"type": "Ready", "state": "CONDITION_SUCCEEDED", "invented": True},
            "urls": ["https://s.run.app"],
        },
    }
    problems = walker("run.v2", "response").check("GoogleLongrunningOperation", op)
    assert [p.message for p in problems] == [
        "Invalid JSON payload received. Unknown name \"invented\" at 'response.terminal_condition': Cannot find field."
    ]
    # A type no served document describes is not guessed at.
    op["response"] = {"@type": "type.googleapis.com/google.example.v1.Thing", "anything": 1}
    assert walker("run.v2", "response").check("GoogleLongrunningOperation", op) == []


class _InventingApi:
    """A stand-in API module that answers with a field Cloud Run does not have."""

    name = "run"

    async def get_service(self, request: Request) -> JSONResponse:
        return JSONResponse({"name": request.url.path[4:], "gpuCount": 1})

    async def token(self, _: Request) -> PlainTextResponse:
        return PlainTextResponse("t")


def _client(log: ConformanceLog) -> TestClient:
    module = _InventingApi()
    app = Starlette(
        routes=[
            Route(SERVICES + "/{service}", module.get_service, methods=["GET"]),
            Route("/test-only-metadata/token", module.token, methods=["GET"]),
        ]
    )
    return TestClient(ConformanceMiddleware(app, log))


def test_the_middleware_records_a_response_that_invents_a_field():
    log = ConformanceLog()
    with _client(log) as client:
        assert client.get(f"{SERVICES}/s").status_code == 200  # the caller still gets the answer
    [violation] = log.violations()
    assert violation["method"] == "run.projects.locations.services.get"
    assert violation["problems"] == ['Invalid JSON payload received. Unknown name "gpuCount": Cannot find field.']


def test_paths_no_api_serves_are_404_unless_registered_as_non_google():
    log = ConformanceLog()
    with _client(log) as client:
        assert client.get("/test-only-metadata/token").status_code == 404
        exempt_prefix("/test-only-metadata/")
        assert client.get("/test-only-metadata/token").text == "t"
        refused = client.get(f"{SERVICES}/s?foo=1")
    assert refused.status_code == 400 and refused.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert log.violations() == []


def test_values_of_the_wrong_json_type_are_refused_with_their_proto_type():
    method = run_create()
    body = {
        "template": {
            "scaling": {"maxInstanceCount": "3", "minInstanceCount": "x"},  # a number in a string is fine
            "timeout": 5,
            "containers": [{"args": [1], "resources": {"cpuIdle": "true", "startupCpuBoost": 1}}],
        },
        "generation": "12",
    }
    assert messages(method, body) == [
        "Invalid value at 'service.template.scaling.min_instance_count' (TYPE_INT32), \"x\"",
        "Invalid value at 'service.template.timeout' (type.googleapis.com/google.protobuf.Duration), 5",
        "Invalid value at 'service.template.containers[0].args[0]' (TYPE_STRING), 1",
        "Invalid value at 'service.template.containers[0].resources.startup_cpu_boost' (TYPE_BOOL), 1",
    ]


def test_enum_numbers_are_the_protos_own_even_with_gaps():
    create = discovery.match("POST", "/v1/projects/p/builds", ("cloudbuild.v1",))
    assert create is not None
    # MachineType: UNSPECIFIED 0, N1_HIGHCPU_8 1, N1_HIGHCPU_32 2, E2_HIGHCPU_8 5, E2_HIGHCPU_32 6, E2_MEDIUM 7, ...
    assert messages(create.method, {"options": {"machineType": 6}}) == []
    assert messages(create.method, {"options": {"machineType": 3}}) == [
        "Invalid value at 'build.options.machine_type' "
        "(type.googleapis.com/google.devtools.cloudbuild.v1.BuildOptions.MachineType), 3"
    ]


def test_the_gcs_front_refuses_nothing_but_records_a_request_beyond_storage_v1():
    async def insert_bucket(request: Request) -> JSONResponse:
        return JSONResponse({"kind": "storage#bucket", "name": (await request.json())["name"]})

    app = Starlette(routes=[Route("/storage/v1/b", insert_bucket, methods=["POST"])])
    log = ConformanceLog()
    with TestClient(ConformanceMiddleware(app, log, ("storage.v1",), check_requests=False)) as client:
        fine = client.post("/storage/v1/b?project=p", json={"name": "b", "location": "US-CENTRAL1"})
        odd = client.post("/storage/v1/b?project=p&colour=red", json={"name": "c", "gpuCount": 1})
    assert fine.status_code == odd.status_code == 200  # no source shows Cloud Storage refusing either
    [violation] = log.violations()
    assert violation["method"] == "storage.buckets.insert" and violation["http"].endswith("(request)")
    assert len(violation["problems"]) == 2
    assert any('"colour"' in p for p in violation["problems"]) and any('"gpuCount"' in p for p in violation["problems"])
