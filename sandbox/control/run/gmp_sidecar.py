"""Google's Managed Service for Prometheus sidecar for Cloud Run (run-gmp-sidecar), as an in-process stand-in.

One asyncio task per instance, started in the instance's dependsOn order (api.py), with the collector's DEFAULT
RunMonitoring config: the sandbox mounts no ``/etc/rungmp/config.yaml``, nor does the product. Sources (research notes
gmp_sidecar_sources.md beside this module, which quote them):

- GoogleCloudPlatform/run-gmp-sidecar ``confgenerator/config.go`` ``DefaultRunMonitoringConfig``: job
  ``run-gmp-sidecar``, one endpoint ``{Port: "8080", Path: "/metrics", Interval: "30s"}`` scraped at
  ``0.0.0.0:8080`` (a static target: whatever container of the instance listens on 8080; the port is hard-coded,
  sidecars do not get ``PORT``, ``confgenerator/util.go``), and all four target metadata labels: ``service_name``,
  ``revision_name``, ``configuration_name`` (K_SERVICE, K_REVISION, K_CONFIGURATION) and ``instanceId`` (faas.id, the
  Cloud Run instance id). Its relabels set the resource labels ``job``, ``cluster`` = ``__run__``, ``namespace`` =
  the service name and ``instance`` = ``<instance id>:8080``.
- Cloud Run docs, "monitoring-managed-prometheus-sidecar": "The collector performs a start-up scrape after 10 seconds
  and performs a shut-down scrape, no matter how short-lived the instance is" (the receiver's
  ``InitialScrapeOffset`` of 10 s and ``StopAfterScrapeAttempt`` on shutdown, collector/receiver/prometheusreceiver).
- GoogleCloudPlatform/opentelemetry-operations-go ``exporter/collector/googlemanagedprometheus``: ``naming.go``
  (``prometheus.googleapis.com/<name>/<suffix>``: counter -> ``/counter``, gauge -> ``/gauge``, histogram ->
  ``/histogram``, untyped -> ``/unknown``; names as scraped, colons and ``_total`` kept, the sidecar setting
  ``add_metric_suffixes: false``) and ``monitoredresource.go`` (resource ``prometheus_target`` with project_id,
  location, cluster, namespace, job, instance); ``exporter/collector/metrics.go`` for kinds: counters CUMULATIVE
  DOUBLE, gauges GAUGE DOUBLE, histograms CUMULATIVE DISTRIBUTION with explicit buckets.
- Its exporter writes with the revision's service account, which needs ``roles/monitoring.metricWriter``
  (run-gmp-sidecar README); without ``monitoring.timeSeries.create`` every export fails and the collector logs it.

Time: the sandbox's simulated clock (10 s to the first scrape, 30 s between scrapes, scaled by the sandbox's
time_scale, also beside a real engine, whose own clock is the wall clock); point timestamps are real wall-clock, as
in the Monitoring stand-in (monitoring/store.py). A CUMULATIVE point spans from the series' start (the instance's
start: the collector's start-time fallback, the receiver being set with ``use_collector_start_time_fallback``) to
the scrape.

The scrape asks as the receiver does (``ACCEPT``: OpenMetrics first, the text format 0.0.4 last) and parses what the
target answers by its Content-Type, as Prometheus picks its parser (``model/textparse/interface.go`` ``New``:
``application/openmetrics-text`` -> the OpenMetrics parser, anything else -> the text one). vLLM's GET /metrics
answers the text format whatever it is asked (sandbox/vllm/metrics.py). In the text format the ``<base>_created``
gauge families prometheus_client prints after each counter and histogram are ordinary gauges, written as
``/gauge`` series like any other. In OpenMetrics a ``_created`` sample belongs to its family: a histogram's gives
its points their start; a counter's, looked up under the ``_total`` sample's family name and not found, becomes a
counter of its own, valued 0, starting then (the receiver's ``internal/transaction.go`` getOrCreateMetricFamily,
``metadata.go`` metadataForMetric and ``metricfamily.go`` addSeries; our reading of that code).

Left out (not needed by the product, or not known well enough): custom RunMonitoring configs, summaries (``_sum``,
``_count`` and quantile series), the receiver's own ``up``/``scrape_*`` series, the sidecar's self metrics, target
labels from OpenMetrics exemplars or ``# UNIT``, and Monitoring's one-point-per-5-s limit. The collector's log
lines are written in its console format, with the OpenTelemetry collector's messages ("Failed to scrape Prometheus
endpoint", "Exporting failed. Dropping data.") and the API's error text; their exact fields are ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from google.cloud import run_v2
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from sandbox.control.errors import GoogleApiError
from sandbox.control.monitoring.metrics import (
    PROMETHEUS_PREFIX,
    PROMETHEUS_RESOURCE_TYPE,
    ExplicitDistribution,
    rfc3339,
)
from sandbox.control.monitoring.store import Point, TimeSeriesWrite
from sandbox.control.run.images import GMP_COLLECTOR
from sandbox.control.run.validation import has_field

if TYPE_CHECKING:
    from sandbox.control.monitoring import Monitoring
    from sandbox.control.run.instances import Instance

SCRAPE_PORT, SCRAPE_PATH = 8080, "/metrics"  # DefaultRunMonitoringConfig's endpoint
SCRAPE_INTERVAL_S = 30  # DefaultRunMonitoringConfig's interval (simulated seconds)
STARTUP_SCRAPE_S = 10  # "a start-up scrape after 10 seconds" (simulated seconds)
JOB = "run-gmp-sidecar"  # DefaultRunMonitoringConfig's metadata.name
CLUSTER = "__run__"
HEALTH_PORT = 13133  # the collector's own liveness endpoint (run-gmp-sidecar entrypoint.go livenessProbePort)
CONFIG_DIR = "/etc/rungmp"
# A scrape's timeout defaults to its interval (config.go); real seconds are not shrunk below this on a busy host.
MIN_REAL_SCRAPE_TIMEOUT_S = 5.0
# The receiver's Accept header: run-gmp-sidecar's scrape config proposes Prometheus' DefaultScrapeProtocols
# (confgenerator/config.go; testdata/builtin/golden/otel.yaml: OpenMetricsText1.0.0, OpenMetricsText0.0.1,
# PrometheusText0.0.4) and its Prometheus (go.mod: github.com/googleCloudPlatform/prometheus 522fcab662ec, VERSION
# 2.54.1) writes them as scrape/scrape.go acceptHeader does, q from len(ScrapeProtocolsHeaders) + 1 = 5 down
# (config/config.go), then */*. enable_compression is false: "identity" (acceptEncodingHeader).
ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)
ACCEPT_ENCODING = "identity"
OPENMETRICS = "application/openmetrics-text"
# Prometheus' honor_labels: false: a scraped label that the target labels also set is kept as exported_<name>
# (Prometheus configuration docs, scrape_config).
TARGET_LABELS = ("job", "instance")


# The Prometheus text format and OpenMetrics ------------------------------------------------------------------------
class ExpositionError(ValueError):
    """The scraped body is not in the format it says; the whole scrape fails, as Prometheus' parser fails it."""


def parse_exposition(text: str, content_type: str = "") -> list[Metric]:
    """The families of a scraped body, samples in order and values as floats, read by prometheus_client's parser for
    its Content-Type (OpenMetrics, else the text format: module docstring); a body it refuses fails the whole scrape
    (ExpositionError)."""
    if content_type.split(";")[0].strip().lower() == OPENMETRICS:
        try:
            families = list(openmetrics_families(text))
        except ValueError as exc:
            raise ExpositionError(f"not OpenMetrics: {exc}") from None
        for family in families:
            family.samples = [sample._replace(value=float(sample.value)) for sample in family.samples]
        return families
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise ExpositionError(f"not the Prometheus text format: {exc}") from None
    # The parser renames the samples of a counter TYPE'd without "_total" (``foo`` becomes ``foo_total``:
    # parser.py build_metric, which munges counters into OpenMetrics form), while the GMP exporter keeps names as
    # scraped. Which counters those were is only in the TYPE lines, so they are read here.
    bare_counters = {
        parts[2]
        for line in text.splitlines()
        if (parts := line.split())[:2] == ["#", "TYPE"] and parts[3:] == ["counter"] and not parts[2].endswith("_total")
    }
    for family in families:
        renamed = family.type == "counter" and family.name in bare_counters
        family.samples = [
            sample._replace(
                name=sample.name.removesuffix("_total") if renamed else sample.name, value=float(sample.value)
            )
            for sample in family.samples
        ]
    return families


# Families -> Monitoring time series ------------------------------------------------------------------------------
def _metric_labels(labels: dict[str, str], target: dict[str, str]) -> dict[str, str]:
    kept = {}
    for key, value in labels.items():
        if key == "le" or value == "":  # Prometheus drops empty labels; le is the bucket, not a series label
            continue
        kept[f"exported_{key}" if key in TARGET_LABELS else key] = value
    return {**kept, **target}


def time_series(
    families: list[Metric],
    resource: dict[str, str],
    target_labels: dict[str, str],
    series_start: float,
    at: float,
) -> list[TimeSeriesWrite]:
    """What the GMP exporter writes for one scrape at real time ``at`` (module docstring for the mapping)."""
    start = min(series_start, at - 1e-3)  # a CUMULATIVE point's start must precede its end
    written: list[TimeSeriesWrite] = []

    def add(name: str, suffix: str, kind: str, value_type: str, labels: dict[str, str], value: Any,
            created: float | None = None) -> None:  # fmt: skip
        begins = start if created is None else min(created, at - 1e-3)  # an OpenMetrics _created: its own start
        point = Point(begins if kind == "CUMULATIVE" else at, at, value)
        written.append(TimeSeriesWrite(f"{PROMETHEUS_PREFIX}{name}/{suffix}", _metric_labels(labels, target_labels),
                                       PROMETHEUS_RESOURCE_TYPE, dict(resource), kind, value_type, point))  # fmt: skip

    for family in families:
        if family.type == "histogram":
            for labels, (dist, created) in _histograms(family).items():
                add(family.name, "histogram", "CUMULATIVE", "DISTRIBUTION", dict(labels), dist, created)
            continue
        if family.type == "summary":
            continue
        for sample in family.samples:
            if not math.isfinite(sample.value):
                continue
            if family.type == "counter" and sample.name == f"{family.name}_created":  # OpenMetrics (docstring)
                add(sample.name, "counter", "CUMULATIVE", "DOUBLE", sample.labels, 0.0, sample.value)
            elif family.type == "counter":
                add(sample.name, "counter", "CUMULATIVE", "DOUBLE", sample.labels, sample.value)
            else:
                add(sample.name, "gauge" if family.type == "gauge" else "unknown", "GAUGE", "DOUBLE", sample.labels,
                    sample.value)  # fmt: skip
    return written


def _histograms(family: Metric) -> dict[tuple, tuple[ExplicitDistribution, float | None]]:
    """One distribution per label set: Prometheus' cumulative ``le`` buckets made per-bucket counts; with the
    OpenMetrics ``_created`` of that set, if any."""
    parts: dict[tuple, dict[str, Any]] = {}
    for sample in family.samples:
        key = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
        part = parts.setdefault(key, {"buckets": {}, "sum": 0.0, "count": None, "created": None})
        if sample.name == f"{family.name}_created":
            part["created"] = sample.value
            continue
        if sample.name == f"{family.name}_bucket" and "le" in sample.labels:
            try:
                part["buckets"][float(sample.labels["le"])] = sample.value
            except ValueError:
                raise ExpositionError(f"bad le label {sample.labels['le']!r} in {sample.name}") from None
        elif sample.name == f"{family.name}_sum":
            part["sum"] = sample.value
        elif sample.name == f"{family.name}_count":
            part["count"] = sample.value
    found = {}
    for key, part in parts.items():
        buckets: dict[float, float] = part["buckets"]
        count = part["count"] if part["count"] is not None else buckets.get(math.inf, 0.0)
        if not math.isfinite(count) or not math.isfinite(part["sum"]):
            continue
        bounds = sorted(b for b in buckets if math.isfinite(b))
        counts, below = [], 0.0
        for bound in bounds:
            counts.append(max(round(buckets[bound] - below), 0))
            below = max(buckets[bound], below)
        counts.append(max(round(count - below), 0))  # the overflow bucket
        found[key] = (ExplicitDistribution(int(count), part["sum"], tuple(bounds), tuple(counts)), part["created"])
    return found


# The sidecar -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunEnvironment:
    """What the collector learns from Cloud Run: K_SERVICE, K_REVISION, K_CONFIGURATION (run-gmp-sidecar
    ``fetchMetadata``), the project and region (metadata server), and the identity its exporter writes as."""

    project: str
    location: str
    service: str
    revision: str
    configuration: str
    service_account: str


def startup_probe_passes(container: run_v2.Container) -> bool:
    """The collector listens on its health port only: a startup probe elsewhere never passes (the sandbox passes one
    on that port at once, without the 5 s the real liveness handler waits)."""
    probe = container.startup_probe
    if not has_field(container, "startup_probe"):
        return True
    port = probe.http_get.port if probe.http_get.port else probe.tcp_socket.port
    return port == HEALTH_PORT


class GmpSidecar:
    """The collector of one instance: scrapes the instance's 8080/metrics and writes what it finds to Monitoring."""

    kind = GMP_COLLECTOR

    def __init__(
        self,
        container: run_v2.Container,
        env: RunEnvironment,
        instance: Instance,
        monitoring: Monitoring | None,
        instance_id: Callable[[], str],
    ) -> None:
        self.name = container.name
        self.image = container.image
        self.env = env
        self.instance = instance
        self.monitoring = monitoring
        self.instance_id = instance_id
        # The sidecar keeps the platform's clock, like Cloud Monitoring's sampling and delays, not its neighbour's: a
        # revision on the real engine runs on the wall clock, but its scrapes still fit the watch's sampling periods.
        self.time_scale = monitoring.config.time_scale if monitoring is not None else instance.time_scale
        self.custom_config = any(m.mount_path.rstrip("/") == CONFIG_DIR for m in container.volume_mounts)
        self.started_at: float | None = None  # real epoch seconds
        self.stopped = False
        self.scrapes = 0  # attempted, the shut-down one included
        self.failed_scrapes = 0  # nothing answered on 8080/metrics, or not in the format it said
        self.writes = 0  # timeSeries.create calls that succeeded
        self.failed_writes = 0  # ... that the API refused (permission, disabled API)
        self.points_written = 0
        self.last_scrape_at: float | None = None
        self.first_written_at: float | None = None
        self.last_error = ""
        self._task: asyncio.Task | None = None
        self._client: httpx.AsyncClient | None = None

    @property
    def log_path(self) -> Path:
        return self.instance.log_path

    def start(self) -> None:
        """Start the collector: its start-up scrape comes 10 simulated seconds later, then one every 30."""
        self.started_at = time.time()
        self._client = httpx.AsyncClient()
        if self.custom_config:
            self._log(f"[sandbox] {self.name}: the GMP sidecar stand-in reads no RunMonitoring config; "
                      f"{CONFIG_DIR}/config.yaml is ignored and the default one is used")  # fmt: skip
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        first = loop.time() + STARTUP_SCRAPE_S * self.time_scale
        interval = SCRAPE_INTERVAL_S * self.time_scale
        due = first
        while True:
            await asyncio.sleep(max(due - loop.time(), 0.0))
            try:
                await self.scrape()
            except Exception as exc:  # a sandbox bug: said in the log, and the collector keeps its schedule
                self.last_error = f"sandbox: {exc!r}"
                self._log(f"[sandbox] {self.name}: the GMP sidecar stand-in failed a scrape: {exc!r}")
            # Prometheus keeps its grid: a scrape that overran skips the slots it missed.
            due += interval * max(1, math.ceil((loop.time() - due) / interval))

    async def scrape(self) -> None:
        """One scrape of ``0.0.0.0:8080/metrics`` and its export; failures are logged, as the collector logs them."""
        self.scrapes += 1
        at = time.time()
        self.last_scrape_at = at
        url = self.instance.url_of_port(SCRAPE_PORT)
        try:
            if url is None:
                raise httpx.ConnectError(f"dial tcp 0.0.0.0:{SCRAPE_PORT}: connect: connection refused")
            assert self._client is not None
            timeout = max(SCRAPE_INTERVAL_S * self.time_scale, MIN_REAL_SCRAPE_TIMEOUT_S)
            response = await self._client.get(
                f"{url}{SCRAPE_PATH}", headers={"Accept": ACCEPT, "Accept-Encoding": ACCEPT_ENCODING}, timeout=timeout
            )
            if response.status_code != 200:
                raise ExpositionError(f"server returned HTTP status {response.status_code} {response.reason_phrase}")
            families = parse_exposition(response.text, response.headers.get("content-type", ""))
            series = self._series(families, at)
        except (httpx.HTTPError, ExpositionError) as exc:
            self.failed_scrapes += 1
            self.last_error = str(exc) or type(exc).__name__
            target = f'{{__name__="up", instance="0.0.0.0:{SCRAPE_PORT}", job="{JOB}"}}'
            self._collector_log("warn", "internal/transaction.go", "Failed to scrape Prometheus endpoint",
                                {"kind": "receiver", "name": f"prometheus/{JOB}", "data_type": "metrics",
                                 "scrape_timestamp": int(at * 1000), "target_labels": target,
                                 "error": self.last_error})  # fmt: skip
            return
        self._export(series, at)

    def _series(self, families: list[Metric], at: float) -> list[TimeSeriesWrite]:
        instance_id = self.instance_id()
        env = self.env
        resource = {"project_id": env.project, "location": env.location, "cluster": CLUSTER,
                    "namespace": env.service, "job": JOB, "instance": f"{instance_id}:{SCRAPE_PORT}"}  # fmt: skip
        target = {"service_name": env.service, "revision_name": env.revision,
                  "configuration_name": env.configuration, "instanceId": instance_id}  # fmt: skip
        start = self.instance.started_at or self.started_at or at
        return time_series(families, resource, target, start, at)

    def _export(self, series: list[TimeSeriesWrite], at: float) -> None:
        if not series:
            return
        if self.monitoring is None:
            self.last_error = "the sandbox runs without its Cloud Monitoring stand-in"
            return
        try:
            principal = f"serviceAccount:{self.env.service_account}"
            kept = self.monitoring.create_time_series(principal, self.env.project, series)
        except GoogleApiError as exc:
            self.failed_writes += 1
            self.last_error = exc.message
            code = "".join(part.title() for part in exc.status.lower().split("_"))
            self._collector_log("error", "exporterhelper/queue_sender.go", "Exporting failed. Dropping data.",
                                {"kind": "exporter", "data_type": "metrics", "name": "googlemanagedprometheus",
                                 "error": f"rpc error: code = {code} desc = {exc.message}",
                                 "dropped_items": len(series)})  # fmt: skip
            return
        self.writes += 1
        self.points_written += kept
        if self.first_written_at is None:
            self.first_written_at = at

    async def stop(self) -> None:
        """Stop, after the shut-down scrape ("no matter how short-lived the instance is")."""
        if self.stopped:
            return
        self.stopped = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        try:
            if self.started_at is not None:
                await self.scrape()
        except Exception as exc:  # the shut-down scrape must not keep the instance from stopping
            self.last_error = f"shut-down scrape failed: {exc!r}"
        finally:
            if self._client is not None:
                await self._client.aclose()

    @property
    def running(self) -> bool:
        return self.started_at is not None and not self.stopped

    def status(self) -> dict:
        """For the admin API (``GET /_sandbox/run/instances``): tests wait on ``writes`` instead of sleeping."""
        return {
            "name": self.name,
            "image": self.image,
            "kind": self.kind,
            "running": self.running,
            "started_at": self.started_at,
            "scrapes": self.scrapes,
            "failed_scrapes": self.failed_scrapes,
            "writes": self.writes,
            "failed_writes": self.failed_writes,
            "points_written": self.points_written,
            "first_written_at": self.first_written_at,
            "last_scrape_at": self.last_scrape_at,
            "last_error": self.last_error,
        }

    def _collector_log(self, level: str, caller: str, message: str, fields: dict) -> None:
        """A line in the OpenTelemetry collector's console format: time, level, caller, message, JSON fields."""
        self._log(f"{rfc3339(time.time())}\t{level}\t{caller}\t{message}\t{json.dumps(fields)}")

    def _log(self, line: str) -> None:
        # The collector logs on stderr (its zap logger's default); the sandbox's own notes go to stdout, as the
        # launcher's do (container_log.py stamps either on arrival).
        with contextlib.suppress(OSError):
            self.instance.log.write(line, "stdout" if line.startswith("[sandbox]") else "stderr")
