"""A thin front for fake-gcs-server: bucket settings it ignores, bucket IAM it lacks, faults it cannot inject.

fake-gcs-server stores every bucket in US-CENTRAL1 whatever the request says, keeps no IAM configuration
and answers bucket IAM calls with 404 (FACTS.md). The product checks exactly those settings (lesson 18:
region, uniform access, public access prevention; issue 4: least-privilege bindings), so this front
remembers them per bucket and overlays them on the emulator's answers. Object data does not pass through
here for large uploads: the emulator hands out resumable session URLs on its own origin.
"""

from __future__ import annotations

import base64
import json
import secrets
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

BUCKET_SETTINGS = ("location", "locationType", "labels", "iamConfiguration")
MULTI_REGIONS = {"US", "EU", "ASIA"}
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "host", "content-length"}


def gcs_error(code: int, message: str, reason: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": code, "message": message, "errors": [{"message": message, "domain": "global",
                                                                 "reason": reason}]}},
        status_code=code,
    )  # fmt: skip


def _default_settings(body: dict[str, Any]) -> dict[str, Any]:
    location = str(body.get("location") or "US").upper()
    iam = body.get("iamConfiguration") or {}
    return {
        "location": location,
        "locationType": "multi-region" if location in MULTI_REGIONS else "region",
        "labels": body.get("labels") or {},
        "iamConfiguration": {
            "uniformBucketLevelAccess": {"enabled": bool(iam.get("uniformBucketLevelAccess", {}).get("enabled"))},
            "publicAccessPrevention": iam.get("publicAccessPrevention", "inherited"),
        },
    }


def _merged_iam(current: dict[str, Any], patch: dict[str, Any] | None) -> dict[str, Any]:
    patch = patch or {}
    merged = dict(current)
    if "uniformBucketLevelAccess" in patch:
        merged["uniformBucketLevelAccess"] = {"enabled": bool(patch["uniformBucketLevelAccess"].get("enabled"))}
    if "publicAccessPrevention" in patch:
        merged["publicAccessPrevention"] = patch["publicAccessPrevention"]
    return merged


def _default_policy(bucket: str, project: str) -> dict[str, Any]:
    return {
        "kind": "storage#policy",
        "resourceId": f"projects/_/buckets/{bucket}",
        "version": 1,
        "etag": "CAE=",
        "bindings": [
            {"role": "roles/storage.legacyBucketOwner", "members": [f"projectEditor:{project}",
                                                                    f"projectOwner:{project}"]},
            {"role": "roles/storage.legacyBucketReader", "members": [f"projectViewer:{project}"]},
        ],
    }  # fmt: skip


class GcsFront:
    """Bucket settings and IAM kept here; everything else proxied to the emulator unchanged."""

    def __init__(self, emulator_url: str, project: str) -> None:
        self.emulator_url = emulator_url
        self.project = project
        self.settings: dict[str, dict[str, Any]] = {}
        self.policies: dict[str, dict[str, Any]] = {}
        self.client = httpx.AsyncClient(base_url=emulator_url, timeout=httpx.Timeout(300, connect=10))

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/storage/v1/b", self.create_or_list, methods=["POST", "GET"]),
                Route("/storage/v1/b/{bucket}", self.bucket, methods=["GET", "PATCH", "PUT", "DELETE"]),
                Route("/storage/v1/b/{bucket}/iam", self.iam, methods=["GET", "PUT"]),
                Route("/{path:path}", self.proxy, methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"]),
            ]
        )

    def _overlay(self, bucket: dict[str, Any]) -> dict[str, Any]:
        return {**bucket, **self.settings.get(bucket.get("name", ""), {})}

    async def _forward(self, request: Request, body: bytes | None = None) -> httpx.Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        content = body if body is not None else await request.body()
        return await self.client.request(
            request.method, request.url.path, params=request.url.query, headers=headers, content=content
        )

    def _json(self, upstream: httpx.Response, transform=None) -> Response:
        if upstream.status_code >= 400 or not upstream.content:
            return Response(upstream.content, status_code=upstream.status_code,
                            media_type=upstream.headers.get("content-type"))  # fmt: skip
        data = upstream.json()
        return JSONResponse(transform(data) if transform else data, status_code=upstream.status_code)

    async def create_or_list(self, request: Request) -> Response:
        if request.method == "GET":
            upstream = await self._forward(request)
            return self._json(upstream, lambda d: {**d, "items": [self._overlay(b) for b in d.get("items", [])]})
        body = json.loads(await request.body() or b"{}")
        upstream = await self._forward(request, json.dumps(body).encode())
        if upstream.status_code == 200:
            self.settings[body["name"]] = _default_settings(body)
        return self._json(upstream, self._overlay)

    async def bucket(self, request: Request) -> Response:
        name = request.path_params["bucket"]
        if request.method in ("PATCH", "PUT"):
            body = json.loads(await request.body() or b"{}")
            upstream = await self._forward(request)  # the emulator keeps what it understands
            if upstream.status_code == 200:
                current = self.settings.setdefault(name, _default_settings({}))
                if "labels" in body:
                    current["labels"] = body["labels"] or {}
                if "iamConfiguration" in body:
                    current["iamConfiguration"] = _merged_iam(current["iamConfiguration"], body["iamConfiguration"])
            return self._json(upstream, self._overlay)
        upstream = await self._forward(request)
        if request.method == "DELETE" and upstream.status_code < 300:
            self.settings.pop(name, None)
            self.policies.pop(name, None)
            return Response(status_code=upstream.status_code)
        return self._json(upstream, self._overlay)

    async def iam(self, request: Request) -> Response:
        name = request.path_params["bucket"]
        exists = await self.client.get(f"/storage/v1/b/{name}")
        if exists.status_code == 404:
            return gcs_error(404, "The specified bucket does not exist.", "notFound")
        policy = self.policies.setdefault(name, _default_policy(name, self.project))
        if request.method == "GET":
            return JSONResponse(policy)
        body = json.loads(await request.body() or b"{}")
        if body.get("etag") and body["etag"] != policy["etag"]:
            return gcs_error(412, "Precondition Failed", "conditionNotMet")
        etag = base64.b64encode(secrets.token_bytes(6)).decode()
        self.policies[name] = {**_default_policy(name, self.project), "bindings": body.get("bindings", []),
                               "version": body.get("version", 1), "etag": etag}  # fmt: skip
        return JSONResponse(self.policies[name])

    async def proxy(self, request: Request) -> Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        upstream = await self.client.send(
            self.client.build_request(
                request.method, request.url.path, params=request.url.query, headers=headers, content=request.stream()
            ),
            stream=True,
        )
        passed = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
        return StreamingResponse(upstream.aiter_raw(), status_code=upstream.status_code, headers=passed,
                                 background=BackgroundTask(upstream.aclose))  # fmt: skip

    async def close(self) -> None:
        await self.client.aclose()
