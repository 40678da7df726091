"""Cloud Run jobs as the sandbox's job tests drive them, through googleapiclient's run v2 client (what prefect-gcp's
cloud-run-v2 worker uses): a job body running Python, its creation, a run watched to completion, and its logs."""

from __future__ import annotations

import itertools
import time
from urllib.parse import parse_qs, urlparse

import httpx

MODEL_GARDEN = "us-docker.pkg.dev/vertex-ai/vertex-vision-model-garden-dockers/pytorch-vllm-serve:20250312_0916_RC01"
_ids = itertools.count()


def python_job(code: str, **template: object) -> dict:
    """A job body whose container runs ``python -c code`` (the image's Python is the host's: job_tasks.py)."""
    task = {"containers": [{"image": MODEL_GARDEN, "command": ["python", "-c", code]}], "maxRetries": 0}
    task.update({k: v for k, v in template.items() if k in ("maxRetries", "timeout", "serviceAccount")})
    for key in ("maxRetries", "timeout", "serviceAccount"):
        template.pop(key, None)
    return {"template": {"template": task, **template}}


def create(locations, parent: str, body: dict) -> str:
    job_id = f"job-{next(_ids)}"
    locations.jobs().create(parent=parent, jobId=job_id, body=body).execute()
    return f"{parent}/jobs/{job_id}"


def run_to_completion(locations, job: str, timeout: float = 300) -> dict:
    """jobs.run, then executions.get until completionTime, as the worker watches an execution."""
    operation = locations.jobs().run(name=job, body={}).execute()
    name = operation["metadata"]["name"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        execution = locations.jobs().executions().get(name=name).execute()
        if "completionTime" in execution:
            return execution
        time.sleep(0.1)
    raise TimeoutError(f"{name} did not complete in {timeout} s")


def completed(execution: dict) -> dict:
    return next(c for c in execution["conditions"] if c["type"] == "Completed")


def logs(sandbox, execution: dict, stream: str = "stdout") -> str:
    """What the execution's logUri shows: its advancedFilter run through Cloud Logging's entries.list."""
    query = parse_qs(urlparse(execution["logUri"]).query)
    project, log_filter = query["project"][0], query["advancedFilter"][0]
    log_filter += f'\nlogName="projects/{project}/logs/run.googleapis.com%2F{stream}"'
    control = sandbox.info["control_url"]
    body = {"resourceNames": [f"projects/{project}"], "filter": log_filter, "orderBy": "timestamp asc"}
    entries = httpx.post(f"{control}/v2/entries:list", json=body, timeout=30).json().get("entries", [])
    return "\n".join(e["textPayload"] for e in entries)
