"""Cloud Run container logs as Cloud Logging entries, read from the log files the Cloud Run stand-in writes.

Each revision's instances append stdout and stderr to ``{run state}/{service}/{revision}/container.log``. A job's
task attempts write ``{run state}/_jobs/{job}/{execution}/task{i}/attempt{n}.stdout`` and ``.stderr`` (sandbox/control/
run/jobs.py): their entries have the ``cloud_run_job`` resource (job_name, location, project_id) and the labels Cloud
Run puts on them (``run.googleapis.com/execution_name``, ``task_index``, ``task_attempt``; real entries quoted in
public reports of Cloud Run jobs).
Lines are read incrementally and keep what they were given the first time they were seen (timestamp,
insertId, instance id), so repeated queries and page tokens see one stable, append-only log:

- Timestamps: the file holds no per-line times, but its order is what matters. New lines end at the file's
  mtime and are spaced 1 microsecond apart, always after the file's previous line, so each revision's log
  is strictly increasing in file order and later writes sort later.
- Stream and severity: the container's stdout and stderr share one file. Lines shaped like the vLLM
  stand-in's logger output (sandbox/vllm/logs.py; vLLM logs to stdout) are stdout; everything else (shell
  errors such as "serve: command not found", Python tracebacks) is stderr, as a real container writes them.
  Plain-text stdout becomes severity DEFAULT and stderr ERROR.
- A trailing line without its newline is held back while an instance may still be writing it, as a log
  agent does.

Request logs (``run.googleapis.com/requests``): Cloud Run writes one entry per request to a service ("Request logs
(services only)", Cloud Run docs, Logging and viewing logs), with ``httpRequest`` and a severity from its status. The
sandbox writes only the front end's own 429s there (``LogStore.record_request``; sandbox/control/run/throttle.py has
the entry's words and sources): a WARNING with the status and "The request was aborted because there was no available
instance. ...". Requests that reached an instance are not logged there (not modelled).
"""

from __future__ import annotations

import hashlib
import itertools
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import timestamp_pb2

from sandbox.control.logging.filters import SEVERITIES

RESOURCE_TYPE = "cloud_run_revision"
JOB_RESOURCE_TYPE = "cloud_run_job"
LOG_FILE = "container.log"
REQUEST_LOG = "requests"  # a revision's request log: entries only, never a file
# A 429's request log text (cal-itp/data-infra's runbook quotes it: sandbox/control/run/throttle.py).
ABORTED = (
    "The request was aborted because there was no available instance. Additional troubleshooting documentation can "
    "be found at: https://cloud.google.com/run/docs/troubleshooting#abort-request"
)
JOB_LOG_FILES = re.compile(r"^task(\d+)/attempt(\d+)\.(stdout|stderr)$")
STEP_NS = 1_000
STDOUT_LINE = re.compile(
    r"^(?:\(\w+ pid=\d+\) )?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d \[|INFO: {5})"
    r"|^\[sandbox\] (?!bad launcher contract)"
)


@dataclass
class LogLine:
    """One container log line with what Cloud Logging attached to it when it arrived."""

    seq: int  # global arrival order: breaks timestamp ties between files, part of page tokens
    ts_ns: int
    received_ns: int
    text: str
    stream: str  # "stdout", "stderr", or "requests" (the request log)
    instance_id: str
    insert_id: str
    http_request: dict | None = None  # a request log entry's httpRequest

    @property
    def severity(self) -> str:
        if self.http_request is not None:  # a request's status decides (a 429: WARNING, cal-itp/data-infra's runbook)
            status = int(self.http_request.get("status", 0))
            return "ERROR" if status >= 500 else "WARNING" if status >= 400 else "INFO"
        return "ERROR" if self.stream == "stderr" else "DEFAULT"


@dataclass
class RevisionLog:
    """The entries read so far from one revision's container log file."""

    path: Path
    service_id: str
    revision: str
    location: str
    identity: tuple[int, int] = (0, 0)  # (st_dev, st_ino): a replaced file starts over
    consumed: int = 0
    lines: list[LogLine] = field(default_factory=list)
    instance_id: str = ""
    resource_type: str = RESOURCE_TYPE
    stream: str = ""  # "stdout" or "stderr" when the file holds one stream (a job's); "" = told apart by shape
    entry_labels: dict[str, str] = field(default_factory=dict)  # beside instanceId

    def labels(self, project: str) -> dict[str, str]:
        if self.resource_type == JOB_RESOURCE_TYPE:
            return {"job_name": self.service_id, "location": self.location, "project_id": project}
        return {
            "service_name": self.service_id,
            "revision_name": self.revision,
            "location": self.location,
            "configuration_name": self.service_id,
            "project_id": project,
        }


class LogStore:
    """Reads revision log files on demand and keeps their entries stable across queries."""

    def __init__(self, run_state_dir: Path, default_location: str) -> None:
        self.run_state_dir = run_state_dir
        self.default_location = default_location
        self.logs: dict[Path, RevisionLog] = {}
        self._seq = itertools.count(1)

    def refresh(
        self, locations: dict[tuple[str, str], str], writers: dict[Path, tuple[str, bool]]
    ) -> list[RevisionLog]:
        """Read what was appended to every revision log since the last call.

        ``locations`` maps (service, revision) to the region the Cloud Run stand-in knows it in; ``writers``
        maps a log file to its instance's id and whether that instance's process is still running.
        """
        for path in sorted(self.run_state_dir.glob(f"*/*/{LOG_FILE}")):
            service_id, revision = path.parts[-3], path.parts[-2]
            log = self.logs.get(path)
            if log is None:
                location = locations.get((service_id, revision), self.default_location)
                log = self.logs[path] = RevisionLog(path, service_id, revision, location)
            self._read(log, writers)
        for path in sorted(self.run_state_dir.glob("_jobs/*/*/task*/attempt*.*")):
            found = JOB_LOG_FILES.match(f"{path.parent.name}/{path.name}")
            if found is None:
                continue
            log = self.logs.get(path)
            if log is None:
                job, execution = path.parts[-4], path.parts[-3]
                location = locations.get((job, execution), self.default_location)
                labels = {
                    "run.googleapis.com/execution_name": execution,
                    "run.googleapis.com/task_index": found.group(1),
                    "run.googleapis.com/task_attempt": found.group(2),
                }
                log = self.logs[path] = RevisionLog(
                    path, job, execution, location, resource_type=JOB_RESOURCE_TYPE, stream=found.group(3),
                    entry_labels=labels,
                )  # fmt: skip
            self._read(log, writers)
        return list(self.logs.values())

    def record_request(self, service_id: str, revision: str, location: str, http_request: dict, text: str) -> None:
        """A request log entry of ``revision``, written now (no file behind it: the front end reports it)."""
        path = self.run_state_dir / service_id / revision / REQUEST_LOG
        log = self.logs.get(path)
        if log is None:
            log = self.logs[path] = RevisionLog(path, service_id, revision, location, stream="requests")
        seq = next(self._seq)
        now = max(time.time_ns(), log.lines[-1].ts_ns + STEP_NS if log.lines else 0)
        insert_id = hashlib.sha1(f"{path}:{seq}".encode()).hexdigest()[:20]
        log.lines.append(LogLine(seq, now, now, text, "requests", "", insert_id, dict(http_request)))

    def _read(self, log: RevisionLog, writers: dict[Path, tuple[str, bool]]) -> None:
        try:
            stat = log.path.stat()
            identity = (stat.st_dev, stat.st_ino)
            if identity != log.identity or stat.st_size < log.consumed:
                log.identity, log.consumed = identity, 0  # a new file under the same name: read it from the start
            if stat.st_size == log.consumed:
                return
            with log.path.open("rb") as handle:
                handle.seek(log.consumed)
                data = handle.read()
        except FileNotFoundError:
            return
        instance_id, writing = writers.get(log.path, ("", False))
        # Lines are credited to the instance that owns the file when they are first read; a file read only
        # after its instance was retired keeps an id of its own.
        log.instance_id = instance_id or log.instance_id or _instance_id(f"{log.path}:{identity}")
        pieces = data.split(b"\n")
        complete, partial = pieces[:-1], pieces[-1]
        if partial and not writing:
            complete.append(partial)  # the writer is gone: its last unterminated line is all there will be
            partial = b""
        consumed_from = log.consumed
        log.consumed += len(data) - len(partial)
        self._append(log, consumed_from, complete, stat.st_mtime_ns)

    def _append(self, log: RevisionLog, start: int, raw_lines: list[bytes], mtime_ns: int) -> None:
        kept: list[tuple[int, str]] = []
        offset = start
        for raw in raw_lines:
            text = raw.decode("utf-8", "replace").rstrip("\r")
            if text.strip():  # the log agent sends no entry for an empty line
                kept.append((offset, text))
            offset += len(raw) + 1
        if not kept:
            return
        last = log.lines[-1].ts_ns if log.lines else 0
        end = max(mtime_ns, last + len(kept) * STEP_NS)
        received = max(time.time_ns(), end)
        for index, (at, text) in enumerate(kept):
            log.lines.append(
                LogLine(
                    seq=next(self._seq),
                    ts_ns=end - (len(kept) - 1 - index) * STEP_NS,
                    received_ns=received,
                    text=text,
                    stream=log.stream or ("stdout" if STDOUT_LINE.match(text) else "stderr"),
                    instance_id=log.instance_id,
                    insert_id=hashlib.sha1(f"{log.path}:{log.identity}:{at}".encode()).hexdigest()[:20],
                )
            )


def instance_id_for(revision_name: str, pid: int | None) -> str:
    """A stable id for one instance (one container process) of a revision, hex like Cloud Run's."""
    return _instance_id(f"{revision_name}:{pid}")


def _instance_id(seed: str) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()


def rfc3339(ns: int) -> str:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromNanoseconds(ns)
    return stamp.ToJsonString()


def entry_json(log: RevisionLog, line: LogLine, project: str) -> dict:
    """The LogEntry as entries.list returns it for a Cloud Run container log line."""
    entry = {
        "textPayload": line.text,
        "insertId": line.insert_id,
        "resource": {"type": log.resource_type, "labels": log.labels(project)},
        "timestamp": rfc3339(line.ts_ns),
        "severity": line.severity,
        "labels": _entry_labels(log, line),
        "logName": log_name(project, line.stream),
        "receiveTimestamp": rfc3339(line.received_ns),
    }
    if line.http_request is not None:
        entry["httpRequest"] = line.http_request
    if not entry["labels"]:
        del entry["labels"]
    return entry


def _entry_labels(log: RevisionLog, line: LogLine) -> dict[str, str]:
    """The entry's own labels: its instance (none for a request no instance took) and the log's."""
    return {**({"instanceId": line.instance_id} if line.instance_id else {}), **log.entry_labels}


def log_name(project: str, stream: str) -> str:
    return f"projects/{project}/logs/run.googleapis.com%2F{stream}"


def field_value(log: RevisionLog, line: LogLine, project: str, name: str) -> str | int | None:
    """The value a filter clause on ``name`` compares against; None for a field the entry does not have (no
    comparison matches it, as in Logging's query language)."""
    if name.startswith("resource."):
        return resource_value(log, project, name)
    if name.startswith("labels."):
        return _entry_labels(log, line).get(name.removeprefix("labels."), "")
    if name == "httpRequest.status":
        return int(line.http_request.get("status", 0)) if line.http_request is not None else None
    if name == "logName":
        return log_name(project, line.stream)
    if name == "severity":
        return SEVERITIES[line.severity]
    if name == "timestamp":
        return line.ts_ns
    raise KeyError(name)


def resource_value(log: RevisionLog, project: str, name: str) -> str:
    """``resource.type`` or ``resource.labels.<label>`` of every entry of ``log``."""
    if name == "resource.type":
        return log.resource_type
    return log.labels(project).get(name.removeprefix("resource.labels."), "")


def all_lines(logs: Iterable[RevisionLog]) -> Iterable[tuple[RevisionLog, LogLine]]:
    for log in logs:
        for line in log.lines:
            yield log, line
