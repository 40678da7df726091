"""Cloud Run: deploy a tagged candidate revision with no traffic, then promote it or leave traffic alone.

None of the seeds' tools does this: they `gcloud run deploy` and hope. Here a new revision is reachable only
at its `candidate` tag URL until tasks/deploy/probe.py has verified it; then it takes 100 % and the previous revision
is kept, named, for rollback. On any failure traffic stays where it was and the tag is removed.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from google.api_core import exceptions as gexc
from google.cloud import run_v2
from google.protobuf import field_mask_pb2
from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, Field

from blocks.target import GcpTarget
from tasks.common import clients
from tasks.common.gcp import GCP_RETRY, InfraError, gcp_errors, wait_for
from tasks.common.logs import run_logger
from tasks.common.naming import CANDIDATE_TAG, PREVIOUS_TAG
from tasks.deploy import compile_cache, verdicts
from tasks.deploy.probe import Verification, VerifyOptions, verify
from tasks.deploy.revision_logs import revision_log_tail
from tasks.deploy.traffic import canary_split, rescaled
from tasks.infra import propagation
from tasks.infra.propagation import when_visible
from tasks.infra.teardown import delete_service

BY_REVISION = run_v2.TrafficTargetAllocationType.TRAFFIC_TARGET_ALLOCATION_TYPE_REVISION
LATEST = run_v2.TrafficTargetAllocationType.TRAFFIC_TARGET_ALLOCATION_TYPE_LATEST
Ready = run_v2.Condition.State
MAX_SERVICE_ID = 46 - len(CANDIDATE_TAG)
# launch_stage goes with the template: a preview GPU in the new revision needs BETA on the service.
PROMOTED_FIELDS = ["template", "traffic", "labels", "ingress", "invoker_iam_disabled", "launch_stage"]


# Names one revision spec may take (``wanted``, ``wanted-2``, ...: a failed revision keeps its name): enough for the
# redeploys of a grant that takes Google's worst case to propagate (tasks/propagation.redeploy_pauses) when a run
# starts with them all free, a bound on reruns of a spec that keeps failing (they share the names).
REVISION_NAMES = 20


def revision_names(wanted: str) -> list[str]:
    """The names a revision of the spec named ``wanted`` may have, in the order deploys take them."""
    return [wanted, *(f"{wanted[:60]}-{attempt}" for attempt in range(2, REVISION_NAMES + 1))]


class DeployFailed(RuntimeError):
    """The candidate revision never became ready; the message carries Cloud Run's reason and its logs."""

    def __init__(self, message: str, first_deploy: bool = False) -> None:
        super().__init__(message)
        self.first_deploy = first_deploy  # nothing served beside it


class Candidate(BaseModel):
    service: str
    service_url: str
    revision: str
    url: str = Field(description="Where the candidate answers: its tag URL, or the service URL when unchanged.")
    previous_traffic: list[tuple[str, int]] = Field(default_factory=list)
    first_deploy: bool = False
    unchanged: bool = Field(False, description="This revision already serves all traffic: nothing to do.")
    watch_pending: bool = Field(
        False, description="It serves all traffic, but the run that promoted it died before its watch ended."
    )
    previous_url: str | None = Field(None, description="The tag URL of the revision kept warm during a watch.")

    @property
    def left_serving(self) -> list[tuple[str, int]]:
        """The traffic as the deploy left it: as before, or all on the candidate when it created the service."""
        return [(self.revision, 100)] if self.first_deploy else self.previous_traffic

    @property
    def previous_revision(self) -> str | None:
        serving = [revision for revision, percent in self.previous_traffic if percent]
        return serving[0] if len(serving) == 1 else None


def service_id_for(repo_id: str) -> str:
    """A Cloud Run service name from a repo id: lowercase, dashes, a letter first, room for the tag URL."""
    name = re.sub(r"[^a-z0-9]+", "-", repo_id.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = f"vllm-{name}"
    return name[:MAX_SERVICE_ID].rstrip("-")


def service_path(target: GcpTarget, service_id: str) -> str:
    return f"{target.location_path}/services/{service_id}"


def _short(name: str) -> str:
    return name.rsplit("/", 1)[-1]


def _serving(service: run_v2.Service) -> list[tuple[str, int]]:
    return [(s.revision, s.percent) for s in service.traffic_statuses if s.percent > 0]


def serving_traffic(target: GcpTarget, service_id: str) -> list[tuple[str, int]]:
    """The revisions that take traffic now, with their shares."""
    with gcp_errors("run", "roles/run.viewer", f"reading service {service_id}", target):
        service = clients.run_services(target).get_service(name=service_path(target, service_id), retry=GCP_RETRY)
    return _serving(service)


def _ready(revision: run_v2.Revision) -> bool:
    return any(c.type_ == "Ready" and c.state == Ready.CONDITION_SUCCEEDED for c in revision.conditions)


def update_fields(target: GcpTarget, service: run_v2.Service, paths: list[str]) -> run_v2.Service:
    """Change only ``paths`` of the service (``service.name`` names it), waited for; no new revision unless the
    template is among them."""
    operation = clients.run_services(target).update_service(
        service=service, update_mask=field_mask_pb2.FieldMask(paths=paths), retry=GCP_RETRY
    )
    return wait_for(operation, clients.operation_polling(target))


def _set_traffic(target: GcpTarget, service_id: str, traffic: list[run_v2.TrafficTarget]) -> run_v2.Service:
    """Change only the traffic split (no new revision)."""
    return update_fields(target, run_v2.Service(name=service_path(target, service_id), traffic=traffic), ["traffic"])


def _pinned(traffic: list[tuple[str, int]]) -> list[run_v2.TrafficTarget]:
    return [run_v2.TrafficTarget(type_=BY_REVISION, revision=r, percent=p) for r, p in traffic]


def _failure_details(target: GcpTarget, service_id: str, revision: str, error: Exception) -> str:
    revisions = clients.run_revisions(target)
    try:
        found = revisions.get_revision(name=f"{service_path(target, service_id)}/revisions/{revision}", retry=GCP_RETRY)
        ready = next((c for c in found.conditions if c.type_ == "Ready"), None)
        reason = ready.message if ready and ready.message else str(error)
    except gexc.NotFound:
        reason = str(error)
    try:
        logs = revision_log_tail(target, service_id, revision, 40)
        tail = "\n".join(logs) if logs else "(no container output)"
    except InfraError as exc:  # the deploy failure is the story; a log we may not read must not hide it
        tail = f"(not readable: {exc})"
    return f"revision {revision} of {service_id} did not become ready: {reason}\ncontainer log (last lines):\n{tail}"


def _free_revision_name(target: GcpTarget, service_id: str, wanted: str) -> tuple[str, run_v2.Revision | None]:
    """``wanted``, or ``wanted-2``... when an earlier attempt left a failed revision under that name."""
    revisions = clients.run_revisions(target)
    names = revision_names(wanted)
    for name in names:
        try:
            existing = revisions.get_revision(
                name=f"{service_path(target, service_id)}/revisions/{name}", retry=GCP_RETRY
            )
        except gexc.NotFound:
            return name, None
        if _ready(existing):
            return name, existing
    raise InfraError(f"revisions {names[0]} to {names[-1]} of {service_id} all failed; change the profile or weights")


def check_candidate_verdict(target: GcpTarget, service_id: str, wanted: str, force: bool) -> str | None:
    """The revision this run's deploy would take (``wanted``, or a later name after failed tries) must not be one a
    verdict found bad, unless ``force`` (tasks/verdicts.check_candidate)."""
    try:
        current = clients.run_services(target).get_service(name=service_path(target, service_id), retry=GCP_RETRY)
    except gexc.NotFound:
        return None  # a first deploy: no verdicts
    found = verdicts.records(current)
    if not any(record.verdict in verdicts.BAD for record in found.values()):
        return None
    revision, existing = _free_revision_name(target, service_id, wanted)
    return verdicts.check_candidate(found, service_id, revision, force) if existing is not None else None


def deploy_candidate(target: GcpTarget, service_id: str, spec: run_v2.Service) -> Candidate:
    """Create the service (first deploy), or add the spec as a named revision tagged `candidate` with 0 %."""
    if not spec.template.revision:
        raise ValueError("deploy_candidate needs a named revision (tasks.deploy.render.revision_name)")
    services = clients.run_services(target)
    name = service_path(target, service_id)
    with gcp_errors("run", "roles/run.developer", f"deploying {service_id}", target):
        try:
            current = services.get_service(name=name, retry=GCP_RETRY)
        except gexc.NotFound:
            return _first_deploy(target, service_id, spec)
        serving = _serving(current)
        if not serving:
            # A service that serves nothing: a first deploy killed before its revision became ready, or one whose
            # revision failed. Pinning 0 % to a candidate would be refused ("percentages must add up to 100"), and
            # nothing verified ever served from it: start over as a first deploy.
            delete_service(target, service_id)
            return _first_deploy(target, service_id, spec)
        revision, existing = _free_revision_name(target, service_id, spec.template.revision)
        if existing is not None and serving == [(revision, 100)]:
            unverified = next((s for s in current.traffic_statuses if s.tag == CANDIDATE_TAG), None)
            if unverified is not None and unverified.revision == revision:
                # A first deploy that never finished (killed before verification): it serves, but nobody has
                # probed it yet. Verify it now, as that run would have, and promote it to drop the tag.
                return Candidate(
                    service=name, service_url=current.uri, revision=revision, url=unverified.uri, first_deploy=True
                )
            before = next((s for s in current.traffic_statuses if s.tag == PREVIOUS_TAG and s.revision != revision),
                          None)  # fmt: skip
            if before is not None:
                # A promotion killed during its watch: the revision before still holds its `previous` tag (and
                # its warm instances). Finish the watch now, as that run would have, then drop the tag or go back.
                return Candidate(
                    service=name, service_url=current.uri, revision=revision, url=current.uri,
                    previous_traffic=[(before.revision, 100)], unchanged=True, watch_pending=True,
                    previous_url=before.uri,
                )  # fmt: skip
            return Candidate(
                service=name, service_url=current.uri, revision=revision, url=current.uri,
                previous_traffic=serving, unchanged=True,
            )  # fmt: skip
        # A canary killed mid-step left the candidate a share: it goes back to the others until it is verified again.
        previous = rescaled([(r, p) for r, p in serving if r != revision])
        spec = run_v2.Service(spec, name=name)
        spec.template.revision = revision
        spec.traffic = [*_pinned(previous), run_v2.TrafficTarget(type_=BY_REVISION, revision=revision, percent=0,
                                                                 tag=CANDIDATE_TAG)]  # fmt: skip
        try:
            # Only what the pipeline owns: service-level scaling (set by scale-service) must survive a promotion.
            operation = when_visible(  # a new runtime account: Cloud Run's actAs check waits for IAM to propagate it
                lambda: services.update_service(
                    service=spec, update_mask=field_mask_pb2.FieldMask(paths=PROMOTED_FIELDS), retry=GCP_RETRY
                ),
                spec.template.service_account,
                "Cloud Run",
            )
            updated = wait_for(operation, clients.operation_polling(target))
        except gexc.GoogleAPICallError as exc:
            details = _failure_details(target, service_id, revision, exc)
            _set_traffic(target, service_id, _pinned(previous))  # drop the tag; traffic was never moved
            raise DeployFailed(details) from None
    tag_url = next(s.uri for s in updated.traffic_statuses if s.tag == CANDIDATE_TAG)
    return Candidate(service=name, service_url=updated.uri, revision=revision, url=tag_url, previous_traffic=previous)


def _first_deploy(target: GcpTarget, service_id: str, spec: run_v2.Service) -> Candidate:
    services = clients.run_services(target)
    spec = run_v2.Service(spec)
    spec.traffic = [run_v2.TrafficTarget(type_=LATEST, percent=100, tag=CANDIDATE_TAG)]
    try:
        operation = when_visible(  # a new runtime account: Cloud Run's actAs check waits for IAM to propagate it
            lambda: services.create_service(
                parent=target.location_path, service=spec, service_id=service_id, retry=GCP_RETRY
            ),
            spec.template.service_account,
            "Cloud Run",
        )
        created = wait_for(operation, clients.operation_polling(target))
    except gexc.GoogleAPICallError as exc:
        details = _failure_details(target, service_id, spec.template.revision, exc)
        delete_service(target, service_id)  # a service that never served is no state to keep: the rerun starts clean
        raise DeployFailed(
            f"{details}\n(first deploy: nothing was serving before; the service was removed)", first_deploy=True
        ) from None
    tag_url = next(s.uri for s in created.traffic_statuses if s.tag == CANDIDATE_TAG)
    return Candidate(
        service=created.name, service_url=created.uri, revision=_short(created.latest_ready_revision),
        url=tag_url, first_deploy=True,
    )  # fmt: skip


def promote_candidate(
    target: GcpTarget, service_id: str, candidate: Candidate, keep_previous: bool = False
) -> run_v2.Service:
    """All traffic to the candidate; its tag goes away (the previous revision stays, named, for rollback).

    ``keep_previous``: the revision that served before keeps a ``previous`` tag at 0 %, so it stays addressable
    while the promotion is watched (the watch's /health requests keep it warm); ``release_previous`` drops it."""
    traffic = _pinned([(candidate.revision, 100)])
    _record(target, candidate, "verified")
    if keep_previous and candidate.previous_revision:
        traffic.append(
            run_v2.TrafficTarget(type_=BY_REVISION, revision=candidate.previous_revision, percent=0, tag=PREVIOUS_TAG)
        )
    with gcp_errors("run", "roles/run.developer", f"promoting {candidate.revision}", target):
        return _set_traffic(target, service_id, traffic)


def shift_to_canary(target: GcpTarget, service_id: str, candidate: Candidate, percent: int) -> list[tuple[str, int]]:
    """The candidate takes ``percent`` of traffic (keeping its tag), the revisions that served before the rest."""
    split = canary_split(candidate.previous_traffic, candidate.revision, percent)
    traffic = [
        run_v2.TrafficTarget(type_=BY_REVISION, revision=revision, percent=share,
                             tag=CANDIDATE_TAG if revision == candidate.revision else "")
        for revision, share in split
    ]  # fmt: skip
    with gcp_errors("run", "roles/run.developer", f"moving {percent} % to {candidate.revision}", target):
        _set_traffic(target, service_id, traffic)
    return split


def release_previous(target: GcpTarget, service_id: str, candidate: Candidate) -> None:
    """The watch is over and held: the previous revision's tag goes, so it scales to zero."""
    with gcp_errors("run", "roles/run.developer", f"untagging {candidate.previous_revision}", target):
        _set_traffic(target, service_id, _pinned([(candidate.revision, 100)]))


def abandon_candidate(
    target: GcpTarget, service_id: str, candidate: Candidate, verdict: verdicts.Verdict = "failed-verification"
) -> None:
    """Traffic as it was before the candidate, without its tag; on a first deploy, as it was: no service. The
    candidate's ``verdict`` is recorded, so that no rollback goes back to it."""
    if candidate.unchanged and not candidate.watch_pending:
        return
    if candidate.first_deploy:
        delete_service(target, service_id)  # its only revision failed verification: nothing verified ever served
        return
    with gcp_errors("run", "roles/run.developer", f"removing candidate {candidate.revision}", target):
        _set_traffic(target, service_id, _pinned(candidate.previous_traffic))
    _record(target, candidate, verdict)


def _record(target: GcpTarget, candidate: Candidate, verdict: verdicts.Verdict) -> None:
    """Record the verdict; a failure to is logged, never raised over what the run did to traffic."""
    try:
        verdicts.record(target, candidate.service, candidate.revision, verdict)
    except gexc.GoogleAPICallError as exc:
        run_logger().warning("could not record %s as %s on the service: %s", candidate.revision, verdict, exc)


class Rollback(BaseModel):
    service: str
    from_revision: str
    to_revision: str


def rollback(target: GcpTarget, service_id: str, to_revision: str | None = None, force: bool = False) -> Rollback:
    """Traffic back to ``to_revision``, or to the newest revision older than the one serving now that passed
    verification; never to one the pipeline found bad (failed verification, rolled back) unless named with
    ``force``. The revision rolled back from is recorded as rolled back."""
    services = clients.run_services(target)
    with gcp_errors("run", "roles/run.developer", f"rolling back {service_id}", target):
        try:
            current = services.get_service(name=service_path(target, service_id), retry=GCP_RETRY)
        except gexc.NotFound:
            raise InfraError(
                f"service: no Cloud Run service '{service_id}' in {target.project}/{target.region}; check the name "
                "(`gcloud run services list`), or run promote-model first to create it"
            ) from None
        serving = _serving(current)
        now = serving[0][0] if serving else ""
        found = verdicts.read(current)
        revisions = list(clients.run_revisions(target).list_revisions(parent=current.name, retry=GCP_RETRY))
        if to_revision is not None:
            _check_rollback_target(service_id, to_revision, revisions, found, force)
        else:
            to_revision = _previous_good(service_id, now, revisions, found)
        _set_traffic(target, service_id, _pinned([(to_revision, 100)]))
        if now and now != to_revision:
            verdicts.record(target, current.name, now, "rolled-back")
    return Rollback(service=current.name, from_revision=now, to_revision=to_revision)


def _previous_good(service_id: str, now: str, revisions: list[run_v2.Revision], found: dict[str, str]) -> str:
    """The newest ready revision older than ``now`` that passed verification; without any recorded verdict (a
    service promoted before verdicts were kept), the newest ready one not known to be bad."""
    serving_since = next((r.create_time for r in revisions if _short(r.name) == now), None)
    older = sorted(
        (
            r
            for r in revisions
            if _ready(r) and _short(r.name) != now and (serving_since is None or r.create_time < serving_since)
        ),
        key=lambda r: r.create_time,
        reverse=True,
    )
    good = [r for r in older if found.get(_short(r.name)) == "verified"]
    unknown = [r for r in older if _short(r.name) not in found]
    choice = good or unknown
    if not choice:
        raise InfraError(
            f"{service_id} has no verified revision older than {now or 'the serving one'} to roll back to; its "
            f"revisions (newest first): {_listing(revisions, found)}. Name one in to_revision (with force for one "
            "found bad), or promote the model you want"
        )
    return _short(choice[0].name)


def _listing(revisions: list[run_v2.Revision], found: dict[str, str] | None = None) -> str:
    """The revisions by name, newest first, each not ready one, and each with a recorded verdict, marked so."""
    found = found or {}
    newest_first = sorted(revisions, key=lambda r: r.create_time, reverse=True)

    def mark(revision: run_v2.Revision) -> str:
        notes = [] if _ready(revision) else ["not ready"]
        notes += [found[_short(revision.name)]] if _short(revision.name) in found else []
        listed = ", ".join(notes)
        return f"{_short(revision.name)} ({listed})" if notes else _short(revision.name)

    return ", ".join(mark(r) for r in newest_first) or "none"


def _check_rollback_target(
    service_id: str, to_revision: str, revisions: list[run_v2.Revision], found: dict[str, str], force: bool
) -> None:
    """``to_revision`` must be one of the service's ready revisions, and not one found bad unless ``force``: say
    which exist, newest first, when it is not."""
    match = next((r for r in revisions if _short(r.name) == to_revision), None)
    listed = _listing(revisions, found)
    if match is None:
        raise InfraError(
            f"to_revision: {service_id} has no revision '{to_revision}'; its revisions (newest first): {listed}. "
            "Give one of these, or leave to_revision empty for the previous verified one"
        )
    if not _ready(match):
        raise InfraError(
            f"to_revision: revision '{to_revision}' of {service_id} never became ready and cannot serve; its "
            f"revisions (newest first): {listed}. Give a ready one"
        )
    if found.get(to_revision) in verdicts.BAD and not force:
        raise InfraError(
            f"to_revision: revision '{to_revision}' of {service_id} {verdicts.BAD_WORDS[found[to_revision]]} "
            "(recorded on the service); set force to send traffic to it anyway, or leave to_revision empty for the "
            "previous verified one"
        )


class Scaling(BaseModel):
    service: str
    min_instances: int
    max_instances: int | None
    changed: bool


def scale_service(target: GcpTarget, service_id: str, min_instances: int, max_instances: int | None = None) -> Scaling:
    """Service-level min (and max) instances; traffic and revisions stay as they are (lesson 16). Whether the GPU
    quota holds ``max_instances`` is checked before, with the other quotas (tasks/checks/quotas.check_scale_quota)."""
    if min_instances < 0 or (max_instances is not None and (max_instances < 1 or min_instances > max_instances)):
        raise ValueError(
            f"min_instances ({min_instances}) / max_instances ({max_instances}): min must be 0 or more (0 = scale to "
            "zero), max 1 or more, and min at most max"
        )
    services = clients.run_services(target)
    name = service_path(target, service_id)
    with gcp_errors("run", "roles/run.developer", f"scaling {service_id}", target):
        try:
            current = services.get_service(name=name, retry=GCP_RETRY)
        except gexc.NotFound:
            raise InfraError(
                f"service: no Cloud Run service '{service_id}' in {target.project}/{target.region}; check the name, "
                "or run promote-model first to create it"
            ) from None
        wanted_max = current.scaling.max_instance_count if max_instances is None else max_instances
        if current.scaling.min_instance_count == min_instances and current.scaling.max_instance_count == wanted_max:
            return Scaling(service=name, min_instances=min_instances, max_instances=wanted_max or None, changed=False)
        scaling = run_v2.ServiceScaling(min_instance_count=min_instances, max_instance_count=wanted_max)
        update_fields(target, run_v2.Service(name=name, scaling=scaling), ["scaling"])
    return Scaling(service=name, min_instances=min_instances, max_instances=wanted_max or None, changed=True)


def verify_candidate(
    target: GcpTarget, candidate: Candidate, served_name: str, options: VerifyOptions | None = None
) -> Verification:
    """Verify at the candidate's URL; the identity token is minted here, never passed around."""
    return verify(candidate.url, clients.identity_token(target, candidate.service_url), served_name, options)


GPU_QUOTA_REFUSAL = "Quota exceeded for total allowable count of GPUs per project per region"
# Cloud Run's words when an instance would take the region past a quota at run time, for GPUs, CPU and memory alike
# (sandbox/control/run/capacity.py names the sources of each).
RUNTIME_QUOTA_REFUSAL = "Quota exceeded for total allowable"
# How long a replace rollout waits for Cloud Run to release the stopped revision's GPU. Google publishes no figure; a
# public single-GPU deploy script waits up to 3 minutes (4 tries 45 s apart, justin-thakral/dullyPDF's
# scripts/deploy-detector-services.sh): twice that.
GPU_RELEASE_DEADLINE_S = 360.0


def deploy_when_startable(
    target: GcpTarget, service_id: str, spec: run_v2.Service, gpu_freed: bool = False,
    before_retry: Callable[[], object] | None = None,
) -> Candidate:  # fmt: skip
    """``deploy_candidate``, made again (a new revision: the failed one keeps its name) while its revision fails only
    because this run's grant to its account (its secret, a bucket it mounts) has not taken effect yet
    (tasks/infra/propagation.py), or, after a replace rollout stopped the serving revision (``gpu_freed``), because
    Cloud Run has not released that revision's GPU yet; logged, bounded. ``before_retry`` runs before each new deploy
    (the flow's lock fence: the waits can last minutes)."""
    email = spec.template.service_account
    mounted = [v.gcs.bucket for v in spec.template.volumes if v.gcs.bucket]
    started = time.monotonic()
    pauses = propagation.redeploy_pauses()
    while True:
        try:
            return deploy_candidate(target, service_id, spec)
        except DeployFailed as exc:
            waited = time.monotonic() - started
            unreadable = propagation.unreadable_on_new_grant(str(exc), email)
            granted = propagation.propagating_bucket_grant(email, mounted)
            if unreadable is not None and waited < propagation.DEADLINE_S:
                why = (f"the revision's account {email} cannot read {unreadable} yet: this run granted it moments ago "
                       "(IAM propagation, typically 2 minutes, up to 7 or more)")  # fmt: skip
            elif granted is not None and cache_write_refused(str(exc)):
                # vLLM creates its compile cache folder first thing and cannot start without it (sandbox/vllm/
                # compile_cache.py: decorators.py:575 and backends.py:1080 are not guarded); this run's objectUser
                # grant on compile-cache/ (tasks/infra/access.py) is the one that lets it.
                why = (f"the revision's account {email} may not write its compile cache in gs://{granted[0]} yet: "
                       f"this run granted it {granted[1]:.0f} s ago (IAM propagation, typically 2 minutes, up to 7 or "
                       "more)")  # fmt: skip
            elif granted is not None and propagation.names_bucket(str(exc), granted[0]):
                # The grant and its deadline decide, and the failure is about that bucket: gcsfuse's words for a
                # mount its account may not do yet changed with its v3, the bucket's name did not.
                why = (f"the revision's account {email} may not mount gs://{granted[0]} yet: this run granted it "
                       f"{granted[1]:.0f} s ago (IAM propagation, typically 2 minutes, up to 7 or more)")  # fmt: skip
            elif gpu_freed and GPU_QUOTA_REFUSAL in str(exc) and waited < GPU_RELEASE_DEADLINE_S:
                why = f"Cloud Run has not released the stopped revision's GPU yet ({GPU_QUOTA_REFUSAL})"
            else:
                if RUNTIME_QUOTA_REFUSAL in str(exc):
                    beside = not gpu_freed and not exc.first_deploy  # a serving revision runs beside the candidate
                    raise DeployFailed(f"{exc}\n{no_room_advice(replace_helps=beside)}") from None
                if granted is not None:
                    run_logger().warning(
                        "the revision failed %.0f s after this run granted %s a role on gs://%s: if its log shows the "
                        "volume's mount failing, IAM had not propagated the grant yet; run again in a few minutes",
                        granted[1], email, granted[0],
                    )  # fmt: skip
                raise
            pause = next(pauses)
            run_logger().info("%s; deploying again in %.0f s", why, pause)
            time.sleep(pause)
            if before_retry is not None:
                before_retry()


def cache_write_refused(message: str) -> bool:
    """Whether a failed start's log says the compile cache's volume refused a write (EACCES: "[Errno 13] Permission
    denied: '/mnt/compile-cache/..."; gcsfuse answers a create its account may not do so)."""
    return re.search(rf"Permission denied: '?{re.escape(compile_cache.MOUNT_PATH)}\b", message) is not None


def no_room_advice(replace_helps: bool) -> str:
    """What to do when Cloud Run refused the candidate's instance for the region's quotas: preflight's room check
    (tasks/checks/in_use.py) judged by what ran a minute or three ago, and something started since."""
    ways = "stop or scale down what else runs in the region, or request more of that quota"
    if replace_helps:
        ways = ("set rollout: replace (the serving revision stops first, and the service answers 503 until the "
                f"candidate takes its traffic), {ways}")  # fmt: skip
    return (
        'The region\'s Cloud Run quotas count every running instance and job task ("About maximum instances"): the '
        f"candidate's instance did not fit beside them. Either {ways}; doctor's quota rows give the limits."
    )


run_check_candidate_verdict = task(name="run_check_candidate_verdict")(check_candidate_verdict)
# Its ``before_retry`` (the service lock's fence) holds a thread lock: no cache key can be computed from it, and Prefect
# would log that at ERROR with a traceback in every promotion. A deploy is never to be served from a cache anyway.
run_deploy_candidate = task(name="run_deploy_candidate", cache_policy=NO_CACHE)(deploy_when_startable)
run_verify_candidate = task(name="run_verify_candidate")(verify_candidate)
run_promote_candidate = task(name="run_promote_candidate")(promote_candidate)
run_abandon_candidate = task(name="run_abandon_candidate")(abandon_candidate)
run_shift_to_canary = task(name="run_shift_to_canary")(shift_to_canary)
run_release_previous = task(name="run_release_previous")(release_previous)
run_rollback = task(name="run_rollback")(rollback)
run_scale_service = task(name="run_scale_service")(scale_service)
