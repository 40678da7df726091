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
import re
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
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
CONTENT_RANGE = re.compile(r"^bytes (?:(\d+)-(\d+)|\*)/(\d+|\*)$")
FINAL_QUERY = ("ifGenerationMatch", "ifGenerationNotMatch", "ifMetagenerationMatch", "ifMetagenerationNotMatch",
               "predefinedAcl", "kmsKeyName")  # fmt: skip


@dataclass
class UploadSession:
    bucket: str
    metadata: dict[str, Any]
    content_type: str
    path: Path
    query: dict[str, str] = field(default_factory=dict)
    received: int = 0


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

    def __init__(self, emulator_url: str, project: str, spool_dir: Path) -> None:
        self.emulator_url = emulator_url
        self.project = project
        self.spool_dir = spool_dir
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        self.settings: dict[str, dict[str, Any]] = {}
        self.policies: dict[str, dict[str, Any]] = {}
        self.uploads: dict[str, UploadSession] = {}
        # Set by the runtime to IAM's check: the "does not exist" message for a service account member that IAM
        # cannot see yet (missing, or created moments ago), else None.
        self.missing_account: Callable[[str], str | None] | None = None
        self.client = httpx.AsyncClient(base_url=emulator_url, timeout=httpx.Timeout(600, connect=10))

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/storage/v1/b", self.create_or_list, methods=["POST", "GET"]),
                Route("/storage/v1/b/{bucket}", self.bucket, methods=["GET", "PATCH", "PUT", "DELETE"]),
                Route("/storage/v1/b/{bucket}/iam", self.iam, methods=["GET", "PUT"]),
                Route("/upload/storage/v1/b/{bucket}/o", self.upload, methods=["POST", "PUT"]),
                Route("/{path:path}", self.proxy, methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"]),
            ]
        )

    def bucket_policy(self, bucket: str) -> dict[str, Any]:
        """The bucket's IAM policy as ``getIamPolicy`` shows it (for permission checks in sandbox.authz)."""
        return self.policies.get(bucket) or _default_policy(bucket, self.project)

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
            # A policy with conditions is version 3; asking for less fails rather than dropping them ("Requested
            # policy version (1) cannot be less than the existing policy version (3).": googleapis/google-cloud-ruby's
            # storage acceptance test for IAM Conditions, PR 4466). No version asked is version 1.
            asked = request.query_params.get("optionsRequestedPolicyVersion") or "1"
            conditional = any(b.get("condition") for b in policy.get("bindings", []))
            if conditional and asked.isdigit() and int(asked) < 3:
                message = (
                    f"Requested policy version ({int(asked)}) cannot be less than the existing policy version (3)."
                )
                return gcs_error(400, message, "invalid")
            return JSONResponse(policy)
        body = json.loads(await request.body() or b"{}")
        if body.get("etag") and body["etag"] != policy["etag"]:
            return gcs_error(412, "Precondition Failed", "conditionNotMet")
        for binding in body.get("bindings", []):
            for member in binding.get("members", []):
                missing = self.missing_account(member) if self.missing_account else None
                if missing and member.startswith("serviceAccount:"):
                    # Storage's own error shape for a member IAM cannot see yet: 400 with reason "invalid"
                    # ("Error 400: Service account X does not exist., invalid": GoogleCloudPlatform/
                    # data-migration-tool issue 58, a bucket binding made right after creating the account).
                    return gcs_error(400, missing, "invalid")
        etag = base64.b64encode(secrets.token_bytes(6)).decode()
        self.policies[name] = {**_default_policy(name, self.project), "bindings": body.get("bindings", []),
                               "version": body.get("version", 1), "etag": etag}  # fmt: skip
        return JSONResponse(self.policies[name])

    async def upload(self, request: Request) -> Response:
        if request.method == "POST" and request.query_params.get("uploadType") == "resumable":
            return await self._start_upload(request)
        if request.method == "PUT" and "upload_id" in request.query_params:
            return await self._upload_chunk(request)
        return await self.proxy(request)

    async def _start_upload(self, request: Request) -> Response:
        bucket = request.path_params["bucket"]
        if (await self.client.get(f"/storage/v1/b/{bucket}")).status_code == 404:
            return gcs_error(404, "The specified bucket does not exist.", "notFound")
        body = await request.body()
        metadata = json.loads(body) if body else {}
        if "name" in request.query_params:
            metadata["name"] = request.query_params["name"]
        if not metadata.get("name"):
            return gcs_error(400, "Required object name is missing", "required")
        upload_id = secrets.token_urlsafe(16)
        session = UploadSession(
            bucket=bucket,
            metadata=metadata,
            content_type=request.headers.get("x-upload-content-type", "application/octet-stream"),
            path=self.spool_dir / upload_id,
            query={k: v for k, v in request.query_params.items() if k in FINAL_QUERY},
        )
        session.path.write_bytes(b"")
        self.uploads[upload_id] = session
        base = str(request.base_url).rstrip("/")
        location = f"{base}/upload/storage/v1/b/{bucket}/o?uploadType=resumable&upload_id={upload_id}"
        return Response(status_code=200, headers={"Location": location, "X-GUploader-UploadID": upload_id})

    async def _upload_chunk(self, request: Request) -> Response:
        upload_id = request.query_params["upload_id"]
        session = self.uploads.get(upload_id)
        if session is None:
            return gcs_error(404, "No such upload session (it finished, failed or expired).", "notFound")
        match = CONTENT_RANGE.match(request.headers.get("content-range", "bytes */*"))
        if match is None:
            return gcs_error(400, "Malformed Content-Range header", "invalid")
        start, _end, total_text = match.groups()
        if start is not None and int(start) != session.received:
            return self._incomplete(session)  # the client resends from where we are
        with session.path.open("ab") as spool:
            async for part in request.stream():
                spool.write(part)
                session.received += len(part)
        if total_text == "*" or session.received < int(total_text):
            return self._incomplete(session)
        del self.uploads[upload_id]
        try:
            return await self._finish(session)
        finally:
            session.path.unlink(missing_ok=True)

    @staticmethod
    def _incomplete(session: UploadSession) -> Response:
        headers = {"Range": f"bytes=0-{session.received - 1}"} if session.received else {}
        return Response(status_code=308, headers=headers)

    async def _finish(self, session: UploadSession) -> Response:
        """Write the spooled object to the emulator in one multipart request."""
        boundary = f"sandbox-{secrets.token_hex(8)}"
        head = (
            f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{json.dumps(session.metadata)}\r\n"
            f"--{boundary}\r\nContent-Type: {session.content_type}\r\n\r\n"
        ).encode()
        tail = f"\r\n--{boundary}--\r\n".encode()

        async def body() -> AsyncIterator[bytes]:
            yield head
            with session.path.open("rb") as spool:
                while block := spool.read(4 * 1024 * 1024):
                    yield block
            yield tail

        upstream = await self.client.post(
            f"/upload/storage/v1/b/{session.bucket}/o",
            params={"uploadType": "multipart", **session.query},
            headers={"Content-Type": f"multipart/related; boundary={boundary}",
                     "Content-Length": str(len(head) + session.received + len(tail))},
            content=body(),
        )  # fmt: skip
        return Response(upstream.content, status_code=upstream.status_code,
                        media_type=upstream.headers.get("content-type"))  # fmt: skip

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
