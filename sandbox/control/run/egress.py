"""Where a revision's outbound traffic can go: the network rule of Direct VPC egress, applied to the Hub.

Cloud Run's networking best practices: with ``--vpc-egress=all-traffic`` every packet goes into the VPC, and
"you must set up Cloud NAT to reach the public internet"; ``private-ranges-only`` (the default) sends only
private ranges into the VPC and everything else out the normal way, to the internet
(https://cloud.google.com/run/docs/configuring/networking-best-practices). Google APIs, Cloud Storage among them,
go the same way: with all-traffic egress their public addresses are sent into the VPC too, where they are reached
through Private Google Access on the subnet (Google's Direct VPC egress page for Cloud Run functions: "If your
function needs to access Google APIs and services using their internal IP addresses, enable Private Google Access on
the subnet that you use for Direct VPC egress"), or through Cloud NAT. A Cloud Storage volume on a revision with
neither cannot read its bucket: here its reads go to the black hole too.

The sandbox's "internet" is the Hub stand-in. A container is told where the Hub is through ``HF_ENDPOINT``, the
way the platform's plumbing tells it where storage is (``STORAGE_EMULATOR_HOST``): the Hub stand-in when the
revision's egress reaches the internet, else a black hole that accepts connections and never answers, as
packets dropped at a VPC without a NAT look to a client (a timeout, never an answer). Not quite as on Cloud Run:
there the SYN is dropped, so the client's connect times out; here the loopback black hole completes the TCP
handshake and the client's read times out. Both are timeouts with no answer, which is what huggingface_hub and the
product's staging see; a client that tells a connect timeout from a read timeout would see the difference. The
override is unconditional: a container never reaches a real endpoint, whatever its own env says.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

from google.cloud import run_v2

from sandbox.control import ControlContext
from sandbox.control.run.instances import InstanceSpec
from sandbox.serving import LOOPBACK

ALL_TRAFFIC = run_v2.VpcAccess.VpcEgress.ALL_TRAFFIC


def _short(name: str) -> str:
    return name.rstrip("/").rsplit("/", 1)[-1]


def has_cloud_nat(ctx: ControlContext, network: str, region: str) -> bool:
    """Whether the VPC has a Cloud NAT gateway in the region. The Compute stand-in has no routers (nor NAT
    configs) yet, so a VPC here never has one; a stand-in that grows them answers through ``cloud_nat``."""
    compute = ctx.module("compute")
    check = getattr(compute, "cloud_nat", None)
    return bool(check(_short(network), region)) if callable(check) else False


def reaches_internet(ctx: ControlContext, revision: run_v2.Revision) -> bool:
    """Whether the revision's containers can open connections to the public internet."""
    vpc = revision.vpc_access
    if not vpc.network_interfaces and not vpc.connector:
        return True  # no VPC: Cloud Run's own path to the internet
    if vpc.egress != ALL_TRAFFIC:
        return True  # PRIVATE_RANGES_ONLY (also the default): public addresses go out the normal way
    region = revision.name.split("/locations/", 1)[-1].split("/", 1)[0]
    network = vpc.network_interfaces[0].network if vpc.network_interfaces else ""
    if not network and vpc.network_interfaces:
        network = vpc.network_interfaces[0].subnetwork  # only a subnet given: the network has its name
    return has_cloud_nat(ctx, network, region)


def reaches_google_apis(ctx: ControlContext, revision: run_v2.Revision) -> bool:
    """Whether the revision's containers can reach Google APIs (Cloud Storage): not through a VPC that takes all
    traffic, or through one whose subnet has Private Google Access, or Cloud NAT."""
    vpc = revision.vpc_access
    if not vpc.network_interfaces or vpc.egress != ALL_TRAFFIC:
        return True  # no Direct VPC egress (a connector is not modelled), or only private ranges into the VPC
    interface = vpc.network_interfaces[0]
    region = revision.name.split("/locations/", 1)[-1].split("/", 1)[0]
    compute = ctx.module("compute")
    subnet = compute.subnetwork(region, _short(interface.subnetwork or interface.network)) if compute else None
    if subnet is not None and subnet.get("privateIpGoogleAccess"):
        return True
    return has_cloud_nat(ctx, interface.network or interface.subnetwork, region)


class Internet:
    """Hands each container the Hub's address its egress allows; owns the black hole for the rest."""

    def __init__(self, ctx: ControlContext) -> None:
        self.ctx = ctx
        self._black_hole: asyncio.Server | None = None
        self._held: set[asyncio.StreamWriter] = set()

    async def wire(self, spec: InstanceSpec, revision: run_v2.Revision) -> InstanceSpec:
        """The instance spec with ``HF_ENDPOINT`` set to where the Hub is, seen from this revision, and its
        Cloud Storage endpoint a black hole when Google APIs are out of its reach."""
        endpoint = self.ctx.hub_url if reaches_internet(self.ctx, revision) else await self._black_hole_url()
        storage = None if reaches_google_apis(self.ctx, revision) else await self._black_hole_url()
        return dataclasses.replace(spec, env={**spec.env, "HF_ENDPOINT": endpoint}, storage_url=storage)

    async def _black_hole_url(self) -> str:
        if self._black_hole is None:

            async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                self._held.add(writer)  # never read, never answered: the client's timeout decides

            self._black_hole = await asyncio.start_server(hold, LOOPBACK, 0)
        port = self._black_hole.sockets[0].getsockname()[1]
        return f"http://{LOOPBACK}:{port}"

    async def close(self) -> None:
        for writer in self._held:
            writer.close()
        self._held.clear()
        if self._black_hole is not None:
            self._black_hole.close()
            with contextlib.suppress(Exception):
                await self._black_hole.wait_closed()
