"""Cloud Monitoring API v3 ``projects.timeSeries.list`` for Cloud Run revision metrics, as a REST caller sends it.

``GET /v3/projects/{project}/timeSeries?filter=...&interval.startTime=...&interval.endTime=...&view=FULL
[&aggregation.perSeriesAligner=...&aggregation.alignmentPeriod=60s&aggregation.crossSeriesReducer=...
&aggregation.groupByFields=...][&pageSize=N&pageToken=T]`` answers ``{timeSeries: [...], unit, nextPageToken}``
(each omitted when empty). The metrics come from the requests the Cloud Run stand-in's front ends really proxied
(store.py) and from its running instances, sampled once per (simulated) minute.

Rules kept from the real API (timeSeries.list reference, the monitoring.v3 discovery document, and the Monitoring
API troubleshooting page https://cloud.google.com/monitoring/api/troubleshooting):
- ``interval.endTime`` is required ("Request was missing field interval.endTime."); ``startTime`` defaults to it
  and must not be later; a raw point is returned when its end time is in (startTime, endTime] (exactly endTime when
  both are equal); points come newest first ("returned in reverse time order").
- ``view=HEADERS`` returns the series without points. ``pageSize`` counts points (FULL) or series (HEADERS),
  at most 100,000 by default; a page token belongs to the query that produced it.
- ``name`` is ``projects/{id or number}``; another project answers 403 as for a caller without
  ``monitoring.timeSeries.list`` there.

Managed Service for Prometheus series (``prometheus.googleapis.com/...``, resource ``prometheus_target``) are served
once the GMP sidecar stand-in has written them (``create_time_series``, called in-process as the sidecar's exporter
calls timeSeries.create; sandbox/control/run/gmp_sidecar.py): raw points only. The sandbox does not align or reduce
them (a 400 says so): the product reads their raw CUMULATIVE points and takes differences itself.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import time

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from sandbox.authz import has_permission
from sandbox.control import ControlContext
from sandbox.control.errors import GoogleApiError, invalid_argument
from sandbox.control.monitoring import aggregation, filters
from sandbox.control.monitoring.metrics import (
    DESCRIPTORS,
    Distribution,
    ExplicitDistribution,
    parse_rfc3339,
    rfc3339,
)
from sandbox.control.monitoring.store import InstanceSample, MetricStore, RequestEvent, Series, TimeSeriesWrite
from sandbox.control.serviceusage.gate import service_disabled_body

DEFAULT_PAGE_SIZE = 100_000
VIEWS = ("FULL", "HEADERS")
VIEW_TYPE = "type.googleapis.com/google.monitoring.v3.ListTimeSeriesRequest.TimeSeriesView"


class Monitoring:
    """Serves timeSeries.list and keeps what Cloud Run served (``record_request``, called by its front ends)."""

    name = "monitoring"

    def __init__(self, ctx: ControlContext) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.store = MetricStore(ctx.config)
        self._sampler: asyncio.Task | None = None

    def routes(self) -> list[BaseRoute]:
        return [Route("/v3/projects/{project}/timeSeries", self.list_time_series, methods=["GET"])]

    def admin_routes(self) -> list[BaseRoute]:
        return [Route("/events", self.admin_events, methods=["GET"])]

    async def shutdown(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler

    # Recording ------------------------------------------------------------------------------------------------
    def record_request(
        self, location: str, service: str, revision: str, status: int, seconds: float, real_time: bool = False
    ) -> None:
        """A request that reached ``revision``'s instance finished with ``status`` after ``seconds`` of real time.

        ``real_time``: the instance is the real engine, which runs on the wall clock, so its latency is not scaled.
        """
        # Simulated milliseconds (store.py).
        latency_ms = seconds * 1000 / (1.0 if real_time else self.config.time_scale)
        self.store.record(RequestEvent(time.time(), location, service, revision, status, latency_ms))
        self._ensure_sampler()

    def _ensure_sampler(self) -> None:
        """Instance counts are sampled once a period from the first request on (a sandbox without traffic idles)."""
        if self._sampler is None or self._sampler.done():
            self._sampler = asyncio.get_running_loop().create_task(self._sample_instances())

    async def _sample_instances(self) -> None:
        while True:
            now = time.time()
            boundary = self.store.period_end(now)
            await asyncio.sleep(max(boundary - now, 0.0))
            run = self.ctx.module("run")
            counts: dict[str, int] = {}
            for name, instance in run.instances.items() if run is not None else ():
                if instance.running:
                    counts[name] = counts.get(name, 0) + 1
            for name, active in counts.items():
                parts = name.split("/")  # projects/p/locations/l/services/s/revisions/r
                self.store.sample(InstanceSample(boundary, parts[3], parts[5], parts[7], active))

    def create_time_series(self, principal: str, project: str, series: list[TimeSeriesWrite]) -> int:
        """timeSeries.create made as ``principal`` (a writer inside the sandbox: the GMP sidecar stand-in); returns
        the points kept. Raises GoogleApiError as the API answers: 403 SERVICE_DISABLED when Monitoring is not
        enabled, 403 "Permission monitoring.timeSeries.create denied (or the resource may not exist)." without that
        permission on the project (the text Monitoring gives for a missing permission, as for timeSeries.list)."""
        if "monitoring.googleapis.com" in self.config.disabled_apis:
            error = service_disabled_body("monitoring.googleapis.com", self.config.project_number)["error"]
            raise GoogleApiError(403, error["message"], error["status"], details=error["details"])
        own = project in (self.config.project, self.config.project_number)
        if not own or not has_permission(
            self.ctx, principal, "monitoring.timeSeries.create", f"projects/{self.config.project}"
        ):
            raise GoogleApiError(403, "Permission monitoring.timeSeries.create denied (or the resource may not exist).")
        return self.store.write(series, time.time())

    async def admin_events(self, request: Request) -> JSONResponse:
        """Every recorded request (``?service=`` narrows), oldest first: for tests and benchmarks."""
        service = request.query_params.get("service")
        return JSONResponse([e.to_json() for e in self.store.events if service in (None, e.service)])

    # timeSeries.list ------------------------------------------------------------------------------------------
    async def list_time_series(self, request: Request) -> JSONResponse:
        project = request.path_params["project"]
        if project not in (self.config.project, self.config.project_number):
            raise GoogleApiError(403, "Permission monitoring.timeSeries.list denied (or the resource may not exist).")
        query = request.query_params
        view = query.get("view") or "FULL"  # FULL is the enum's zero value
        if view not in VIEWS:
            raise invalid_argument(f"Invalid value at 'view' ({VIEW_TYPE}), \"{view}\"")
        if query.get("orderBy"):
            raise invalid_argument('Field orderBy had an invalid value: "orderBy" is unsupported: must be left blank.')
        start, end = _interval(query.get("interval.startTime", ""), query.get("interval.endTime", ""))
        agg = aggregation.parse(query, query.getlist("aggregation.groupByFields"))
        known = self.store.descriptors()
        wanted = filters.parse(query.get("filter", ""), known)
        descriptor = known[wanted.metric_type]
        if wanted.metric_type not in DESCRIPTORS and (agg.aligns or agg.reducer != "REDUCE_NONE"):
            raise invalid_argument(
                f"The sandbox does not align or reduce {wanted.metric_type}: it serves the raw points of written "
                "(Managed Service for Prometheus) series only; leave aggregation out (ALIGN_NONE)."
            )
        aggregation.check(agg, descriptor.kind, descriptor.value_type)
        size, offset, digest = _paging(query)

        series = [s for s in self.store.raw_series(wanted.metric_type, time.time()) if _selected(s, wanted, project)]
        if agg.aligns:
            series = aggregation.align(series, agg, start, end, self.config.time_scale)
            if agg.reducer != "REDUCE_NONE":
                series = aggregation.reduce(series, agg)
        else:
            series = [_within(s, start, end) for s in series]
        series = sorted((s for s in series if s.points), key=Series.key)

        page: list[dict] = []
        used = 0
        for s in series[offset:]:
            cost = 1 if view == "HEADERS" else len(s.points)
            if page and used + cost > size:
                break
            page.append(_series_json(s, view))
            used += cost
        answer: dict = {}
        if page:
            answer["timeSeries"] = page
            units = {s["unit"] for s in page if s.get("unit")}
            answer["unit"] = units.pop() if len(units) == 1 else "{not_a_unit}"
        if offset + len(page) < len(series):
            answer["nextPageToken"] = _token(offset + len(page), digest)
        return JSONResponse(answer)


def _interval(start_text: str, end_text: str) -> tuple[float, float]:
    if not end_text:
        raise invalid_argument("Request was missing field interval.endTime.")
    end = parse_rfc3339(end_text)
    if end is None:
        raise invalid_argument(
            f"Invalid value at 'interval.end_time' (type.googleapis.com/google.protobuf.Timestamp), \"{end_text}\""
        )
    start = parse_rfc3339(start_text) if start_text else end
    if start is None:
        raise invalid_argument(
            f"Invalid value at 'interval.start_time' (type.googleapis.com/google.protobuf.Timestamp), \"{start_text}\""
        )
    if start > end:
        raise invalid_argument(
            f'Field interval.start_time had an invalid value of "{start_text}": The start time must not be later '
            f"than the end time ({end_text})."
        )
    return start, end


def _selected(s: Series, wanted: filters.Filter, project: str) -> bool:
    def value_of(field: str) -> str | None:
        if field == "metric.type":
            return s.metric_type
        if field == "resource.type":
            return s.resource_type
        if field == "project":
            return project
        labels = s.metric_labels if field.startswith("metric.") else s.resource_labels
        return labels.get(field.split(".", 2)[2])

    return wanted.matches(value_of)


def _within(s: Series, start: float, end: float) -> Series:
    points = [p for p in s.points if (p.end == end if start == end else start < p.end <= end)]
    return Series(s.metric_type, s.metric_labels, s.resource_labels, s.kind, s.value_type, s.unit, points,
                  s.resource_type)  # fmt: skip


def _value_json(value_type: str, value) -> dict:
    if isinstance(value, Distribution | ExplicitDistribution):
        return {"distributionValue": value.to_json()}
    if value_type == "INT64":
        return {"int64Value": str(int(value))}
    return {"doubleValue": float(value)}


def _series_json(s: Series, view: str) -> dict:
    body: dict = {
        "metric": {"type": s.metric_type, **({"labels": s.metric_labels} if s.metric_labels else {})},
        "resource": {"type": s.resource_type, "labels": s.resource_labels},
        "metricKind": s.kind,
        "valueType": s.value_type,
    }
    if view == "FULL":
        body["points"] = [
            {"interval": {"startTime": rfc3339(p.start), "endTime": rfc3339(p.end)},
             "value": _value_json(s.value_type, p.value)}
            for p in s.points
        ]  # fmt: skip
    if s.unit:
        body["unit"] = s.unit
    return body


def _paging(query) -> tuple[int, int, str]:
    try:
        size = int(query.get("pageSize") or DEFAULT_PAGE_SIZE)
    except ValueError:
        raise invalid_argument(f"Invalid value at 'page_size' (TYPE_INT32), \"{query.get('pageSize')}\"") from None
    if size <= 0 or size > DEFAULT_PAGE_SIZE:
        size = DEFAULT_PAGE_SIZE  # "If page_size is empty or more than 100,000 results, the effective page_size is"
    keyed = sorted((k, v) for k, v in query.multi_items() if k not in ("pageToken", "pageSize"))
    digest = hashlib.sha256(json.dumps(keyed).encode()).hexdigest()[:16]
    token = query.get("pageToken", "")
    if not token:
        return size, 0, digest
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        offset, same = int(data["o"]), data["q"] == digest
    except (ValueError, KeyError, TypeError):
        raise invalid_argument("Invalid page token.") from None
    if not same:
        raise invalid_argument("The page token does not match the request: only pageSize may change between pages.")
    return size, offset, digest


def _token(offset: int, digest: str) -> str:
    return base64.urlsafe_b64encode(json.dumps({"o": offset, "q": digest}).encode()).decode().rstrip("=")
