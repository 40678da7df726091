"""Pure helpers over run_v2 messages: defaults Cloud Run fills in, revisions from templates, conditions."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import secrets

from google.cloud import run_v2
from google.protobuf import duration_pb2, json_format, timestamp_pb2

from sandbox.control import ControlContext
from sandbox.control.run.dependencies import may_write
from sandbox.control.run.instances import ProbeSpec
from sandbox.control.run.validation import DEFAULT_CPU, DEFAULT_MEMORY, has_field, ingress_index

DEFAULT_PORT = 8080
DEFAULT_CONCURRENCY = 80
DEFAULT_TIMEOUT_S = 300
# Cloud Run's default startup probe when none is given: TCP on the container port, 240/240/1 (FACTS.md).
DEFAULT_PROBE = {"initial_delay_seconds": 0, "timeout_seconds": 240, "period_seconds": 240, "failure_threshold": 1}
TEMPLATE_TO_REVISION = (
    "scaling",
    "vpc_access",
    "max_instance_request_concurrency",
    "timeout",
    "service_account",
    "containers",
    "volumes",
    "execution_environment",
    "node_selector",
    "gpu_zonal_redundancy_disabled",
    "labels",
    "annotations",
    "session_affinity",
)

State = run_v2.Condition.State


def now() -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(dt.datetime.now(dt.UTC))
    return stamp


def to_dict(message) -> dict:
    """JSON as the REST API sends it: camelCase, enums as names, zero values omitted."""
    return json_format.MessageToDict(type(message).pb(message))


def etag_of(message) -> str:
    digest = hashlib.sha256(type(message).serialize(message)).digest()[:12]
    return base64.b64encode(digest).decode()


def with_defaults(template: run_v2.RevisionTemplate) -> run_v2.RevisionTemplate:
    """The template as Cloud Run stores it, so that an unchanged template compares equal."""
    template = run_v2.RevisionTemplate(template)
    if not template.max_instance_request_concurrency:
        template.max_instance_request_concurrency = DEFAULT_CONCURRENCY
    if not has_field(template, "timeout"):
        template.timeout = duration_pb2.Duration(seconds=DEFAULT_TIMEOUT_S)
    for index, container in enumerate(template.containers):
        if not container.name:
            container.name = "vllm-1" if index == 0 else f"container-{index + 1}"
        # A lone container is the ingress one and gets the default port; with sidecars, the one that declares a
        # port is (validation.py), and the others must keep none.
        if len(template.containers) == 1 and not container.ports:
            container.ports = [run_v2.ContainerPort(name="http1", container_port=DEFAULT_PORT)]
        limits = dict(container.resources.limits)
        limits.setdefault("cpu", DEFAULT_CPU)
        limits.setdefault("memory", DEFAULT_MEMORY)
        container.resources.limits = limits
    return template


def ingress_container(containers) -> run_v2.Container:
    """The container that receives requests: the one with a port, else the first (a lone container)."""
    return containers[ingress_index(list(containers))]


def template_fingerprint(template: run_v2.RevisionTemplate) -> bytes:
    # Deterministic: map fields (resource limits, labels) would otherwise serialize in whatever order they
    # were built in, and an unchanged template would look like a new one.
    return run_v2.RevisionTemplate.pb(template).SerializeToString(deterministic=True)


def new_revision_name(service_id: str, generation: int) -> str:
    suffix = "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(3))
    return f"{service_id}-{generation:05d}-{suffix}"


def revision_from_template(
    service_name: str, revision_id: str, template: run_v2.RevisionTemplate, log_uri: str
) -> run_v2.Revision:
    revision = run_v2.Revision(
        name=f"{service_name}/revisions/{revision_id}",
        uid=secrets.token_hex(16),
        generation=1,
        service=service_name,
        create_time=now(),
        update_time=now(),
        log_uri=log_uri,
        reconciling=True,
        launch_stage="GA",
    )
    for field in TEMPLATE_TO_REVISION:
        if field in ("scaling", "vpc_access", "timeout", "node_selector", "gpu_zonal_redundancy_disabled"):
            if has_field(template, field):
                setattr(revision, field, getattr(template, field))
        else:
            setattr(revision, field, getattr(template, field))
    revision.conditions = [
        condition("Ready", State.CONDITION_RECONCILING, revision_reason=run_v2.Condition.RevisionReason.PENDING),
        condition("ContainerHealthy", State.CONDITION_PENDING),
        condition("ResourcesAvailable", State.CONDITION_PENDING),
    ]
    revision.etag = etag_of(revision)
    return revision


def condition(
    kind: str,
    state: run_v2.Condition.State,
    message: str = "",
    reason: run_v2.Condition.CommonReason | None = None,
    revision_reason: run_v2.Condition.RevisionReason | None = None,
) -> run_v2.Condition:
    result = run_v2.Condition(type_=kind, state=state, message=message, last_transition_time=now())
    if state == State.CONDITION_FAILED:
        result.severity = run_v2.Condition.Severity.ERROR
    if reason is not None:
        result.reason = reason
    if revision_reason is not None:
        result.revision_reason = revision_reason
    return result


def startup_probe(container: run_v2.Container) -> ProbeSpec:
    port = container.ports[0].container_port if container.ports else DEFAULT_PORT
    if not has_field(container, "startup_probe"):
        return ProbeSpec(
            "tcp",
            port,
            initial_delay_s=DEFAULT_PROBE["initial_delay_seconds"],
            period_s=DEFAULT_PROBE["period_seconds"],
            timeout_s=DEFAULT_PROBE["timeout_seconds"],
            failure_threshold=DEFAULT_PROBE["failure_threshold"],
            default=True,
        )
    return _probe_spec(container.startup_probe, port)


def liveness_probe(container: run_v2.Container) -> ProbeSpec | None:
    """The container's liveness probe, with the API's defaults (period 10, timeout 1, threshold 3); None without one
    (Cloud Run's only default probe is the TCP startup probe: "Configure container health checks")."""
    if not has_field(container, "liveness_probe"):
        return None
    return _probe_spec(container.liveness_probe, container.ports[0].container_port if container.ports else DEFAULT_PORT)


def _probe_spec(probe: run_v2.Probe, port: int) -> ProbeSpec:
    common = {
        "initial_delay_s": probe.initial_delay_seconds,
        "period_s": probe.period_seconds or 10,
        "timeout_s": probe.timeout_seconds or 1,
        "failure_threshold": probe.failure_threshold or 3,
    }
    if has_field(probe, "http_get"):
        return ProbeSpec("http", probe.http_get.port or port, probe.http_get.path or "/", **common)
    return ProbeSpec("tcp", probe.tcp_socket.port or port, **common)


def gcs_mounts(
    template: run_v2.RevisionTemplate, container: run_v2.Container, ctx: ControlContext | None = None
) -> list[dict]:
    """The container's Cloud Storage volume mounts in the vLLM stand-in's SANDBOX_MOUNTS shape; with ``ctx``, a
    read-write volume says whether the template's service account may write to it (``writable``, judged now)."""
    volumes = {v.name: v for v in template.volumes}
    mounts = []
    for mount in container.volume_mounts:
        volume = volumes.get(mount.name)
        if volume is None or not has_field(volume, "gcs"):
            continue
        only_dir = next((opt.split("=", 1)[1] for opt in volume.gcs.mount_options if opt.startswith("only-dir=")), None)
        writable = (
            ctx is not None
            and not volume.gcs.read_only
            and may_write(ctx, template.service_account, volume.gcs.bucket, only_dir)
        )
        mounts.append(
            {
                "mount_path": mount.mount_path,
                "bucket": volume.gcs.bucket,
                "only_dir": only_dir,
                "read_only": volume.gcs.read_only,
                "writable": writable,
            }
        )
    return mounts


def not_ready_message(revision_id: str, port: int, log_uri: str, exit_code: int | None, probe_configured: bool) -> str:
    """Cloud Run's message for a revision that never passed its startup probe (FACTS.md; terraform logs)."""
    exited = f"Container called exit({exit_code}). " if exit_code is not None else ""
    if probe_configured and exit_code is None:
        cause = "The user-provided container failed the configured startup probe checks."
    else:
        cause = (
            f"The user-provided container failed to start and listen on the port defined provided by the "
            f"PORT={port} environment variable within the allocated timeout. This can happen when the container "
            "port is misconfigured or if the timeout is too short. The health check timeout can be extended."
        )
    return (
        f"Revision '{revision_id}' is not ready and cannot serve traffic. {exited}{cause} Logs for this revision "
        f"might contain more information.\n\nLogs URL: {log_uri}"
    )
