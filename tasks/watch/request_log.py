"""The requests Cloud Run refused a revision's callers itself (429: no instance free), read from its request log.

With every instance of a revision busy at its maximum (max instances x concurrency requests in flight), Cloud Run
holds a new request up to 3.5 x the service's average start-up time or 10 s, whichever is greater, then answers 429
(Cloud Run docs, "About instance autoscaling", Exceeding maximum instances). Those 429s never reach the container, so
``run.googleapis.com/request_count`` leaves them out: it "Excludes requests that are not reaching your container
instances (e.g. unauthorized requests or when maximum number of instances is reached)" (Google Cloud metrics, run).
Cloud Run still writes each one to the revision's request log, ``run.googleapis.com/requests`` ("Request logs
(services only)", Cloud Run docs, Logging and viewing logs): a WARNING entry with ``httpRequest.status`` 429 and "The
request was aborted because there was no available instance." (as quoted in public runbooks, e.g. cal-itp/data-infra).
The watch counts them there: a candidate too slow for its traffic throttles its users this way.

Cloud Logging shows an entry within seconds of the request, far sooner than Monitoring shows a sampling period, so a
step's 429s are all visible once its metrics are.
"""

from __future__ import annotations

from datetime import datetime

from google.api_core import exceptions as gexc

from blocks.target import GcpTarget
from tasks.common import clients
from tasks.common.gcp import gcp_errors, with_retry
from tasks.deploy.revision_logs import LOG_VIEWER_ROLE, MAX_PAGE_SIZE, revision_filter
from tasks.watch.monitoring import rfc3339

REQUEST_LOG = "run.googleapis.com%2Frequests"
THROTTLED = 429
MAX_PAGES = 50  # 50,000 refusals in one step: past any error budget; counting stops there rather than never ending


def throttled_filter(target: GcpTarget, service_id: str, revision: str, since: datetime, until: datetime) -> str:
    """The Logging query for ``revision``'s 429s in ``[since, until]``."""
    return "\n".join(
        [
            f'logName="projects/{target.project}/logs/{REQUEST_LOG}"',
            revision_filter(target, service_id, revision),
            f"httpRequest.status={THROTTLED}",
            f'timestamp>="{rfc3339(since)}"',
            f'timestamp<="{rfc3339(until)}"',
        ]
    )


def throttled_requests(target: GcpTarget, service_id: str, revision: str, since: datetime, until: datetime) -> int:
    """How many of ``revision``'s requests Cloud Run answered 429 itself in ``[since, until]``."""
    rest = clients.logging_api(target)
    request = {
        "resourceNames": [f"projects/{target.project}"],
        "filter": throttled_filter(target, service_id, revision, since, until),
        "pageSize": MAX_PAGE_SIZE,
    }

    def page(body: dict) -> dict:
        response = rest.session.post(rest.url("entries:list"), json=body, timeout=60)
        if response.status_code >= 400:
            raise gexc.from_http_response(response)
        return response.json() if response.content else {}

    count = 0
    what = f"counting the 429s of Cloud Run revision {revision} (service {service_id})"
    with gcp_errors("logging", LOG_VIEWER_ROLE, what, target):
        token = ""
        for _ in range(MAX_PAGES):
            answer = with_retry(lambda body={**request, **({"pageToken": token} if token else {})}: page(body))
            count += len(answer.get("entries", []))
            token = answer.get("nextPageToken", "")
            if not token:
                break
    return count
