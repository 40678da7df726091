"""Cloud Run logs as Cloud Logging entries, read from the files the Cloud Run stand-in writes.

Each revision's instances append stdout and stderr to ``{run state}/{service}/{revision}/container.log``, and the
launcher records beside each line when it read it, from which stream, for which instance (``container.log.lines``,
sandbox/control/run/container_log.py). Cloud Run's own lines about the revision's instances (why one started, its
startup probe passing, its end) are in ``system.log`` beside them, served as ``run.googleapis.com/varlog/system``
with their own severity and the labels ``instanceId`` and ``container_name`` ("platform-generated ... written to
varlog/system", Cloud Run docs, "Logging and viewing logs"; an entry's shape as a public report quotes it in full,
reference corpus id 25499037665). A job's task attempts write ``{run state}/_jobs/{job}/{execution}/task{i}/
attempt{n}.stdout`` and ``.stderr`` (sandbox/control/run/jobs.py): their entries have the ``cloud_run_job`` resource
(job_name, location, project_id) and the labels Cloud Run puts on them (``run.googleapis.com/execution_name``,
``task_index``, ``task_attempt``; real entries quoted in public reports of Cloud Run jobs).
Lines are read incrementally and keep what they were given the first time they were seen (timestamp,
insertId, instance id), so repeated queries and page tokens see one stable, append-only log:

- Timestamps: a container line has the time the launcher read it (its record). A line without a record (a job's, a
  file written before records were kept, a note the sandbox wrote with no instance running) follows the line before
  it by 1 microsecond; when none of the lines read together has a record, they end at the file's mtime and are
  spaced 1 microsecond apart, always after the file's previous line.
- Stream and severity: a recorded line's stream is the pipe it came from. Otherwise (one file, two streams), lines
  shaped like the vLLM stand-in's logger output (sandbox/vllm/logs.py; vLLM logs to stdout) are stdout, everything
  else (shell errors such as "serve: command not found", Python tracebacks) stderr. Plain-text stdout becomes
  severity DEFAULT and stderr ERROR; Cloud Run's own lines carry theirs (INFO, WARNING, ERROR).
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
import json
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from google.protobuf import timestamp_pb2

from sandbox.control.logging.filters import SEVERITIES
from sandbox.control.run.container_log import LOG_FILE, RECORD_FILE, SYSTEM_LOG_FILE

RESOURCE_TYPE = "cloud_run_revision"
JOB_RESOURCE_TYPE = "cloud_run_job"
REQUEST_LOG = "requests"  # a revision's request log: entries only, never a file
SYSTEM_LOG = "varlog/system"  # Cloud Run's own lines about a revision's instances
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
    level: str = ""  # the severity Cloud Run gave one of its own lines
    container: str = ""  # the container one of Cloud Run's own lines is about (its container_name label)

    @property
    def severity(self) -> str:
        if self.level:
            return self.level
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
    # A container log's records (container_log.py) not yet matched to a line: offset -> (time_ns, stream, instance).
    records: dict[int, tuple[int, str, str]] = field(default_factory=dict)
    records_consumed: int = 0

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
        for path in sorted(self.run_state_dir.glob(f"*/*/{SYSTEM_LOG_FILE}")):
            service_id, revision = path.parts[-3], path.parts[-2]
            log = self.logs.get(path)
            if log is None:
                location = locations.get((service_id, revision), self.default_location)
                log = self.logs[path] = RevisionLog(path, service_id, revision, location, stream=SYSTEM_LOG)
            self._read_system(log)
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

    def _new_data(self, log: RevisionLog) -> tuple[bytes, int] | None:
        """What was appended to ``log``'s file since it was last read, and the file's mtime; None when nothing was.
        A new file under the same name (or a shorter one) is read from the start."""
        try:
            stat = log.path.stat()
            identity = (stat.st_dev, stat.st_ino)
            if identity != log.identity or stat.st_size < log.consumed:
                log.identity, log.consumed = identity, 0
                log.records, log.records_consumed = {}, 0
            if stat.st_size == log.consumed:
                return None
            with log.path.open("rb") as handle:
                handle.seek(log.consumed)
                return handle.read(), stat.st_mtime_ns
        except FileNotFoundError:
            return None

    def _read(self, log: RevisionLog, writers: dict[Path, tuple[str, bool]]) -> None:
        new = self._new_data(log)
        if new is None:
            return
        data, mtime_ns = new
        if not log.stream:
            self._read_records(log)
        instance_id, writing = writers.get(log.path, ("", False))
        # Lines are credited to the instance that owns the file when they are first read; a file read only
        # after its instance was retired keeps an id of its own.
        log.instance_id = instance_id or log.instance_id or _instance_id(f"{log.path}:{log.identity}")
        pieces = data.split(b"\n")
        complete, partial = pieces[:-1], pieces[-1]
        if partial and not writing:
            complete.append(partial)  # the writer is gone: its last unterminated line is all there will be
            partial = b""
        consumed_from = log.consumed
        log.consumed += len(data) - len(partial)
        self._append(log, consumed_from, complete, mtime_ns)

    def _read_records(self, log: RevisionLog) -> None:
        """The launcher's records of the lines appended to ``log`` (container_log.py), read up to the last whole one."""
        path = log.path.with_name(RECORD_FILE)
        try:
            with path.open("rb") as handle:
                handle.seek(log.records_consumed)
                data = handle.read()
        except FileNotFoundError:
            return
        whole = data[: data.rfind(b"\n") + 1]
        log.records_consumed += len(whole)
        for raw in whole.decode("ascii", "replace").splitlines():
            parts = raw.split()
            if len(parts) == 4 and parts[0].isdigit() and parts[1].isdigit():
                log.records[int(parts[0])] = (int(parts[1]), parts[2], parts[3])

    def _append(self, log: RevisionLog, start: int, raw_lines: list[bytes], mtime_ns: int) -> None:
        kept: list[tuple[int, str, tuple[int, str, str] | None]] = []
        offset = start
        for raw in raw_lines:
            text = raw.decode("utf-8", "replace").rstrip("\r")
            record = log.records.pop(offset, None)
            if text.strip():  # the log agent sends no entry for an empty line
                kept.append((offset, text, record))
            offset += len(raw) + 1
        if not kept:
            return
        stamps = _stamps(log.lines[-1].ts_ns if log.lines else 0, [record for _, _, record in kept], mtime_ns)
        now = time.time_ns()
        for (at, text, record), ts_ns in zip(kept, stamps, strict=True):
            stream = record[1] if record else log.stream or ("stdout" if STDOUT_LINE.match(text) else "stderr")
            log.lines.append(
                self._line(log, at, ts_ns, now, text, stream, instance_id=record[2] if record else log.instance_id)
            )

    def _read_system(self, log: RevisionLog) -> None:
        """Cloud Run's own lines appended to a revision's system log (one JSON object a line, container_log.py)."""
        new = self._new_data(log)
        if new is None:
            return
        data, _ = new
        whole = data[: data.rfind(b"\n") + 1]  # a line is written at once; a reader never waits for the rest long
        start = log.consumed
        log.consumed += len(whole)
        now = time.time_ns()
        for raw in whole.split(b"\n")[:-1]:
            at, start = start, start + len(raw) + 1
            try:
                record = json.loads(raw)
                ts_ns, text = int(record["t"]), str(record["text"])
            except (ValueError, KeyError, TypeError):
                continue
            log.lines.append(
                self._line(log, at, ts_ns, now, text, SYSTEM_LOG, instance_id=str(record.get("instance", "")),
                           level=str(record.get("severity", "INFO")), container=str(record.get("container", "")))
            )  # fmt: skip

    def _line(self, log: RevisionLog, at: int, ts_ns: int, now: int, text: str, stream: str, **labels: str) -> LogLine:
        """The entry of the line that starts at byte ``at`` of ``log``'s file: its insertId is stable across reads."""
        insert_id = hashlib.sha1(f"{log.path}:{log.identity}:{at}".encode()).hexdigest()[:20]
        return LogLine(seq=next(self._seq), ts_ns=ts_ns, received_ns=max(now, ts_ns), text=text, stream=stream,
                       insert_id=insert_id, **labels)  # fmt: skip


def _stamps(last_ns: int, records: list[tuple[int, str, str] | None], mtime_ns: int) -> list[int]:
    """The timestamps of lines read together: a recorded line's own; one without follows the line before it by
    ``STEP_NS`` (the first ones precede the first recorded line). When none is recorded, they end at the file's mtime,
    after the file's previous line (``last_ns``)."""
    first = next(((index, record[0]) for index, record in enumerate(records) if record is not None), None)
    if first is None:
        end = max(mtime_ns, last_ns + len(records) * STEP_NS)
        return [end - (len(records) - 1 - index) * STEP_NS for index in range(len(records))]
    previous = last_ns or first[1] - (first[0] + 1) * STEP_NS
    stamps = []
    for record in records:
        previous = record[0] if record is not None else previous + STEP_NS
        stamps.append(previous)
    return stamps


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
    """The entry's own labels: its instance (none for a request no instance took), the container one of Cloud Run's
    own lines is about, and the log's."""
    labels = {"instanceId": line.instance_id} if line.instance_id else {}
    if line.container:
        labels["container_name"] = line.container
    return {**labels, **log.entry_labels}


def log_name(project: str, stream: str) -> str:
    """``projects/P/logs/run.googleapis.com%2F<stream>``: the log id URL-encoded, slashes included (e.g.
    ``run.googleapis.com%2Fvarlog%2Fsystem``)."""
    return f"projects/{project}/logs/{quote(f'run.googleapis.com/{stream}', safe='')}"


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
