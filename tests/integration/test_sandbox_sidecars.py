"""Cloud Run services with sidecars in the sandbox: admission rules, start order, and the Managed Service for
Prometheus sidecar writing the ingress container's metrics into Cloud Monitoring.

Everything goes over real HTTP: services through the run_v2 REST client, requests through the service URL with an ID
token, metrics read back with timeSeries.list through google-auth's AuthorizedSession, as the product reads them; the
sandbox's admin API says how many scrapes the sidecar wrote, so waits poll it instead of sleeping.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from google.api_core import exceptions
from google.cloud import run_v2

from tasks.common import clients
from tasks.infra import ensure
from tests.support.identity import bearer
from tests.support.sandbox_config import config_setter, sandbox_settings
from tests.support.services import SERVED_NAME, gpu_service, health_probe, vllm_args

BUCKET = "sidecar-test-weights"
GMP_IMAGE = "us-docker.pkg.dev/cloud-ops-agents-artifacts/cloud-run-gmp-sidecar/cloud-run-gmp-sidecar:1.2.0"
TOKENS = "prometheus.googleapis.com/vllm:generation_tokens_total/counter"
SUCCESS = "prometheus.googleapis.com/vllm:request_success_total/counter"
CHAT = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 4}
DENIED = "Permission monitoring.timeSeries.create denied (or the resource may not exist)."
WAIT_S = 90.0  # real seconds: generous for a loaded 2-core machine; every wait polls and returns as soon as it can

_ids = itertools.count()


def collector(
    *depends_on: str, name: str = "collector", cpu: str = "1", memory: str = "512Mi", **fields
) -> run_v2.Container:
    """The GMP sidecar as run-gmp-sidecar's run-service-simple.yaml declares it (liveness on :13133, no port)."""
    return run_v2.Container(
        name=name,
        image=GMP_IMAGE,
        depends_on=list(depends_on),
        resources=run_v2.ResourceRequirements(limits={"cpu": cpu, "memory": memory}),
        liveness_probe=run_v2.Probe(
            http_get=run_v2.HTTPGetAction(path="/liveness", port=13133), period_seconds=30, timeout_seconds=30
        ),
        **fields,
    )


PRODUCT_SPLIT = (("6", "24Gi"), ("2", "8Gi"))
# What the services these tests run get: two instances fit a new project's 20 vCPU / 40 GiB together (the module's
# writer and one test's own service), where two of the product's 8 vCPU / 32 GiB do not. The GPU's container keeps
# the L4's minimums (4 vCPU, 16 GiB), the collector a size Cloud Run offers for 1 vCPU.
RUNNING_SPLIT = (("4", "16Gi"), ("1", "2Gi"))


def with_sidecar(
    port: int = 8080, split: tuple[tuple[str, str], tuple[str, str]] = PRODUCT_SPLIT, **overrides
) -> run_v2.Service:
    """vLLM (ingress, named "vllm") on ``port`` beside the collector, which starts after it, at ``split`` ((vCPU,
    memory) of each); by default 8 vCPU / 32 GiB in all, as the product splits the L4 preset
    (tasks/deploy/metrics_sidecar.py: vLLM 6 / 24, the collector 2 / 8)."""
    (cpu, memory), sidecar = split
    spec = gpu_service(BUCKET, cpu=cpu, memory=memory, args=vllm_args(port=port), **overrides)
    ingress = spec.template.containers[0]
    ingress.name = "vllm"
    if port != 8080:
        ingress.ports = [run_v2.ContainerPort(name="http1", container_port=port)]
        ingress.startup_probe = run_v2.Probe(
            http_get=run_v2.HTTPGetAction(path="/health", port=port),
            initial_delay_seconds=5,
            period_seconds=2,
            timeout_seconds=2,
            failure_threshold=120,
        )
    spec.template.containers.append(collector("vllm", cpu=sidecar[0], memory=sidecar[1]))
    return spec


@dataclass(frozen=True)
class Deployed:
    service_id: str
    revision: str  # short name
    url: str
    account: str


def short(name: str) -> str:
    return name.rsplit("/", 1)[1]


@contextlib.contextmanager
def deployed_service(sandbox, sandbox_target, services, spec: run_v2.Service, account: str, roles: list[str]):
    """Create ``account`` with ``roles`` on the project, deploy ``spec`` as it, and delete the service after. A minimum
    of one instance keeps the instance, whose collector the tests read, up between requests (an idle one stops after
    Cloud Run's idle time)."""
    spec.template.scaling.min_instance_count = 1
    target = sandbox_target.model_copy(update={"service_account_name": account})
    with config_setter(sandbox, "iam_propagation_seconds") as set_propagation:
        set_propagation(0)  # the account is usable at once (tests/integration/test_iam_propagation.py covers the wait)
        ensure.ensure_service_account(target)
        # objectViewer: the weights volume (gcsfuse lists the bucket at mount)
        sandbox.set_caller_roles([*roles, "roles/storage.objectViewer"],
                                 member=f"serviceAccount:{target.service_account_email}")  # fmt: skip
        spec.template.service_account = target.service_account_email
        polling = clients.operation_polling(sandbox_target)
        service = services.create_service(
            parent=sandbox_target.location_path, service=spec, service_id=f"sc-{next(_ids)}-{account}"
        ).result(timeout=120, polling=polling)
    try:
        yield Deployed(short(service.name), short(service.latest_ready_revision), service.uri,
                       target.service_account_email)  # fmt: skip
    finally:
        with contextlib.suppress(exceptions.NotFound):
            services.delete_service(name=service.name).result(polling=polling)


@pytest.fixture(scope="module")
def writer(sandbox, sandbox_target, services) -> Iterator[Deployed]:
    """vLLM + the collector, as a service account holding roles/monitoring.metricWriter; two chat completions sent."""
    sandbox.run("POST", "/idle")  # what earlier tests left idle holds nothing: Cloud Run's idle time has passed
    with deployed_service(sandbox, sandbox_target, services, with_sidecar(split=RUNNING_SPLIT), "gmp-writer",
                          ["roles/monitoring.metricWriter"]) as service:  # fmt: skip
        with httpx.Client(headers=bearer(service.url), timeout=30) as caller:
            for _ in range(2):
                assert caller.post(f"{service.url}/v1/chat/completions", json=CHAT).status_code == 200
        yield service


# Helpers --------------------------------------------------------------------------------------------------------
def stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def list_series(target, metric: str, where: str = "", **params) -> httpx.Response:
    rest = clients.monitoring(target)
    now = datetime.now(UTC)
    query = {
        "filter": f'metric.type = "{metric}"' + (f" AND {where}" if where else ""),
        "interval.startTime": stamp(now - timedelta(hours=1)),
        "interval.endTime": stamp(now + timedelta(seconds=1)),
        **params,
    }
    return rest.session.get(rest.url(f"projects/{target.project}/timeSeries"), params=query, timeout=30)


def series_of(target, metric: str, where: str = "") -> list[dict]:
    """The series listed; none while the metric type is unknown (404: never written yet, as on Monitoring)."""
    response = list_series(target, metric, where)
    if response.status_code == 404:
        return []
    assert response.status_code == 200, response.text
    return response.json().get("timeSeries", [])


def of_revision(revision: str) -> str:
    return f'resource.type = "prometheus_target" AND metric.labels.revision_name = "{revision}"'


def poll(read: Callable[[], object], done: Callable[[object], bool], seconds: float = WAIT_S) -> object:
    """``read()`` until ``done`` holds for its value or the deadline passes; returns the last value read."""
    deadline = time.monotonic() + seconds
    while True:
        value = read()
        if done(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def instance_of(sandbox, revision: str) -> dict | None:
    found = [i for i in sandbox.run("GET", "/instances") if i["revision"].endswith(f"/revisions/{revision}")]
    return found[0] if found else None


def collector_status(sandbox, revision: str) -> dict:
    instance = instance_of(sandbox, revision)
    return instance["sidecars"][0] if instance and instance["sidecars"] else {}


def latest_value(series: dict) -> float:
    return series["points"][0]["value"]["doubleValue"]


# The collector's series -----------------------------------------------------------------------------------------
def test_the_ingress_containers_counters_are_written_with_the_sidecars_labels(sandbox, sandbox_target, writer):
    where = of_revision(writer.revision)
    tokens = poll(lambda: series_of(sandbox_target, TOKENS, where), lambda s: bool(s) and latest_value(s[0]) >= 1)
    assert tokens and latest_value(tokens[0]) >= 1, tokens  # the completions' tokens, counted by vLLM's /metrics
    [series] = tokens
    instance_id = series["metric"]["labels"]["instanceId"]
    assert re.fullmatch(r"[0-9a-f]{32,}", instance_id)
    assert series["resource"] == {
        "type": "prometheus_target",
        "labels": {
            "project_id": sandbox_target.project,
            "location": sandbox_target.region,
            "cluster": "__run__",
            "namespace": writer.service_id,
            "job": "run-gmp-sidecar",
            "instance": f"{instance_id}:8080",
        },
    }
    labels = series["metric"]["labels"]
    assert {k: labels[k] for k in ("service_name", "revision_name", "configuration_name")} == {
        "service_name": writer.service_id,
        "revision_name": writer.revision,
        "configuration_name": writer.service_id,
    }
    assert labels["model_name"] == SERVED_NAME and "le" not in labels
    assert (series["metricKind"], series["valueType"]) == ("CUMULATIVE", "DOUBLE")
    points = series["points"]
    ends = [p["interval"]["endTime"] for p in points]
    assert ends == sorted(ends, reverse=True)  # newest first, one point per scrape
    assert len({p["interval"]["startTime"] for p in points}) == 1  # every point counts from the instance's start
    assert all(p["interval"]["startTime"] < p["interval"]["endTime"] for p in points)

    done = poll(lambda: series_of(sandbox_target, SUCCESS, where),
                lambda s: sum(latest_value(x) for x in s) >= 2)  # fmt: skip
    assert sum(latest_value(s) for s in done) >= 2, done  # both completions, over every finished_reason
    assert {s["metric"]["labels"]["revision_name"] for s in done} == {writer.revision}
    assert all(s["resource"]["labels"]["instance"] == f"{instance_id}:8080" for s in done)


def test_histograms_become_distributions_with_explicit_buckets(sandbox_target, writer):
    metric = "prometheus.googleapis.com/vllm:e2e_request_latency_seconds/histogram"

    def count(found: list[dict]) -> int:
        return sum(int(s["points"][0]["value"]["distributionValue"]["count"]) for s in found)

    found = poll(lambda: series_of(sandbox_target, metric, of_revision(writer.revision)), lambda s: count(s) >= 2)
    assert count(found) >= 2, found  # both completions
    [series] = found
    assert (series["metricKind"], series["valueType"]) == ("CUMULATIVE", "DISTRIBUTION")
    dist = series["points"][0]["value"]["distributionValue"]
    bounds = dist["bucketOptions"]["explicitBuckets"]["bounds"]
    assert bounds == sorted(bounds) and len(bounds) > 1
    counts = [int(n) for n in dist["bucketCounts"]]
    assert len(counts) == len(bounds) + 1  # underflow, one per bound, overflow: not cumulative any more
    assert sum(counts) == int(dist["count"]) and dist["mean"] > 0
    assert "le" not in series["metric"]["labels"]


# The Accept header run-gmp-sidecar's receiver sends (Prometheus 2.54.1's acceptHeader for DefaultScrapeProtocols).
RECEIVER_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)


def test_vllms_metrics_answer_the_collectors_accept_in_the_text_format_and_only_the_mount_negotiates(writer):
    """GET /metrics is vLLM's instrumentator route: the text format whatever is asked, which is why the collector's
    series keep their ``_total`` names. Under /metrics/ prometheus_client's make_asgi_app negotiates
    (choose_encoder): OpenMetrics for the collector's Accept, the text format 0.0.4 by default, gzip on request."""
    with httpx.Client(headers=bearer(writer.url), timeout=30) as caller:
        fixed = caller.get(f"{writer.url}/metrics", headers={"Accept": RECEIVER_ACCEPT})
        asked = caller.get(f"{writer.url}/metrics/", headers={"Accept": RECEIVER_ACCEPT, "Accept-Encoding": "gzip"})
        plain = caller.get(f"{writer.url}/metrics/", headers={"Accept-Encoding": "identity"})
    assert fixed.status_code == asked.status_code == plain.status_code == 200
    assert fixed.headers["content-type"] == "text/plain; version=1.0.0; charset=utf-8"
    assert "# TYPE vllm:generation_tokens_total counter" in fixed.text and "# EOF" not in fixed.text
    assert asked.headers["content-type"] == (
        "application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=underscores"
    )
    assert asked.headers["content-encoding"] == "gzip" and asked.text.endswith("# EOF\n")
    # prometheus_client 0.26 writes a colon name's OpenMetrics samples with underscores, under the colon TYPE line.
    assert "# TYPE vllm:generation_tokens counter" in asked.text and "\nvllm_generation_tokens_total{" in asked.text
    assert plain.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "content-encoding" not in plain.headers and "# TYPE vllm:generation_tokens_total counter" in plain.text


def test_the_collector_reads_openmetrics_by_its_content_type_as_the_receiver_groups_it():
    """A target answering OpenMetrics: its counter and histogram land under the same names and values as from the
    text format; its ``_created`` samples start the points (a histogram's) or become a 0 counter (a counter's, the
    receiver's family lookup), where the text format's ``_created`` are gauges. A body that is not what its
    Content-Type says fails the scrape."""
    from prometheus_client import CollectorRegistry, Counter, Histogram
    from prometheus_client import generate_latest as text_format
    from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST, generate_latest

    from sandbox.control.run.gmp_sidecar import ExpositionError, parse_exposition, time_series

    registry = CollectorRegistry()
    Counter("requests", "Requests.", ["code"], registry=registry).labels(code="200").inc(3)
    Histogram("latency_seconds", "Latency.", buckets=(0.5, 1.0), registry=registry).observe(0.7)
    at = time.time() + 60

    def written(body: bytes, content_type: str) -> dict[str, tuple]:
        series = time_series(parse_exposition(body.decode(), content_type), {}, {}, at - 30, at)
        return {
            s.metric_type.removeprefix("prometheus.googleapis.com/"): (s.point.value, s.point.start) for s in series
        }

    text = written(text_format(registry), "text/plain; version=0.0.4; charset=utf-8")
    om = written(generate_latest(registry), CONTENT_TYPE_LATEST)
    for name in ("requests_total/counter", "latency_seconds/histogram"):
        assert om[name][0] == text[name][0], name
    assert text["requests_total/counter"][1] == at - 30  # the text format: from the series' start
    created = om["requests_created/counter"]
    assert created[0] == 0.0 and created[1] < at - 30  # the counter's _created, made when the registry was
    assert abs(om["latency_seconds/histogram"][1] - created[1]) < 5  # the histogram's own _created, as early
    assert "requests_created/gauge" in text and "requests_created/gauge" not in om
    with pytest.raises(ExpositionError, match="not OpenMetrics"):
        parse_exposition(text_format(registry).decode(), CONTENT_TYPE_LATEST)  # no "# EOF"


def test_the_collector_starts_after_the_ingress_probe_and_scrapes_on_its_schedule(sandbox, writer):
    status = poll(lambda: collector_status(sandbox, writer.revision), lambda s: s.get("writes", 0) >= 3)
    assert status["writes"] >= 3 and status["failed_scrapes"] == 0 and status["failed_writes"] == 0, status
    assert status["kind"] == "gmp-collector" and status["running"]
    instance = instance_of(sandbox, writer.revision)
    assert instance is not None and instance["ready_at"] is not None
    # dependsOn: the collector started once vLLM had passed its startup probe, not with it.
    assert instance["started_at"] < instance["ready_at"] <= status["started_at"]
    config = sandbox.configure()
    # The start-up scrape comes 10 simulated seconds after the collector starts (a lower bound: a busy host is later).
    assert status["first_written_at"] - status["started_at"] >= 10 * config["time_scale"] * 0.99


def test_an_unknown_prometheus_metric_is_not_found_and_aggregation_is_refused(sandbox_target, writer):
    unknown = list_series(sandbox_target, "prometheus.googleapis.com/never_written_total/counter")
    assert unknown.status_code == 404
    assert (
        'Cannot find metric(s) that match type = "prometheus.googleapis.com/never_written_total/counter"'
        in (unknown.json()["error"]["message"])
    )
    poll(lambda: series_of(sandbox_target, TOKENS, of_revision(writer.revision)), bool)
    aligned = list_series(sandbox_target, TOKENS, **{"aggregation.perSeriesAligner": "ALIGN_RATE",
                                                     "aggregation.alignmentPeriod": "60s"})  # fmt: skip
    assert aligned.status_code == 400
    assert "does not align or reduce" in aligned.json()["error"]["message"]


def test_an_account_without_metric_writer_writes_nothing_and_the_collector_logs_why(sandbox, sandbox_target, services):
    spec = with_sidecar(split=RUNNING_SPLIT)
    with deployed_service(sandbox, sandbox_target, services, spec, "gmp-no-writer", []) as service:
        status = poll(lambda: collector_status(sandbox, service.revision), lambda s: s.get("failed_writes", 0) >= 1)
        assert status["failed_writes"] >= 1 and status["writes"] == 0, status
        assert status["last_error"] == DENIED
        assert series_of(sandbox_target, TOKENS, of_revision(service.revision)) == []
        log = sandbox.admin.get(f"/run/logs/{service.revision}").text
        assert "Exporting failed. Dropping data." in log
        assert f"rpc error: code = PermissionDenied desc = {DENIED}" in log


def test_an_ingress_container_on_another_port_is_not_scraped(sandbox, sandbox_target, services):
    # The default config scrapes 0.0.0.0:8080, whatever PORT the ingress container has (run-gmp-sidecar config.go).
    with deployed_service(sandbox, sandbox_target, services, with_sidecar(port=8000, split=RUNNING_SPLIT), "gmp-port",
                          ["roles/monitoring.metricWriter"]) as service:  # fmt: skip
        status = poll(lambda: collector_status(sandbox, service.revision), lambda s: s.get("failed_scrapes", 0) >= 2)
        assert status["failed_scrapes"] >= 2 and status["writes"] == 0, status
        assert "connection refused" in status["last_error"]
        assert "Failed to scrape Prometheus endpoint" in sandbox.admin.get(f"/run/logs/{service.revision}").text
        assert series_of(sandbox_target, TOKENS, of_revision(service.revision)) == []


# Admission ------------------------------------------------------------------------------------------------------
def validate(services, target, service: run_v2.Service) -> run_v2.Service:
    return services.create_service(
        request=run_v2.CreateServiceRequest(
            parent=target.location_path, service=service, service_id=f"sc-adm-{next(_ids)}", validate_only=True
        )
    ).result(polling=clients.operation_polling(target))


def refusal(services, target, service: run_v2.Service) -> str:
    with pytest.raises(exceptions.BadRequest) as caught:
        validate(services, target, service)
    return caught.value.message


def changed(change: Callable[[list[run_v2.Container]], None]) -> run_v2.Service:
    spec = with_sidecar()
    containers = [run_v2.Container(c) for c in spec.template.containers]  # copies, changed then put back
    change(containers)
    spec.template.containers = containers
    return spec


def test_the_product_shape_is_admitted(services, sandbox_target):
    assert [c.name for c in validate(services, sandbox_target, with_sidecar()).template.containers] == [
        "vllm",
        "collector",
    ]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda cs: setattr(cs[1], "depends_on", ["app"]),
            "spec.template.spec.containers[1].depends_on: container 'app' not found in the revision template "
            "(other containers: 'vllm')",
        ),
        (
            lambda cs: cs[1].depends_on.append("collector"),
            "spec.template.spec.containers[1].depends_on: container 'collector' cannot depend on itself",
        ),
        (  # two ingress containers
            lambda cs: cs.append(
                run_v2.Container(name="second", image=cs[0].image, ports=[run_v2.ContainerPort(container_port=9000)])
            ),
            "template.containers: Revision template should contain exactly one container with an exposed port.",
        ),
        (  # a sidecar with a port
            lambda cs: cs[1].ports.append(run_v2.ContainerPort(container_port=13133)),
            "template.containers: Revision template should contain exactly one container with an exposed port.",
        ),
        (
            lambda cs: cs[0].depends_on.append("collector"),
            "spec.template.spec.containers[0].depends_on: Dependent container 'collector' must have startup probe "
            "specified",
        ),
        (
            lambda cs: cs.extend([collector("vllm", name="a"), collector("vllm", name="a")]),
            "spec.template.spec.containers[3].name: container name 'a' is already used by "
            "spec.template.spec.containers[2]",
        ),
        (
            lambda cs: setattr(cs[1], "name", ""),
            "spec.template.spec.containers[1].depends_on: Invalid container name ''. Must conform to RFC 1123",
        ),
        (
            lambda cs: cs.extend(collector("vllm", name=f"c{i}") for i in range(9)),
            "spec.template.spec.containers: at most 10 containers are allowed per instance, got 11",
        ),
        (  # the collector gives the helper a vCPU of its 2: the instance stays within its 8 vCPU
            lambda cs: (
                cs[1].resources.limits.update({"cpu": "1", "memory": "4Gi"}),
                cs.append(run_v2.Container(name="helper", image=cs[0].image)),
            ),
            "spec.template.spec.containers[2].image: the sandbox runs only the Managed Service for Prometheus "
            "collector",
        ),
    ],
    ids=["unknown", "self", "two-ingress", "sidecar-port", "no-probe", "duplicate", "unnamed", "eleven", "other"],
)
def test_cloud_run_refuses_bad_container_sets(services, sandbox_target, change, expected):
    assert expected in refusal(services, sandbox_target, changed(change))


def test_a_dependency_cycle_is_refused(services, sandbox_target):
    probe = run_v2.Probe(tcp_socket=run_v2.TCPSocketAction(port=13133))

    def cycle(containers: list[run_v2.Container]) -> None:
        containers[1].depends_on = ["other"]
        containers[1].startup_probe = probe
        containers.append(collector("collector", name="other", startup_probe=probe))

    message = refusal(services, sandbox_target, changed(cycle))
    assert "container dependencies form a cycle: collector -> other -> collector" in message


def sized(vllm: tuple[str, str], sidecar: tuple[str, str], **gpu) -> run_v2.Service:
    """vLLM's container at ``vllm`` (vCPU, memory) holding the GPU, the collector at ``sidecar`` beside it."""
    spec = gpu_service(BUCKET, cpu=vllm[0], memory=vllm[1], **({"probe": health_probe()} | gpu))
    spec.template.containers[0].name = "vllm"
    spec.template.containers.append(collector("vllm", cpu=sidecar[0], memory=sidecar[1]))
    return spec


RTX = {"gpu": "nvidia-rtx-pro-6000", "launch_stage": "BETA"}
WHOLE_VCPUS = "Invalid value specified for container cpu. Must be equal to one of [.08-1], 1.0, 2.0, 4.0, 6.0, 8.0"


@pytest.mark.parametrize(
    ("vllm", "sidecar", "gpu", "expected"),
    [
        # main's split of the L4 preset: 7 vCPU is no size Cloud Run offers a container
        (("7", "31.5Gi"), ("1", "512Mi"), {}, f"spec.template.spec.containers[0].resources.limits.cpu: {WHOLE_VCPUS}"),
        (  # the whole instance for vLLM and the collector on top: over the instance's 8 vCPU
            ("8", "32Gi"),
            ("1", "512Mi"),
            {},
            "spec.template.spec.containers.resources.limits.cpu: Invalid value specified for cpu. Total millicpu "
            "may not exceed 8000.",
        ),
        (  # 4 vCPU / 16 GiB in all, but the GPU is vLLM's: its container keeps the L4's minimums
            ("2", "8Gi"),
            ("2", "8Gi"),
            {},
            "spec.template.spec.containers[0].resources.limits: CPU must be at least 4; memory must be at least 16Gi",
        ),
        (
            ("6", "25Gi"),
            ("2", "7Gi"),
            {},
            "spec.template.spec.containers[0].resources.limits.memory: Invalid value specified for container memory. "
            "For 6.0 CPU, memory must be between 4Gi and 24Gi inclusive.",
        ),
        (
            ("6", "24Gi"),
            ("1", "8Gi"),
            {},
            "spec.template.spec.containers[1].resources.limits.memory: Invalid value specified for container memory. "
            "For 1.0 CPU, memory must be between 512Mi and 4Gi inclusive.",
        ),
        (  # 20 vCPU / 80 GiB in all for an RTX PRO 6000: vLLM's container is below its GPU's sizes
            ("19", "79.5Gi"),
            ("1", "512Mi"),
            RTX,
            "spec.template.spec.containers[0].resources.limits.cpu: Invalid value specified for container cpu. Must "
            "be equal to one of 20.0, 22.0",
        ),
    ],
    ids=["main-7-vcpu", "total-over-8", "gpu-minimum-own", "vllm-memory", "sidecar-memory", "rtx-19"],
)
def test_each_containers_size_is_one_cloud_run_offers(services, sandbox_target, vllm, sidecar, gpu, expected):
    assert expected in refusal(services, sandbox_target, sized(vllm, sidecar, **gpu))


@pytest.mark.parametrize(
    ("vllm", "sidecar", "gpu"),
    [
        (("6", "24Gi"), ("2", "8Gi"), {}),  # the product's split of the L4 preset
        (("4", "16Gi"), ("1", "512Mi"), {}),  # 5 vCPU in all: no size for an instance, each container's is one
        (("4", "16Gi"), ("0.5", "512Mi"), {}),  # a fraction of a vCPU for a sidecar, CPU always allocated
        (("20", "80Gi"), ("1", "1Gi"), RTX),  # the fix preflight offers the RTX preset with the collector
    ],
    ids=["l4-split", "five-vcpu", "half-vcpu-sidecar", "rtx-21"],
)
def test_sizes_cloud_run_offers_are_admitted(services, sb, sandbox_target, vllm, sidecar, gpu):
    # Admission of sizes alone: the RTX's 81 GiB exceed a new project's 40 GiB memory quota (and its GPU quota may be
    # 0), which other tests cover.
    rtx_quota = {**sb.configure()["gpu_quota"], "nvidia-rtx-pro-6000": 1}
    with sandbox_settings(sb, memory_quota_gib=800, cpu_quota=200, gpu_quota=rtx_quota):
        admitted = validate(services, sandbox_target, sized(vllm, sidecar, **gpu))
    assert [dict(c.resources.limits)["cpu"] for c in admitted.template.containers] == [vllm[0], sidecar[0]]
