"""The lines one cold start left in Cloud Logging: the instance a request started, and everything it logged.

Cloud Logging makes entries readable a few seconds after they are written, so the lines are read again until the
marks that end a start are there (the startup probe passed, or the API server said it was up) or a deadline passes;
then the phases say what they can. Entries are read oldest first through tasks/deploy/revision_logs.list_entries.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from blocks.target import GcpTarget
from tasks.deploy.revision_logs import MAX_PAGE_SIZE, entry_text, list_entries, revision_filter
from tasks.watch.coldstart.phases import LogLine, Marks, marks

SYSTEM_LOG = "run.googleapis.com%2Fvarlog%2Fsystem"
# Cloud Logging's clock and this machine's may disagree a little (both keep NTP time): lines are read from a little
# before the request. Less than the seconds a restart from zero takes (two service updates), so the instance before
# is not read as this request's.
CLOCK_SKEW = timedelta(seconds=1)
LOGS_DEADLINE_S = 120.0  # how long the lines may take to become readable


def entry_line(entry: dict) -> tuple[str, LogLine] | None:
    """(instance id, line) for a LogEntry of a revision; None for entries of no instance (request logs)."""
    text = entry_text(entry)
    instance = (entry.get("labels") or {}).get("instanceId")
    if text is None or not instance:
        return None
    at = datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00"))
    return instance, LogLine(at=at, text=text, system=entry.get("logName", "").endswith(SYSTEM_LOG))


def read_lines(target: GcpTarget, service_id: str, revision: str, since: datetime) -> dict[str, list[LogLine]]:
    """Each instance's lines since ``since``, oldest first."""
    query = f'{revision_filter(target, service_id, revision)}\ntimestamp>="{since.isoformat()}"'
    request = {"resourceNames": [f"projects/{target.project}"], "filter": query, "orderBy": "timestamp asc",
               "pageSize": MAX_PAGE_SIZE}  # fmt: skip
    by_instance: dict[str, list[LogLine]] = {}
    for entry in list_entries(target, request, f"reading the logs of {service_id}"):
        if (found := entry_line(entry)) is not None:
            by_instance.setdefault(found[0], []).append(found[1])
    return by_instance


def started_instance(by_instance: dict[str, list[LogLine]], answered: datetime) -> tuple[str, Marks] | None:
    """The instance that started last before the answer (its own "Starting new instance" line), with its marks: the
    lines are read from a little before the request, so an instance started just before it may be among them."""
    found = {instance: marks(lines) for instance, lines in by_instance.items()}
    started = [(m.instance_started, instance) for instance, m in found.items()
               if m.instance_started is not None and m.instance_started <= answered]  # fmt: skip
    if not started:
        return None
    _, instance = max(started)
    return instance, found[instance]


def cold_start_marks(
    target: GcpTarget, service_id: str, revision: str, sent: datetime, answered: datetime,
    deadline_s: float = LOGS_DEADLINE_S,
) -> tuple[str, Marks] | None:  # fmt: skip
    """The instance the request sent at ``sent`` (and answered at ``answered``) started, with its marks, read until its
    start's last marks are readable; None when the log has caught up past the answer and no instance started: the
    request found one running, and this was no cold start."""
    began, pause = time.monotonic(), 1.0
    while True:
        by_instance = read_lines(target, service_id, revision, sent - CLOCK_SKEW)
        found = started_instance(by_instance, answered)
        if found is not None and (found[1].probe_passed or found[1].api_ready) is not None:
            return found
        caught_up = any(line.at >= answered for lines in by_instance.values() for line in lines)
        if (found is None and caught_up) or time.monotonic() - began > deadline_s:
            return found
        time.sleep(pause)
        pause = min(pause * 2, 10.0)
