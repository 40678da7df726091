"""Compute Engine stand-in (VPC networks, subnetworks, operations) through the real compute_v1 REST clients."""

from __future__ import annotations

import itertools
import time
import uuid
from dataclasses import dataclass

import pytest
from google.api_core import exceptions
from google.cloud import compute_v1

from tasks.common import clients

_ids = itertools.count()
Status = compute_v1.Operation.Status


@dataclass
class Gce:
    """The four compute_v1 clients the product uses, all built by tasks.common.clients from one target."""

    networks: compute_v1.NetworksClient
    subnets: compute_v1.SubnetworksClient
    global_ops: compute_v1.GlobalOperationsClient
    region_ops: compute_v1.RegionOperationsClient
    project: str
    region: str

    def wait_global(self, op: compute_v1.Operation) -> compute_v1.Operation:
        done = self.global_ops.wait(project=self.project, operation=op.name)
        assert done.status == Status.DONE
        return done

    def wait_region(self, op: compute_v1.Operation, region: str | None = None) -> compute_v1.Operation:
        done = self.region_ops.wait(project=self.project, region=region or self.region, operation=op.name)
        assert done.status == Status.DONE
        return done

    def make_network(self, name: str) -> compute_v1.Network:
        network = compute_v1.Network(
            name=name,
            auto_create_subnetworks=False,
            routing_config=compute_v1.NetworkRoutingConfig(routing_mode="REGIONAL"),
        )
        done = self.wait_global(self.networks.insert_unary(project=self.project, network_resource=network))
        assert not done.error.errors
        return self.networks.get(project=self.project, network=name)

    def subnet_op(
        self, name: str, network: str, cidr: str, region: str | None = None, access: bool = True
    ) -> compute_v1.Operation:
        subnet = compute_v1.Subnetwork(name=name, network=network, ip_cidr_range=cidr, private_ip_google_access=access)
        return self.subnets.insert_unary(project=self.project, region=region or self.region, subnetwork_resource=subnet)

    def make_subnet(self, name: str, network: str, cidr: str, region: str | None = None) -> compute_v1.Subnetwork:
        done = self.wait_region(self.subnet_op(name, network, cidr, region), region)
        assert not done.error.errors
        return self.subnets.get(project=self.project, region=region or self.region, subnetwork=name)


@pytest.fixture(scope="module")
def gce(sandbox_target) -> Gce:
    return Gce(
        networks=clients.compute_networks(sandbox_target),
        subnets=clients.compute_subnetworks(sandbox_target),
        global_ops=clients.compute_global_operations(sandbox_target),
        region_ops=clients.compute_region_operations(sandbox_target),
        project=sandbox_target.project,
        region=sandbox_target.region,
    )


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_ids)}-{uuid.uuid4().hex[:6]}"


def compute_error(exc: exceptions.GoogleAPICallError) -> tuple[str, str]:
    """(reason, message) of Compute's ``errors`` list; api-core prefixes ``.message`` with the method and URL."""
    first = exc.errors[0]
    return first["reason"], first["message"]


def state(sb) -> dict:
    return sb.admin.get("/compute/state").json()


def test_network_insert_returns_an_operation_that_wait_finishes(gce, sb):
    name = unique("net")
    network = compute_v1.Network(
        name=name,
        description="serving egress",
        auto_create_subnetworks=False,
        routing_config=compute_v1.NetworkRoutingConfig(routing_mode="REGIONAL"),
    )
    op = gce.networks.insert_unary(project=gce.project, network_resource=network)
    assert op.name.startswith("operation-")
    assert op.operation_type == "insert"
    assert op.status in (Status.PENDING, Status.RUNNING)
    assert op.target_link.endswith(f"/compute/v1/projects/{gce.project}/global/networks/{name}")
    assert op.self_link.startswith(sb.control_url) and op.insert_time

    done = gce.wait_global(op)
    assert done.name == op.name and done.progress == 100 and done.end_time and not done.error.errors

    got = gce.networks.get(project=gce.project, network=name)
    assert got.name == name and got.description == "serving egress"
    assert got.auto_create_subnetworks is False
    assert got.routing_config.routing_mode == "REGIONAL"
    assert got.mtu == 1460
    assert got.self_link == op.target_link and got.self_link.startswith(sb.control_url)
    assert got.id == done.target_id and got.creation_timestamp
    assert got.kind == "compute#network"
    assert name in [n["name"] for n in state(sb)["networks"]]


def test_operation_finishes_on_the_sandbox_clock_without_wait(gce):
    op = gce.networks.insert_unary(
        project=gce.project, network_resource=compute_v1.Network(name=unique("net"), auto_create_subnetworks=False)
    )
    deadline = time.monotonic() + 5
    while op.status != Status.DONE and time.monotonic() < deadline:
        op = gce.global_ops.get(project=gce.project, operation=op.name)
    assert op.status == Status.DONE and op.start_time and op.end_time


def test_subnet_with_private_google_access(gce, sb):
    network = gce.make_network(unique("net"))
    name = unique("sub")
    op = gce.subnet_op(name, f"global/networks/{network.name}", "10.8.0.0/26")
    assert op.region.endswith(f"/regions/{gce.region}") and op.operation_type == "insert"
    done = gce.wait_region(op)
    assert not done.error.errors

    subnet = gce.subnets.get(project=gce.project, region=gce.region, subnetwork=name)
    assert subnet.kind == "compute#subnetwork"
    assert subnet.network == network.self_link  # stored as the full selfLink whatever form was sent
    assert subnet.ip_cidr_range == "10.8.0.0/26" and subnet.gateway_address == "10.8.0.1"
    assert subnet.private_ip_google_access is True
    assert subnet.region.endswith(f"/projects/{gce.project}/regions/{gce.region}")
    assert subnet.purpose == "PRIVATE" and subnet.stack_type == "IPV4_ONLY" and subnet.fingerprint
    assert gce.networks.get(project=gce.project, network=network.name).subnetworks == [subnet.self_link]

    # The other reference forms Compute accepts: a full URL and a project-relative path.
    for i, ref in enumerate([network.self_link, f"projects/{gce.project}/global/networks/{network.name}"]):
        other = gce.make_subnet(unique("sub"), ref, f"10.9.{i}.0/28")
        assert other.network == network.self_link
    recorded = {s["name"]: s for s in state(sb)["subnetworks"]}
    assert recorded[name]["privateIpGoogleAccess"] is True


def test_set_private_ip_google_access_off_and_on(gce):
    network = gce.make_network(unique("net"))
    name = unique("sub")
    before = gce.make_subnet(name, network.self_link, "10.8.0.0/26")
    for enabled in (False, True):
        op = gce.subnets.set_private_ip_google_access_unary(
            project=gce.project,
            region=gce.region,
            subnetwork=name,
            subnetworks_set_private_ip_google_access_request_resource=compute_v1.SubnetworksSetPrivateIpGoogleAccessRequest(
                private_ip_google_access=enabled
            ),
        )
        assert gce.wait_region(op).operation_type == "setPrivateIpGoogleAccess"
        after = gce.subnets.get(project=gce.project, region=gce.region, subnetwork=name)
        assert after.private_ip_google_access is enabled
        assert after.fingerprint != before.fingerprint
        before = after


def test_patch_requires_the_current_fingerprint(gce):
    network = gce.make_network(unique("net"))
    name = unique("sub")
    subnet = gce.make_subnet(name, network.self_link, "10.8.0.0/26")

    def patch(fingerprint: str, access: bool) -> compute_v1.Operation:
        return gce.subnets.patch_unary(
            project=gce.project,
            region=gce.region,
            subnetwork=name,
            subnetwork_resource=compute_v1.Subnetwork(fingerprint=fingerprint, private_ip_google_access=access),
        )

    with pytest.raises(exceptions.PreconditionFailed) as caught:
        patch("c3RhbGUtZnA=", False)
    assert compute_error(caught.value)[0] == "conditionNotMet"
    assert gce.wait_region(patch(subnet.fingerprint, False)).operation_type == "patch"
    patched = gce.subnets.get(project=gce.project, region=gce.region, subnetwork=name)
    assert patched.private_ip_google_access is False and patched.fingerprint != subnet.fingerprint
    with pytest.raises(exceptions.PreconditionFailed):
        patch(subnet.fingerprint, True)  # the fingerprint read before the change is stale now


def test_overlapping_range_in_the_same_network_is_rejected_in_any_region(gce):
    network = gce.make_network(unique("net"))
    first = unique("sub")
    gce.make_subnet(first, network.self_link, "10.8.0.0/24")
    with pytest.raises(exceptions.BadRequest) as caught:
        gce.subnet_op(unique("sub"), network.self_link, "10.8.0.0/26", region="europe-west4")
    assert compute_error(caught.value) == (
        "invalid",
        f"Invalid IPCidrRange: 10.8.0.0/26 conflicts with existing subnetwork '{first}' in region '{gce.region}'.",
    )
    # The same range in another network is fine.
    elsewhere = gce.make_network(unique("net"))
    assert gce.make_subnet(unique("sub"), elsewhere.self_link, "10.8.0.0/26").ip_cidr_range == "10.8.0.0/26"


@pytest.mark.parametrize("cidr", ["10.8.0.1/26", "10.8.0.0/33", "10.8.0.0/30", "not-a-range", "fd00::/64"])
def test_invalid_ranges_are_bad_requests(gce, cidr):
    network = gce.make_network(unique("net"))
    with pytest.raises(exceptions.BadRequest) as caught:
        gce.subnet_op(unique("sub"), network.self_link, cidr)
    assert "ipCidrRange" in caught.value.message


def test_invalid_network_name_is_a_bad_request(gce):
    with pytest.raises(exceptions.BadRequest) as caught:
        gce.networks.insert_unary(
            project=gce.project, network_resource=compute_v1.Network(name="Bad_Name", auto_create_subnetworks=False)
        )
    assert "Must be a match of regex" in caught.value.message


def test_duplicate_inserts_conflict(gce):
    network = gce.make_network(unique("net"))
    with pytest.raises(exceptions.Conflict) as caught:
        gce.networks.insert_unary(
            project=gce.project,
            network_resource=compute_v1.Network(name=network.name, auto_create_subnetworks=False),
        )
    assert compute_error(caught.value) == (
        "alreadyExists",
        f"The resource 'projects/{gce.project}/global/networks/{network.name}' already exists",
    )
    subnet = gce.make_subnet(unique("sub"), network.self_link, "10.8.0.0/26")
    with pytest.raises(exceptions.Conflict):
        gce.subnet_op(subnet.name, network.self_link, "10.9.0.0/26")


def test_missing_resources_are_not_found(gce):
    missing = unique("missing")
    with pytest.raises(exceptions.NotFound) as caught:
        gce.networks.get(project=gce.project, network=missing)
    assert compute_error(caught.value) == (
        "notFound",
        f"The resource 'projects/{gce.project}/global/networks/{missing}' was not found",
    )
    with pytest.raises(exceptions.NotFound):
        gce.subnets.get(project=gce.project, region=gce.region, subnetwork=missing)
    with pytest.raises(exceptions.NotFound) as caught:
        gce.subnet_op(unique("sub"), f"global/networks/{missing}", "10.8.0.0/26")
    assert f"global/networks/{missing}" in caught.value.message
    with pytest.raises(exceptions.NotFound):
        gce.global_ops.wait(project=gce.project, operation="operation-0-missing")


def test_another_project_is_forbidden(gce):
    with pytest.raises(exceptions.Forbidden):
        gce.networks.get(project="someone-elses-project", network="default")


def test_network_with_a_subnet_cannot_be_deleted_until_the_subnet_is(gce, sb):
    network = gce.make_network(unique("net"))
    subnet = gce.make_subnet(unique("sub"), network.self_link, "10.8.0.0/26")
    with pytest.raises(exceptions.BadRequest) as caught:
        gce.networks.delete_unary(project=gce.project, network=network.name)
    assert compute_error(caught.value) == (
        "resourceInUseByAnotherResource",
        f"The network resource 'projects/{gce.project}/global/networks/{network.name}' is already being used by "
        f"'projects/{gce.project}/regions/{gce.region}/subnetworks/{subnet.name}'",
    )

    op = gce.subnets.delete_unary(project=gce.project, region=gce.region, subnetwork=subnet.name)
    assert gce.wait_region(op).operation_type == "delete"
    assert gce.wait_global(gce.networks.delete_unary(project=gce.project, network=network.name)).target_link == (
        network.self_link
    )
    with pytest.raises(exceptions.NotFound):
        gce.networks.get(project=gce.project, network=network.name)
    names = [n["name"] for n in state(sb)["networks"]] + [s["name"] for s in state(sb)["subnetworks"]]
    assert network.name not in names and subnet.name not in names


def test_list_networks_and_subnetworks(gce):
    network = gce.make_network(unique("net"))
    subnets = {gce.make_subnet(unique("sub"), network.self_link, f"10.20.{i}.0/24").name for i in range(3)}

    listed = gce.subnets.list(
        request=compute_v1.ListSubnetworksRequest(project=gce.project, region=gce.region, max_results=2)
    )
    assert subnets <= {s.name for s in listed}  # the pager follows nextPageToken two items at a time

    by_network = gce.subnets.list(
        request=compute_v1.ListSubnetworksRequest(
            project=gce.project, region=gce.region, filter=f'network = "{network.self_link}"'
        )
    )
    assert {s.name for s in by_network} == subnets
    named = gce.networks.list(
        request=compute_v1.ListNetworksRequest(project=gce.project, filter=f"name = {network.name}")
    )
    assert [n.name for n in named] == [network.name]
    assert network.name in {n.name for n in gce.networks.list(project=gce.project)}


def test_injected_429_surfaces_as_too_many_requests(gce, sb):
    sb.add_fault("control", path=f"/projects/{gce.project}/global/networks$", method="POST", status=429, times=1)
    name = unique("net")
    with pytest.raises(exceptions.TooManyRequests):
        gce.networks.insert_unary(
            project=gce.project, network_resource=compute_v1.Network(name=name, auto_create_subnetworks=False)
        )
    assert name not in [n["name"] for n in state(sb)["networks"]]
    assert gce.make_network(name).name == name  # the fault fired once


def test_replace_fault_answers_409_for_an_insert_that_happened(gce, sb):
    sb.add_fault(
        "control",
        path=f"/projects/{gce.project}/global/networks$",
        method="POST",
        action="replace",
        status=409,
        times=1,
    )
    name = unique("net")
    request_id = str(uuid.uuid4())
    request = compute_v1.InsertNetworkRequest(
        project=gce.project,
        network_resource=compute_v1.Network(name=name, auto_create_subnetworks=False),
        request_id=request_id,
    )
    with pytest.raises(exceptions.Conflict):
        gce.networks.insert_unary(request=request)
    assert gce.networks.get(project=gce.project, network=name).name == name
    # A retry with the same requestId gets the first operation back instead of a second 409.
    replayed = gce.networks.insert_unary(request=request)
    assert gce.wait_global(replayed).target_link.endswith(f"/global/networks/{name}")


def test_request_id_makes_a_retried_insert_return_its_first_operation(gce):
    network = gce.make_network(unique("net"))
    request = compute_v1.InsertSubnetworkRequest(
        project=gce.project,
        region=gce.region,
        subnetwork_resource=compute_v1.Subnetwork(
            name=unique("sub"), network=network.self_link, ip_cidr_range="10.8.0.0/26"
        ),
        request_id=str(uuid.uuid4()),
    )
    first = gce.subnets.insert_unary(request=request)
    again = gce.subnets.insert_unary(request=request)
    assert again.name == first.name and again.id == first.id


def test_operation_fault_ends_the_operation_with_compute_error(gce, sb):
    name = unique("net")
    sb.admin.post(
        "/compute/operation-faults",
        json={"operationType": "insert", "target": f"/networks/{name}$", "code": "QUOTA_EXCEEDED"},
    ).raise_for_status()
    op = gce.networks.insert_unary(
        project=gce.project, network_resource=compute_v1.Network(name=name, auto_create_subnetworks=False)
    )
    done = gce.wait_global(op)
    assert [e.code for e in done.error.errors] == ["QUOTA_EXCEEDED"]
    assert done.error.errors[0].message and done.http_error_status_code == 403
    with pytest.raises(exceptions.NotFound):
        gce.networks.get(project=gce.project, network=name)
    assert gce.make_network(name).name == name  # the fault fired once
