"""Who uses what on a target: the serving account, the weights bucket and its staged commits, the network and subnet,
the Hub token secret and the image registry serve every service on the target, so a teardown of one service may
delete only what no other service uses.

Cloud Run itself is the record: each revision of each service names its account, volumes, network interface,
secrets and image, and its container arguments name the staged commit it serves (tasks/render.model_location). Every
revision counts, not only the serving one: a rollback may send traffic to any of them, and it must find its weights.
(Issue 33: a teardown of svc-a with service_account and staged_weights deleted the shared account and bucket, and
svc-b answered 503 at its next cold start.)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from google.api_core import exceptions as gexc
from google.cloud import run_v2
from prefect import task

from blocks.target import GcpTarget
from tasks.common import clients
from tasks.common.gcp import GCP_RETRY, gcp_errors
from tasks.common.naming import repository_host

GCS_URI = "gs://"


@dataclass
class Usage:
    """What the revisions of one service use, by short name (a resource's last path segment)."""

    accounts: set[str] = field(default_factory=set)
    buckets: set[str] = field(default_factory=set)
    networks: set[str] = field(default_factory=set)
    subnets: set[str] = field(default_factory=set)
    secrets: set[str] = field(default_factory=set)
    images: set[str] = field(default_factory=set)
    staged: set[tuple[str, str]] = field(default_factory=set)  # (bucket, object prefix of a staged commit)
    caches: set[tuple[str, str]] = field(default_factory=set)  # (bucket, folder of a compile cache it writes)

    def add(self, other: Usage) -> None:
        for name in ("accounts", "buckets", "networks", "subnets", "secrets", "images", "staged", "caches"):
            getattr(self, name).update(getattr(other, name))


def _last(name: str) -> str:
    return name.rsplit("/", 1)[-1]


def _mounts(revision: run_v2.Revision, container: run_v2.Container) -> dict[str, tuple[str, str]]:
    """Each mount path of a read-only Cloud Storage volume in ``container``: (bucket, the only-dir it shows, or "")."""
    volumes = {}
    for volume in revision.volumes:
        if volume.gcs.bucket and volume.gcs.read_only:  # weights are mounted read-only; a compile cache is not
            only = next((o.split("=", 1)[1] for o in volume.gcs.mount_options if o.startswith("only-dir=")), "")
            volumes[volume.name] = (volume.gcs.bucket, only.strip("/"))
    return {m.mount_path.rstrip("/"): volumes[m.name] for m in container.volume_mounts if m.name in volumes}


def staged_commits(revision: run_v2.Revision) -> set[tuple[str, str]]:
    """The staged objects a revision reads: a gs:// model argument (the streamer), or a path under a Cloud Storage
    mount (tasks/render.model_location), in its args or environment (the serve wrapper's MODEL_PATH)."""
    found: set[tuple[str, str]] = set()
    for container in revision.containers:
        mounts = _mounts(revision, container)
        words = [*container.args, *container.command, *(e.value for e in container.env if e.value)]
        for word in words:
            if word.startswith(GCS_URI):
                bucket, _, prefix = word.removeprefix(GCS_URI).partition("/")
                if prefix.strip("/"):
                    found.add((bucket, prefix.strip("/")))
                continue
            for path, (bucket, only_dir) in mounts.items():
                if word.startswith(f"{path}/") and (inside := word.removeprefix(f"{path}/").strip("/")):
                    found.add((bucket, f"{only_dir}/{inside}" if only_dir else inside))
    return found


def cache_folders(revision: run_v2.Revision | run_v2.RevisionTemplate) -> set[tuple[str, str]]:
    """The compile caches a revision (or a service's template) writes: (bucket, folder) of its read-write Cloud
    Storage volumes (tasks/deploy/compile_cache.py)."""
    found = set()
    for volume in revision.volumes:
        only = next((o.split("=", 1)[1] for o in volume.gcs.mount_options if o.startswith("only-dir=")), "")
        if volume.gcs.bucket and not volume.gcs.read_only and only.strip("/"):
            found.add((volume.gcs.bucket, only.strip("/")))
    return found


def revision_usage(revision: run_v2.Revision) -> Usage:
    usage = Usage(staged=staged_commits(revision), caches=cache_folders(revision))
    if revision.service_account:
        usage.accounts.add(revision.service_account)
    usage.buckets |= {v.gcs.bucket for v in revision.volumes if v.gcs.bucket} | {b for b, _ in usage.staged}
    for interface in revision.vpc_access.network_interfaces:
        # Only a network given: the subnet has the network's name (Cloud Run docs, Direct VPC egress).
        usage.networks.add(_last(interface.network or interface.subnetwork))
        usage.subnets.add(_last(interface.subnetwork or interface.network))
    usage.secrets |= {_last(v.secret.secret) for v in revision.volumes if v.secret.secret}
    for container in revision.containers:
        usage.images.add(container.image)
        usage.secrets |= {
            _last(e.value_source.secret_key_ref.secret) for e in container.env if e.value_source.secret_key_ref.secret
        }
    return usage


@dataclass
class TargetUsage:
    """This service's usage, and each other service's in the target's region."""

    service: str
    own: Usage
    others: dict[str, Usage]

    def users(self, kind: str, name: str) -> list[str]:
        """The other services that use ``name`` (a short name, as Usage keeps it) as a ``kind`` (a Usage field)."""
        return sorted(s for s, usage in self.others.items() if name in getattr(usage, kind))

    def staged_users(self, bucket: str, prefix: str) -> list[str]:
        """Other services that read the staged commit, or write the compile cache, at ``prefix``."""
        return sorted(s for s, u in self.others.items() if (bucket, prefix) in u.staged | u.caches)

    def image_users(self, target: GcpTarget) -> list[str]:
        """Other services running an image from the target's Artifact Registry repository."""
        repo = f"{repository_host(target)}/"
        return sorted(s for s, usage in self.others.items() if any(i.startswith(repo) for i in usage.images))


def _revisions(target: GcpTarget, service: str) -> Iterable[run_v2.Revision]:
    parent = f"{target.location_path}/services/{service}"
    try:
        return list(clients.run_revisions(target).list_revisions(parent=parent, retry=GCP_RETRY))
    except gexc.NotFound:  # deleted between the listing and this read
        return []


def read_usage(target: GcpTarget, service_id: str) -> TargetUsage:
    """Every revision of every Cloud Run service in the target's region, read before anything is deleted."""
    with gcp_errors("run", "roles/run.viewer", f"listing the services in {target.region}", target):
        names = [_last(s.name) for s in clients.run_services(target).list_services(parent=target.location_path,
                                                                                   retry=GCP_RETRY)]  # fmt: skip
        usage = {name: Usage() for name in {*names, service_id}}
        for name in usage:
            for revision in _revisions(target, name):
                usage[name].add(revision_usage(revision))
    own = usage.pop(service_id)
    return TargetUsage(service_id, own, usage)


run_read_usage = task(name="run_read_shared_usage")(read_usage)
