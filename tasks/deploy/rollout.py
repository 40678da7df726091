"""The `replace` rollout: for a GPU quota that cannot hold the candidate beside the serving revision.

Zero-downtime delivery starts the candidate while the serving revision keeps its instances (and, during the watch,
its `previous` tag keeps one warm), so a re-promotion needs one GPU more than ``max_instances``. On the RTX Pro 6000's
default quota of 1 that is impossible. `replace` frees the serving instance first, accepting downtime:

1. the service is switched to manual scaling with 0 instances: the revisions taking traffic run none (Cloud Run
   docs, "Manual scaling": the count "is divided among all revisions with specified traffic"; a revision left
   without one answers as a disabled revision), so the serving revision's GPU is released, where moving traffic
   away would leave an idle instance holding it for up to 15 minutes ("Cloud Run may keep some instances idle for
   a maximum of 15 minutes");
2. the candidate is deployed at 0 % with its tag: a revision active only through a tag is outside the manual
   count and scales to one instance for its tag URL's traffic, so it starts on the freed GPU and is verified there;
3. one update moves all traffic to it and switches back to automatic scaling with the service-level minimum and
   maximum it had (both given: the docs say that with neither, both would inherit the manual count, 0).

The downtime runs from step 1 to step 3. A candidate that does not start (after waiting for Cloud Run to release the
stopped instance's GPU, tasks/cloudrun.deploy_when_startable) or fails verification is abandoned and the service
switched back to automatic: the old revision starts again on its next request (a cold start on the freed GPU).
"""

from __future__ import annotations

from typing import Literal

from google.cloud import run_v2
from prefect import task

from blocks.target import GcpTarget
from tasks.common import clients
from tasks.common.gcp import GCP_RETRY, gcp_errors
from tasks.deploy.cloudrun import BY_REVISION, service_path, update_fields

Rollout = Literal["zero-downtime", "replace"]
MANUAL = run_v2.ServiceScaling.ScalingMode.MANUAL
AUTOMATIC = run_v2.ServiceScaling.ScalingMode.AUTOMATIC


def stop_serving(target: GcpTarget, service_id: str) -> run_v2.ServiceScaling:
    """Manual scaling with 0 instances: the serving revision's instances stop and free their GPUs. Returns the
    service-level scaling it had, for ``resume_serving``."""
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


run_stop_serving = task(name="run_stop_serving")(stop_serving)
run_resume_serving = task(name="run_resume_serving")(resume_serving)
