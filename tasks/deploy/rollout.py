"""The `replace` rollout: for a GPU quota that cannot hold the candidate beside the serving revision.

Zero-downtime delivery starts the candidate while the serving revision keeps its instances (and, during the watch,
its `previous` tag keeps one warm), so a re-promotion needs one GPU more than ``max_instances``. On the RTX Pro 6000's
default quota of 1 that is impossible. `replace` stops the serving instance first, accepting downtime:

1. the service is switched to manual scaling with 0 instances: the revisions taking traffic run none (Cloud Run
   docs, "Manual scaling": the count "is divided among all revisions with specified traffic"; a revision left
   without one answers as a disabled revision), so its instances stop, where moving traffic away would leave an
   idle instance holding the GPU for up to 15 minutes ("Cloud Run may keep some instances idle for a maximum of 15
   minutes"). Cloud Run releases a stopped instance's GPU only some time later (Google publishes no figure);
2. the candidate is deployed at 0 % with its tag: a revision active only through a tag is outside the manual
   count and scales to one instance for its tag URL's traffic. Until the stopped instance's GPU is released its
   revision is refused on the quota, and it is deployed again, for up to GPU_RELEASE_DEADLINE_S
   (tasks/deploy/cloudrun.deploy_when_startable); then it starts on that GPU and is verified there;
3. one update moves all traffic to it and switches back to automatic scaling with the service-level minimum and
   maximum it had (both given: the docs say that with neither, both would inherit the manual count, 0).

The downtime runs from step 1 to step 3. A candidate that does not start, or fails verification, is abandoned and the
service switched back to automatic, all traffic on the old revision: it starts again on its next request, a cold
start that needs a free GPU, and nothing here waits for one. On a quota of one GPU, that GPU is free only once Cloud
Run has released it: from the old revision's stopped instance (a candidate refused on the quota until the deadline),
from the candidate's (one that crashed at start), or, after a failed verification, from the candidate's instance,
which Cloud Run may keep idle for up to 15 minutes once its tag is gone, as in step 1. Until then the old revision
cannot start, and the downtime goes on.
"""

from __future__ import annotations

import time
from typing import Literal

import httpx
from google.cloud import run_v2
from prefect import task

from blocks.target import GcpTarget
from tasks.common import clients
from tasks.common.gcp import GCP_RETRY, gcp_errors
from tasks.deploy.cloudrun import BY_REVISION, GPU_RELEASE_DEADLINE_S, service_path, update_fields

Rollout = Literal["zero-downtime", "replace"]
MANUAL = run_v2.ServiceScaling.ScalingMode.MANUAL
AUTOMATIC = run_v2.ServiceScaling.ScalingMode.AUTOMATIC


def stop_serving(target: GcpTarget, service_id: str) -> run_v2.ServiceScaling:
    """Manual scaling with 0 instances: the serving revision's instances stop (Cloud Run releases their GPUs some time
    later: deploy_when_startable waits for that). Returns the service-level scaling it had, for ``resume_serving``."""
    name = service_path(target, service_id)
    with gcp_errors("run", "roles/run.developer", f"stopping {service_id} for a replace rollout", target):
        before = clients.run_services(target).get_service(name=name, retry=GCP_RETRY).scaling
        if before.scaling_mode != MANUAL:  # a rerun after a run killed here finds it stopped already
            stopped = run_v2.ServiceScaling(scaling_mode=MANUAL, manual_instance_count=0)
            update_fields(target, run_v2.Service(name=name, scaling=stopped), ["scaling"])
    if before.scaling_mode == MANUAL:  # what that killed run stopped: automatic scaling from 0 comes back
        return run_v2.ServiceScaling(scaling_mode=AUTOMATIC)
    return run_v2.ServiceScaling(before)


def resume_serving(
    target: GcpTarget, service_id: str, scaling: run_v2.ServiceScaling, max_instances: int,
    revision: str | None = None,
) -> None:  # fmt: skip
    """Automatic scaling again, with ``scaling``'s minimum and its maximum (``max_instances`` when it had none: the
    docs ask for both or neither); with ``revision``, all traffic to it in the same update, so that it never takes
    traffic while it may run no instance."""
    name = service_path(target, service_id)
    automatic = run_v2.ServiceScaling(
        scaling_mode=AUTOMATIC,
        min_instance_count=scaling.min_instance_count,
        max_instance_count=scaling.max_instance_count or max_instances,
    )
    service = run_v2.Service(name=name, scaling=automatic)
    paths = ["scaling"]
    if revision is not None:
        service.traffic = [run_v2.TrafficTarget(type_=BY_REVISION, revision=revision, percent=100)]
        paths.append("traffic")
    with gcp_errors("run", "roles/run.developer", f"resuming {service_id} after a replace rollout", target):
        update_fields(target, service, paths)


def wait_answering(target: GcpTarget, service_id: str, deadline_s: float = GPU_RELEASE_DEADLINE_S) -> float | None:
    """Seconds until the service URL's /health answers 200 again (its revision cold-started on a free GPU), or None
    when it did not within ``deadline_s``: Cloud Run releases a stopped instance's GPU only some time later, and
    until then the old revision's instance cannot start. Probes back off from half a second to 15 s."""
    name = service_path(target, service_id)
    with gcp_errors("run", "roles/run.viewer", f"reading {service_id}", target):
        url = clients.run_services(target).get_service(name=name, retry=GCP_RETRY).uri
    token = clients.identity_token(target, url)
    started, pause = time.monotonic(), 0.5
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token.get_secret_value()}"}) as client:
        while time.monotonic() - started < deadline_s:
            try:
                if client.get("/health", timeout=60).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass  # not up yet: the front end has no instance for it
            time.sleep(pause)
            pause = min(pause * 2, 15.0)
    return None


run_stop_serving = task(name="run_stop_serving")(stop_serving)
run_wait_answering = task(name="run_wait_answering")(wait_answering)
run_resume_serving = task(name="run_resume_serving")(resume_serving)
