"""Compute Engine API v1 for VPC networks, subnetworks and their operations, as the compute_v1 REST clients call it.

Paths are the REST transport's (``/compute/v1/projects/{project}/global/networks``, ``.../regions/{region}/
subnetworks``, ``.../global|regions/{region}/operations/{operation}[/wait]``). Checks that real Compute makes
before it accepts a request (names, CIDR ranges, overlaps, fingerprints, resources in use) answer with its
HTTP errors and messages; accepted changes return a ``compute#operation`` that finishes on the sandbox clock
(operations.py). ``requestId`` makes a retried mutation return its first operation, as in Compute.
"""

from __future__ import annotations

import ipaddress
import json
import time
import uuid
from collections.abc import Callable

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from sandbox.control import ControlContext
from sandbox.control.compute import resources as res
from sandbox.control.compute.operations import OPERATION_SECONDS, ComputeOperation, OperationFault, new_operation_name

API = "/compute/v1/projects/{project}"
# Fields of a subnetwork that PATCH may change (the API reference marks the others create-only).
PATCHABLE = {
    "privateIpGoogleAccess",
    "secondaryIpRanges",
    "enableFlowLogs",
    "logConfig",
    "privateIpv6GoogleAccess",
    "stackType",
    "role",
    "drainTimeoutSeconds",
}
# Output-only or identity fields a client may echo back in a PATCH body (read-modify-write) unchanged.
ECHOED = {
    "kind",
    "id",
    "name",
    "creationTimestamp",
    "selfLink",
    "network",
    "region",
    "gatewayAddress",
    "fingerprint",
    "ipCidrRange",
    "purpose",
    "description",
}


class Compute:
    """VPC networks and subnetworks of the sandbox project, with global and regional operations."""

    name = "compute"

    def __init__(self, ctx: ControlContext) -> None:
        self.ctx = ctx
        self.networks: dict[str, dict] = {}  # by name; stored as the JSON Compute returns
        self.subnetworks: dict[tuple[str, str], dict] = {}  # by (region, name)
        self.operations: dict[tuple[str, str], ComputeOperation] = {}  # by (region or "", name)
        self.request_ids: dict[str, ComputeOperation] = {}
        self.operation_faults: list[OperationFault] = []

    # Routing ----------------------------------------------------------------------------------------------
    def routes(self) -> list[BaseRoute]:
        networks = f"{API}/global/networks"
        subnets = f"{API}/regions/{{region}}/subnetworks"
        global_ops = f"{API}/global/operations"
        region_ops = f"{API}/regions/{{region}}/operations"
        return [
            Route(networks, self.list_networks, methods=["GET"]),
            Route(networks, self.insert_network, methods=["POST"]),
            Route(f"{networks}/{{network}}", self.get_network, methods=["GET"]),
            Route(f"{networks}/{{network}}", self.delete_network, methods=["DELETE"]),
            Route(f"{API}/aggregated/subnetworks", self.aggregated_subnetworks, methods=["GET"]),
            Route(subnets, self.list_subnetworks, methods=["GET"]),
            Route(subnets, self.insert_subnetwork, methods=["POST"]),
            Route(f"{subnets}/{{subnetwork}}", self.get_subnetwork, methods=["GET"]),
            Route(f"{subnets}/{{subnetwork}}", self.patch_subnetwork, methods=["PATCH"]),
            Route(f"{subnets}/{{subnetwork}}", self.delete_subnetwork, methods=["DELETE"]),
            Route(f"{subnets}/{{subnetwork}}/setPrivateIpGoogleAccess", self.set_private_access, methods=["POST"]),
            Route(f"{subnets}/{{subnetwork}}/expandIpCidrRange", self.expand_range, methods=["POST"]),
            Route(global_ops, self.list_operations, methods=["GET"]),
            Route(f"{global_ops}/{{operation}}", self.get_operation, methods=["GET"]),
            Route(f"{global_ops}/{{operation}}", self.delete_operation, methods=["DELETE"]),
            Route(f"{global_ops}/{{operation}}/wait", self.wait_operation, methods=["POST"]),
            Route(region_ops, self.list_operations, methods=["GET"]),
            Route(f"{region_ops}/{{operation}}", self.get_operation, methods=["GET"]),
            Route(f"{region_ops}/{{operation}}", self.delete_operation, methods=["DELETE"]),
            Route(f"{region_ops}/{{operation}}/wait", self.wait_operation, methods=["POST"]),
        ]

    def admin_routes(self) -> list[BaseRoute]:
        return [
            Route("/state", self.admin_state, methods=["GET"]),
            Route("/operation-faults", self.admin_add_operation_fault, methods=["POST"]),
            Route("/operation-faults", self.admin_list_operation_faults, methods=["GET"]),
            Route("/operation-faults", self.admin_clear_operation_faults, methods=["DELETE"]),
        ]

    async def shutdown(self) -> None:
        pass  # state lives in memory only; nothing runs in the background

    # Lookups other modules may use (e.g. Cloud Run checking a Direct VPC egress interface) ------------------
    def network(self, name: str) -> dict | None:
        """The stored network JSON, or None."""
        return self.networks.get(res.last_segment(name))

    def subnetwork(self, region: str, name: str) -> dict | None:
        """The stored subnetwork JSON, or None."""
        return self.subnetworks.get((region, res.last_segment(name)))

    # Helpers ----------------------------------------------------------------------------------------------
    @property
    def base(self) -> str:
        return f"{self.ctx.control_url}/compute/v1"

    def _project(self, request: Request, permission: str) -> str:
        project = request.path_params["project"]
        if project != self.ctx.config.project:
            raise res.forbidden(permission, request.url.path.removeprefix("/compute/v1/"))
        return project

    def _region(self, request: Request) -> str:
        return res.check_region(request.path_params["region"])

    async def _body(self, request: Request) -> dict:
        raw = await request.body()
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except ValueError:
            raise res.invalid("Invalid JSON payload received.") from None
        if not isinstance(body, dict):
            raise res.invalid("Invalid JSON payload received. Expected an object.")
        return body

    def _replayed(self, request: Request) -> JSONResponse | None:
        """The first operation of a retried mutation with the same ``requestId``, without doing it again."""
        request_id = request.query_params.get("requestId")
        if not request_id:
            return None
        try:
            parsed = uuid.UUID(request_id)
        except ValueError:
            raise res.invalid_field("requestId", request_id, "The request ID must be a valid UUID.") from None
        if parsed.int == 0:
            raise res.invalid_field("requestId", request_id, "The zero UUID is not supported.")
        op = self.request_ids.get(request_id)
        return JSONResponse(op.to_json()) if op is not None else None

    def _operation(
        self,
        request: Request,
        operation_type: str,
        target_link: str,
        target_id: str,
        apply: Callable[[], None],
        region: str = "",
    ) -> JSONResponse:
        """Start an operation for an accepted change: apply it now, or record an injected failure instead."""
        project = request.path_params["project"]
        name = new_operation_name()
        scope = f"{self.base}/projects/{project}" + (f"/regions/{region}" if region else "/global")
        op = ComputeOperation(
            name=name,
            project=project,
            region=region,
            operation_type=operation_type,
            target_link=target_link,
            target_id=target_id,
            self_link=f"{scope}/operations/{name}",
            region_link=f"{self.base}/projects/{project}/regions/{region}" if region else "",
        )
        # Read the clock at every start: tests may change the time scale of a running sandbox.
        op.finish_at = op.created + OPERATION_SECONDS * self.ctx.config.time_scale
        fault = next((f for f in self.operation_faults if f.matches(operation_type, target_link)), None)
        if fault is not None:
            fault.fired += 1
            op.error = {"code": fault.code, "message": fault.message, "httpErrorStatusCode": fault.http_status}
        else:
            apply()
        self.operations[(region, name)] = op
        if request_id := request.query_params.get("requestId"):
            self.request_ids[request_id] = op
        return JSONResponse(op.to_json())

    def _network_path(self, project: str, name: str) -> str:
        return f"projects/{project}/global/networks/{name}"

    def _subnet_path(self, project: str, region: str, name: str) -> str:
        return f"projects/{project}/regions/{region}/subnetworks/{name}"

    def _get_network(self, project: str, name: str) -> dict:
        network = self.networks.get(name)
        if network is None:
            raise res.not_found(self._network_path(project, name))
        return network

    def _get_subnet(self, project: str, region: str, name: str) -> dict:
        subnet = self.subnetworks.get((region, name))
        if subnet is None:
            raise res.not_found(self._subnet_path(project, region, name))
        return subnet

    def _network_json(self, network: dict) -> dict:
        links = [s["selfLink"] for s in self.subnetworks.values() if s["network"] == network["selfLink"]]
        return {**network, "subnetworks": links} if links else dict(network)

    def _list(self, request: Request, kind: str, list_id: str, items: list[dict]) -> JSONResponse:
        query = dict(request.query_params)
        matches = res.compile_filter(query.get("filter"))
        selected = res.order([i for i in items if matches(i)], query.get("orderBy"))
        chunk, following = res.page(selected, query)
        body: dict = {"kind": kind, "id": list_id, "selfLink": f"{self.base}/{list_id}"}
        if chunk:  # Compute omits "items" from an empty list
            body["items"] = chunk
        if following:
            body["nextPageToken"] = following
        return JSONResponse(body)

    # Networks ---------------------------------------------------------------------------------------------
    async def list_networks(self, request: Request) -> JSONResponse:
        project = self._project(request, "compute.networks.list")
        items = [self._network_json(n) for n in self.networks.values()]
        return self._list(request, "compute#networkList", f"projects/{project}/global/networks", items)

    async def get_network(self, request: Request) -> JSONResponse:
        project = self._project(request, "compute.networks.get")
        return JSONResponse(self._network_json(self._get_network(project, request.path_params["network"])))

    async def insert_network(self, request: Request) -> JSONResponse:
        project = self._project(request, "compute.networks.create")
        body = await self._body(request)
        if replay := self._replayed(request):
            return replay
        name = res.check_name(body.get("name"))
        path = self._network_path(project, name)
        if name in self.networks:
            raise res.already_exists(path)
        auto = body.get("autoCreateSubnetworks")
        if auto is None:
            # Without it Compute makes a legacy network, which Direct VPC egress cannot use; not modelled.
            raise res.invalid_field(
                "resource.autoCreateSubnetworks",
                "",
                "The sandbox models VPC networks only: set autoCreateSubnetworks (false for a custom-mode network).",
            )
        if "IPv4Range" in body:
            raise res.invalid_field("resource.IPv4Range", body["IPv4Range"], "Legacy networks are not supported.")
        routing = body.get("routingConfig") or {}
        mode = routing.get("routingMode", "REGIONAL")
        if mode not in res.ROUTING_MODES:
            raise res.invalid_field("resource.routingConfig.routingMode", mode, "Must be REGIONAL or GLOBAL.")
        mtu = body.get("mtu", res.MTU_DEFAULT)
        if not isinstance(mtu, int) or not res.MTU_MIN <= mtu <= res.MTU_MAX:
            raise res.invalid_field(
                "resource.mtu", mtu, f"MTU must be between {res.MTU_MIN} and {res.MTU_MAX} (inclusive)."
            )
        network_id = res.new_id()
        link = f"{self.base}/{path}"
        network = {
            "kind": "compute#network",
            "id": network_id,
            "creationTimestamp": res.timestamp(),
            "name": name,
            "selfLink": link,
            "selfLinkWithId": f"{self.base}/projects/{project}/global/networks/{network_id}",
            "autoCreateSubnetworks": bool(auto),
            "routingConfig": {**routing, "routingMode": mode, "bgpBestPathSelectionMode": "LEGACY"},
            "mtu": mtu,
            "networkFirewallPolicyEnforcementOrder": body.get(
                "networkFirewallPolicyEnforcementOrder", "AFTER_CLASSIC_FIREWALL"
            ),
        }
        if body.get("description"):
            network["description"] = body["description"]
        # Auto mode would create one subnet per region in 10.128.0.0/9; the sandbox records the mode only.
        return self._operation(request, "insert", link, network_id, lambda: self.networks.__setitem__(name, network))

    async def delete_network(self, request: Request) -> JSONResponse:
        project = self._project(request, "compute.networks.delete")
        if replay := self._replayed(request):
            return replay
        name = request.path_params["network"]
        network = self._get_network(project, name)
        for (region, subnet_name), subnet in self.subnetworks.items():
            if subnet["network"] == network["selfLink"]:
                raise res.in_use(
                    "network", self._network_path(project, name), self._subnet_path(project, region, subnet_name)
                )
        return self._operation(
            request, "delete", network["selfLink"], network["id"], lambda: self.networks.pop(name, None)
        )

    # Subnetworks ------------------------------------------------------------------------------------------
    async def list_subnetworks(self, request: Request) -> JSONResponse:
        project = self._project(request, "compute.subnetworks.list")
        region = self._region(request)
        items = [s for (r, _), s in self.subnetworks.items() if r == region]
        return self._list(request, "compute#subnetworkList", f"projects/{project}/regions/{region}/subnetworks", items)

    async def aggregated_subnetworks(self, request: Request) -> JSONResponse:
        project = self._project(request, "compute.subnetworks.list")
        matches = res.compile_filter(request.query_params.get("filter"))
        scoped: dict[str, dict] = {}
        for (region, _), subnet in self.subnetworks.items():
            if matches(subnet):
                scoped.setdefault(f"regions/{region}", {"subnetworks": []})["subnetworks"].append(subnet)
        list_id = f"projects/{project}/aggregated/subnetworks"
        body = {"kind": "compute#subnetworkAggregatedList", "id": list_id, "selfLink": f"{self.base}/{list_id}"}
        return JSONResponse({**body, "items": scoped} if scoped else body)

    async def get_subnetwork(self, request: Request) -> JSONResponse:
        project = self._project(request, "compute.subnetworks.get")
        region = self._region(request)
        return JSONResponse(self._get_subnet(project, region, request.path_params["subnetwork"]))

    async def insert_subnetwork(self, request: Request) -> JSONResponse:
        project = self._project(request, "compute.subnetworks.create")
        region = self._region(request)
        body = await self._body(request)
        if replay := self._replayed(request):
            return replay
        name = res.check_name(body.get("name"))
        path = self._subnet_path(project, region, name)
        if (region, name) in self.subnetworks:
            raise res.already_exists(path)
        if body.get("region") and res.last_segment(body["region"]) != region:
            raise res.invalid_field("resource.region", body["region"], f"Must be '{region}', the request's region.")
        network_project, network_name = res.network_ref(body.get("network"))
        if network_project not in (None, project):
            # Shared VPC host projects are not modelled: the sandbox has one project, so it is not found.
            raise res.not_found(self._network_path(network_project, network_name))
        network = self._get_network(project, network_name)
        primary = res.parse_range(body.get("ipCidrRange"))
        secondaries = self._secondary_ranges(body.get("secondaryIpRanges") or [])
        purpose = body.get("purpose", "PRIVATE")
        if purpose not in res.SUBNET_PURPOSES:
            raise res.invalid_field("resource.purpose", purpose, "Unknown purpose.")
        stack_type = self._stack_type(body.get("stackType", "IPV4_ONLY"))
        self._check_overlaps(network["selfLink"], [primary, *secondaries.values()], exclude=None)
        subnet_id = res.new_id()
        link = f"{self.base}/{path}"
        subnet = {
            "kind": "compute#subnetwork",
            "id": subnet_id,
            "creationTimestamp": res.timestamp(),
            "name": name,
            "network": network["selfLink"],
            "ipCidrRange": str(primary),
            "gatewayAddress": str(primary.network_address + 1),
            "region": f"{self.base}/projects/{project}/regions/{region}",
            "selfLink": link,
            "privateIpGoogleAccess": bool(body.get("privateIpGoogleAccess", False)),
            "fingerprint": res.new_fingerprint(),
            "enableFlowLogs": bool(body.get("enableFlowLogs", False)),
            "privateIpv6GoogleAccess": body.get("privateIpv6GoogleAccess", "DISABLE_GOOGLE_ACCESS"),
            "purpose": purpose,
            "stackType": stack_type,
        }
        if secondaries:
            subnet["secondaryIpRanges"] = [{"rangeName": k, "ipCidrRange": str(v)} for k, v in secondaries.items()]
        for optional in ("description", "role", "logConfig"):
            if body.get(optional):
                subnet[optional] = body[optional]
        return self._operation(
            request,
            "insert",
            link,
            subnet_id,
            lambda: self.subnetworks.__setitem__((region, name), subnet),
            region,
        )

    async def delete_subnetwork(self, request: Request) -> JSONResponse:
        project = self._project(request, "compute.subnetworks.delete")
        region = self._region(request)
        if replay := self._replayed(request):
            return replay
        name = request.path_params["subnetwork"]
        subnet = self._get_subnet(project, region, name)
        if self._serverless_holds(region, name):
            # Compute names the address Cloud Run reserved, not the service (nitrictech/nitric issue 667:
            # "... is already being used by 'projects/P/regions/R/addresses/serverless-ipv4-1721014303789269923'").
            holder = f"projects/{project}/regions/{region}/addresses/serverless-ipv4-{subnet['id']}"
            raise res.in_use("subnetwork", self._subnet_path(project, region, name), holder)
        return self._operation(
            request,
            "delete",
            subnet["selfLink"],
            subnet["id"],
            lambda: self.subnetworks.pop((region, name), None),
            region,
        )

    async def set_private_access(self, request: Request) -> JSONResponse:
        project = self._project(request, "compute.subnetworks.setPrivateIpGoogleAccess")
        region = self._region(request)
        body = await self._body(request)
        if replay := self._replayed(request):
            return replay
        subnet = self._get_subnet(project, region, request.path_params["subnetwork"])
        enabled = body.get("privateIpGoogleAccess", False)
        if not isinstance(enabled, bool):
            raise res.invalid_field("privateIpGoogleAccess", enabled, "Must be a boolean.")

        def apply() -> None:
            subnet["privateIpGoogleAccess"] = enabled
            subnet["fingerprint"] = res.new_fingerprint()

        return self._operation(request, "setPrivateIpGoogleAccess", subnet["selfLink"], subnet["id"], apply, region)

    async def patch_subnetwork(self, request: Request) -> JSONResponse:
        project = self._project(request, "compute.subnetworks.update")
        region = self._region(request)
        body = await self._body(request)
        if replay := self._replayed(request):
            return replay
        subnet = self._get_subnet(project, region, request.path_params["subnetwork"])
        # Compute's optimistic locking: the caller must send the fingerprint it read; stale or missing is a 412.
        if body.get("fingerprint") != subnet["fingerprint"]:
            raise res.stale_fingerprint()
        changes: dict = {}
        for key, value in body.items():
            if key in PATCHABLE:
                changes[key] = value
            elif key in ECHOED:
                current = subnet.get(key)
                if key == "network":
                    same = res.network_ref(value)[1] == res.last_segment(current)
                elif key == "region":
                    same = res.last_segment(value) == region
                else:
                    same = value == current or key == "fingerprint"
                if not same:
                    why = "Use expandIpCidrRange." if key == "ipCidrRange" else "The field cannot be changed."
                    raise res.invalid_field(f"resource.{key}", value, why)
            else:
                raise res.invalid_field(f"resource.{key}", value, "The field cannot be changed with patch.")
        if "stackType" in changes:
            self._stack_type(changes["stackType"])
        access = changes.get("privateIpGoogleAccess", False)
        if not isinstance(access, bool):
            raise res.invalid_field("resource.privateIpGoogleAccess", access, "Must be a boolean.")
        if "secondaryIpRanges" in changes:
            secondaries = self._secondary_ranges(changes["secondaryIpRanges"] or [])
            self._check_overlaps(
                subnet["network"],
                [ipaddress.IPv4Network(subnet["ipCidrRange"]), *secondaries.values()],
                exclude=(region, subnet["name"]),
            )
            changes["secondaryIpRanges"] = [{"rangeName": k, "ipCidrRange": str(v)} for k, v in secondaries.items()]

        def apply() -> None:
            subnet.update(changes)
            if not subnet.get("secondaryIpRanges"):
                subnet.pop("secondaryIpRanges", None)
            subnet["fingerprint"] = res.new_fingerprint()

        return self._operation(request, "patch", subnet["selfLink"], subnet["id"], apply, region)

    async def expand_range(self, request: Request) -> JSONResponse:
        project = self._project(request, "compute.subnetworks.expandIpCidrRange")
        region = self._region(request)
        body = await self._body(request)
        if replay := self._replayed(request):
            return replay
        subnet = self._get_subnet(project, region, request.path_params["subnetwork"])
        wider = res.parse_range(body.get("ipCidrRange"), "ipCidrRange")
        current = ipaddress.IPv4Network(subnet["ipCidrRange"])
        if wider.prefixlen >= current.prefixlen or not current.subnet_of(wider):
            raise res.invalid_field(
                "ipCidrRange", str(wider), f"The new range must contain the current range {current} and be larger."
            )
        self._check_overlaps(subnet["network"], [wider], exclude=(region, subnet["name"]))

        def apply() -> None:
            subnet["ipCidrRange"] = str(wider)
            subnet["fingerprint"] = res.new_fingerprint()

        return self._operation(request, "expandIpCidrRange", subnet["selfLink"], subnet["id"], apply, region)

    def _secondary_ranges(self, entries: object) -> dict[str, ipaddress.IPv4Network]:
        if not isinstance(entries, list):
            raise res.invalid_field("resource.secondaryIpRanges", entries, "Must be a list.")
        found: dict[str, ipaddress.IPv4Network] = {}
        for i, entry in enumerate(entries):
            entry = entry if isinstance(entry, dict) else {}
            name = res.check_name(entry.get("rangeName"), f"resource.secondaryIpRanges[{i}].rangeName")
            if name in found:
                raise res.invalid_field(
                    f"resource.secondaryIpRanges[{i}].rangeName", name, "Secondary range names must be unique."
                )
            found[name] = res.parse_range(entry.get("ipCidrRange"), f"resource.secondaryIpRanges[{i}].ipCidrRange")
        return found

    def _stack_type(self, value: object) -> str:
        if value != "IPV4_ONLY":
            # Dual-stack needs IPv6 ranges the sandbox does not allocate; say so rather than pretend.
            raise res.invalid_field("resource.stackType", value, "The sandbox supports IPV4_ONLY subnetworks only.")
        return value

    def _check_overlaps(
        self, network_link: str, ranges: list[ipaddress.IPv4Network], exclude: tuple[str, str] | None
    ) -> None:
        """No two ranges in one VPC network may overlap, whatever their regions (primary or secondary)."""
        for i, candidate in enumerate(ranges):
            for other in ranges[i + 1 :]:
                if candidate.overlaps(other):
                    raise res.invalid(f"Invalid IPCidrRange: {other} conflicts with {candidate} in the same request.")
        for (region, name), subnet in self.subnetworks.items():
            if subnet["network"] != network_link or (region, name) == exclude:
                continue
            taken = [subnet["ipCidrRange"], *(r["ipCidrRange"] for r in subnet.get("secondaryIpRanges", []))]
            for candidate in ranges:
                if any(candidate.overlaps(ipaddress.IPv4Network(t)) for t in taken):
                    raise res.invalid(
                        f"Invalid IPCidrRange: {candidate} conflicts with existing subnetwork '{name}' "
                        f"in region '{region}'."
                    )

    def _serverless_holds(self, region: str, subnet_name: str) -> bool:
        """Whether Cloud Run's Direct VPC egress still reserves IPs in this subnet, so Compute refuses to delete it.

        A service (any of its revisions) holds them while it exists, and a deleted one for
        ``serverless_ip_hold_seconds`` after its deletion. Cloud Run docs, "Direct VPC egress with a VPC
        network" -> "Delete a subnet": "After you delete or move your Cloud Run resources, wait 1-2 hours for Cloud
        Run to release the IPs before you delete the subnet." (also terraform-provider-google users, nitric 667).
        """
        run = self.ctx.module("run")
        if run is None:
            return False
        # Read the clock at every check: tests change the hold and the time scale of a running sandbox.
        hold = self.ctx.config.serverless_ip_hold_seconds * self.ctx.config.time_scale
        now = time.monotonic()
        records = list(run.services.values())
        records += [record for record, deleted_at in run.deleted_services.values() if now - deleted_at < hold]
        for record in records:
            if f"/locations/{region}/" not in record.service.name:
                continue
            vpcs = [record.service.template.vpc_access, *(r.vpc_access for r in record.revisions.values())]
            for vpc in vpcs:
                for interface in vpc.network_interfaces:
                    # Only a network given: the subnet has the network's name (Cloud Run docs, Direct VPC egress).
                    used = interface.subnetwork or interface.network
                    if used and res.last_segment(used) == subnet_name:
                        return True
        return False

    # Operations -------------------------------------------------------------------------------------------
    def _find_operation(self, request: Request) -> ComputeOperation:
        region = request.path_params.get("region", "")
        kind = "regionOperations" if region else "globalOperations"
        project = self._project(request, f"compute.{kind}.get")
        name = request.path_params["operation"]
        op = self.operations.get((region, name))
        if op is None:
            scope = f"regions/{region}" if region else "global"
            raise res.not_found(f"projects/{project}/{scope}/operations/{name}")
        return op

    async def get_operation(self, request: Request) -> JSONResponse:
        return JSONResponse(self._find_operation(request).to_json())

    async def wait_operation(self, request: Request) -> JSONResponse:
        # Real wait blocks up to 2 minutes until DONE; the sandbox simply finishes the operation now.
        op = self._find_operation(request)
        op.finish_now()
        return JSONResponse(op.to_json())

    async def delete_operation(self, request: Request) -> Response:
        op = self._find_operation(request)
        del self.operations[(op.region, op.name)]
        return JSONResponse({})

    async def list_operations(self, request: Request) -> JSONResponse:
        region = request.path_params.get("region", "")
        kind = "regionOperations" if region else "globalOperations"
        project = self._project(request, f"compute.{kind}.list")
        scope = f"regions/{res.check_region(region)}" if region else "global"
        items = [op.to_json() for (r, _), op in self.operations.items() if r == region]
        return self._list(request, "compute#operationList", f"projects/{project}/{scope}/operations", items)

    # Admin ------------------------------------------------------------------------------------------------
    async def admin_state(self, _: Request) -> JSONResponse:
        """Everything stored, for tests: networks (with their subnetwork links), subnetworks, operations."""
        now = time.monotonic()
        return JSONResponse(
            {
                "networks": [self._network_json(n) for n in self.networks.values()],
                "subnetworks": list(self.subnetworks.values()),
                "operations": [
                    {
                        "name": op.name,
                        "region": op.region,
                        "operationType": op.operation_type,
                        "targetLink": op.target_link,
                        "status": op.status(now),
                        "error": op.error,
                    }
                    for op in self.operations.values()
                ],
            }
        )

    async def admin_add_operation_fault(self, request: Request) -> JSONResponse:
        """``{"operationType", "target", "code", "message", "httpErrorStatusCode", "times"}`` (see OperationFault)."""
        try:
            fault = OperationFault.model_validate(await request.json())
        except (ValidationError, ValueError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        self.operation_faults.append(fault)
        return JSONResponse(fault.model_dump(by_alias=True))

    async def admin_list_operation_faults(self, _: Request) -> JSONResponse:
        return JSONResponse([f.model_dump(by_alias=True) for f in self.operation_faults])

    async def admin_clear_operation_faults(self, _: Request) -> JSONResponse:
        self.operation_faults.clear()
        return JSONResponse({})
