"""The tail of a Cloud Run revision's container log, read from Cloud Logging.

Used when a revision fails to start: Cloud Run's own message only says the probe failed and points at the
logs, while the cause ("serve: command not found", a CUDA driver too old, a missing model path) is in the
container's last lines. The Logging API is called over REST through an authorized session (one read-only
method does not justify google-cloud-logging), with errors mapped as the client libraries map them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from google.api_core import exceptions as gexc

from blocks.target import GcpTarget
from tasks.common import clients
from tasks.common.gcp import gcp_errors, with_retry

LOG_VIEWER_ROLE = "roles/logging.viewer"
MAX_PAGE_SIZE = 1000  # entries.list refuses larger pages
# An empty page with a nextPageToken means the search ran out of time, not that the log is empty: keep
# asking, but not forever (a tail is a diagnostic and must not hang the flow that wants it).
MAX_PAGES = 20


def revision_filter(target: GcpTarget, service_id: str, revision: str) -> str:
    """The Logging query for one revision's entries in the target's region."""
    return "\n".join(
        [
            'resource.type="cloud_run_revision"',
            f'resource.labels.service_name="{service_id}"',
            f'resource.labels.revision_name="{revision}"',
            f'resource.labels.location="{target.region}"',
        ]
    )


def revision_log_tail(target: GcpTarget, service_id: str, revision: str, lines: int = 40) -> list[str]:
    """The last ``lines`` container log lines of ``revision`` of ``service_id``, oldest first.

    An empty list when the revision has logged nothing (or does not exist). Transient errors (429, 5xx) are
    retried; a 403 raises InfraError naming roles/logging.viewer (or the API to enable).
    """
    if lines <= 0:
        return []
    request: dict = {
        "resourceNames": [f"projects/{target.project}"],
        "filter": revision_filter(target, service_id, revision),
        # Newest first, so the tail is the first page however long the log is.
        "orderBy": "timestamp desc",
        "pageSize": min(lines, MAX_PAGE_SIZE),
    }
    newest_first: list[str] = []
    what = f"reading the logs of Cloud Run revision {revision} (service {service_id})"
    for entry in list_entries(target, request, what):
        if (text := entry_text(entry)) is not None:
            newest_first.append(text)
            if len(newest_first) >= lines:
                break
    return list(reversed(newest_first))


def list_entries(target: GcpTarget, request: dict, what: str) -> Iterator[dict]:
    """The LogEntries ``request`` (an entries.list body) finds, page after page, for at most MAX_PAGES pages.

    Transient errors (429, 5xx) are retried; a 403 raises InfraError naming roles/logging.viewer (or the API to
    enable), ``what`` saying what was being read.
    """
    rest = clients.logging_api(target)

    def page(body: dict) -> dict:
        response = rest.session.post(rest.url("entries:list"), json=body, timeout=60)
        if response.status_code >= 400:
            raise gexc.from_http_response(response)
        return response.json() if response.content else {}

    with gcp_errors("logging", LOG_VIEWER_ROLE, what, target):
        token = ""
        for _ in range(MAX_PAGES):
            body = {**request, "pageToken": token} if token else request
            answer = with_retry(lambda body=body: page(body))
            yield from answer.get("entries", [])
            token = answer.get("nextPageToken", "")
            if not token:
                return


def entry_text(entry: dict) -> str | None:
    """The line a LogEntry stands for: its text, or the message of a structured (JSON) line.

    None for entries without a payload a reader would want in a tail (request logs carry only httpRequest).
    """
    if "textPayload" in entry:
        return str(entry["textPayload"]).rstrip("\n")
    payload = entry.get("jsonPayload")
    if isinstance(payload, dict):
        message = payload.get("message")
        return str(message) if message is not None else _compact(payload)
    return None


def _compact(payload: dict) -> str:
    return json.dumps(payload, separators=(",", ":"), sort_keys=True)
