"""Scale-down releases every GPU, tags included (issue 25, "revision-level against service-level scaling").

Cloud Run docs, "Set minimum instances for services": a revision-level minimum starts its instances whenever the
revision is in the traffic split, even at 0 %, or has a tag; a service-level minimum is shared by the revisions
serving traffic, and a tagged revision outside the split is not counted toward it. So the profile's min_instances
goes to the service level only: a `previous` or `candidate` tag left by a promotion that was killed mid-watch must
not keep a GPU warm past the evening's scale-down.
"""

from __future__ import annotations

import itertools

import httpx
import pytest
from google.cloud import run_v2
from google.protobuf import field_mask_pb2

from blocks.profile import ServingProfile
from flows.scale import scale_service
from tasks.common import clients
from tests.support.promotion import promote, run_service

pytestmark = pytest.mark.prefect
PROFILE = "e2e-warm-l4"
_ids = itertools.count()


def running(sb, service: str) -> list[str]:
    """The service's revisions that have a running instance (each holds a GPU on Cloud Run)."""
    return sorted(i["revision"].rsplit("/", 1)[1] for i in sb.run("GET", "/instances")
                  if f"/services/{service}/" in i["revision"] and i["running"])  # fmt: skip


@pytest.mark.usefixtures("raised_quota")  # two warm L4 revisions at once (64 GiB of a new project's 40)
def test_scale_down_releases_every_gpu_even_of_tagged_revisions(sb, flow_env):
    service = f"gpus-{next(_ids)}"
    ServingProfile.preset("l4", min_instances=1, max_instances=2).save(PROFILE, overwrite=True)
    old = promote(service, profile=PROFILE).serving_revision
    new = promote(service, profile=PROFILE, revision="dev").serving_revision
    current = run_service(flow_env, service)
    assert current.scaling.min_instance_count == 1  # the profile's minimum, at the service level
    # What a promotion killed during its watch leaves: the old revision tagged `previous` at 0 %, and warm.
    traffic = [
        run_v2.TrafficTarget(
            type_=run_v2.TrafficTargetAllocationType.TRAFFIC_TARGET_ALLOCATION_TYPE_REVISION,
            revision=r,
            percent=p,
            tag=t,
        )
        for r, p, t in ((new, 100, ""), (old, 0, "previous"))
    ]
    clients.run_services(flow_env).update_service(
        service=run_v2.Service(name=current.name, traffic=traffic),
        update_mask=field_mask_pb2.FieldMask(paths=["traffic"]),
    ).result()
    tag_url = next(s.uri for s in run_service(flow_env, service).traffic_statuses if s.tag == "previous")
    token = clients.identity_token(flow_env, current.uri).get_secret_value()  # the service URL is the audience
    answer = httpx.get(f"{tag_url}/health", headers={"Authorization": f"Bearer {token}"}, timeout=60)
    assert answer.status_code == 200
    assert running(sb, service) == sorted([old, new])

    scale_service(service=service, min_instances=0)
    sb.run("POST", "/idle")
    assert running(sb, service) == [], "a GPU is still held after the scale-down"
