"""The copy a cold start is measured on: a service of its own with the serving revision's exact configuration.

Forcing a cold start needs the service to run no instance: Cloud Run's only way to stop a service's instances at
once is manual scaling to 0 ("Manual scaling": the count "is divided among all revisions with specified traffic"),
which is service-wide, and an idle instance otherwise lingers up to 15 minutes. Doing that to the production service
would take it down. So the flow copies the serving revision into ``<service>-cold`` (no minimum, at most one
instance, the same invokers), measures there, and deletes it: production's traffic, scaling and revisions are never
written to.
"""

from __future__ import annotations

from google.api_core import exceptions as gexc
from google.cloud import run_v2

from blocks.target import GcpTarget
from tasks.common import clients
from tasks.common.gcp import GCP_RETRY, InfraError, gcp_errors, wait_for
from tasks.infra.access import ensure_service_invokers
from tasks.infra.teardown import delete_service

COPY_SUFFIX = "-cold"
# Cloud Run service names: at most 49 characters ("Service names ... must be 49 characters or less").
MAX_SERVICE_NAME = 49
COPY_LABEL = "cold-start-of"  # on the copy: the service it copies, so an operator can tell what it is


def copy_id(service_id: str) -> str:
    """The copy's name: the service's with ``-cold``, cut to Cloud Run's limit."""
    return service_id[: MAX_SERVICE_NAME - len(COPY_SUFFIX)].rstrip("-") + COPY_SUFFIX


def serving_revision(service: run_v2.Service) -> str:
    """The revision with the largest share of the service's traffic."""
    serving = [(status.percent, status.revision) for status in service.traffic_statuses if status.percent > 0]
    if not serving:
        raise InfraError(f"service {service.name.rsplit('/', 1)[-1]} serves no revision; promote it first")
    return max(serving)[1]


def template_of(revision: run_v2.Revision) -> run_v2.RevisionTemplate:
    """The revision's configuration as a template: every field the two messages share (the API's own schema, not a
    hand-kept list), so a field Cloud Run adds later is copied too. Its scaling is reset: no minimum, one at most."""
    shared = set(run_v2.RevisionTemplate.meta.fields) & set(run_v2.Revision.meta.fields)
    template = run_v2.RevisionTemplate(**{name: getattr(revision, name) for name in shared})
    template.scaling = run_v2.RevisionScaling(min_instance_count=0, max_instance_count=1)
    return template


def copy_spec(service: run_v2.Service, revision: run_v2.Revision) -> run_v2.Service:
    """The copy: the revision's template, the service's ingress and launch stage, automatic scaling from zero."""
    source_id = service.name.rsplit("/", 1)[-1]
    return run_v2.Service(
        template=template_of(revision),
        labels={**dict(service.labels), COPY_LABEL: source_id},
        ingress=service.ingress,
        launch_stage=service.launch_stage,
        invoker_iam_disabled=service.invoker_iam_disabled,
        scaling=run_v2.ServiceScaling(min_instance_count=0, max_instance_count=1),
    )


def create_copy(target: GcpTarget, service_id: str) -> tuple[run_v2.Service, str]:
    """The copy of ``service_id``'s serving revision, created afresh (a copy left by a killed run is replaced), with
    the service's invokers; (the copy, the revision it copies)."""
    services, revisions = clients.run_services(target), clients.run_revisions(target)
    parent = target.location_path
    with gcp_errors("run", "roles/run.viewer", f"reading service {service_id}", target):
        try:
            service = services.get_service(name=f"{parent}/services/{service_id}", retry=GCP_RETRY)
        except gexc.NotFound:
            raise InfraError(f"service: no Cloud Run service '{service_id}' in {target.project}/{target.region}; "
                             "promote it first") from None  # fmt: skip
        revision_id = serving_revision(service)
        revision = revisions.get_revision(name=f"{service.name}/revisions/{revision_id}", retry=GCP_RETRY)
    name = copy_id(service_id)
    delete_service(target, name)
    with gcp_errors("run", "roles/run.developer", f"creating {name}, a copy of {revision_id}", target):
        operation = services.create_service(
            parent=parent, service=copy_spec(service, revision), service_id=name, retry=GCP_RETRY
        )
        try:
            copy = wait_for(operation, clients.operation_polling(target))
        except gexc.GoogleAPICallError as exc:  # the revision did not start: on a new project, most often a quota
            raise InfraError(
                f"the copy {name} of {revision_id} did not start: {exc.message.rstrip('.')}. It needs one instance "
                f"beside what {service_id} runs now: scale {service_id} to zero first (scale-service -p "
                "min_instances=0; its idle instance stops within 15 minutes), or raise the region's quota it names"
            ) from None
    ensure_service_invokers(target, name)
    return copy, revision_id


def delete_copy(target: GcpTarget, service_id: str) -> None:
    """The copy and its revisions, gone (nothing left running or billed)."""
    delete_service(target, copy_id(service_id))
