"""The Hub's own origin: the JSON API under ``/api/models/...`` and file downloads under ``/{repo}/resolve/...``.

Paths are split from the raw (still percent-encoded) request path: huggingface_hub sends revisions such as
``refs/pr/1`` as ``refs%2Fpr%2F1``, which a decoded path could not tell apart from folders.
"""

from __future__ import annotations

import base64
import hashlib
import json
import posixpath
from urllib.parse import parse_qs, unquote, urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandbox.hub import wire
from sandbox.hub.access import Caller, HubRefusal, caller, hub_error, readable_repo
from sandbox.hub.cdn import cdn_location
from sandbox.hub.repo import DEFAULT_BRANCH, Commit, Repo
from sandbox.hub.state import HubState
from sandbox.hub.transfer import blob_response

TREE_PAGE = 1000
TREE_PAGE_EXPANDED = 50  # the Hub's page sizes for plain and expanded tree listings
TEXT_SUFFIXES = (".json", ".md", ".txt", ".gitattributes", ".py", ".jinja", ".yaml", ".yml", ".csv")
TRUE = ("1", "true", "True")


def _segments(request: Request) -> list[str]:
    raw: bytes = request.scope.get("raw_path") or request.scope["path"].encode()
    parts = [unquote(part) for part in raw.decode("utf-8", "replace").split("/")[1:]]
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def _commit(repo: Repo, revision: str) -> Commit:
    commit = repo.resolve(revision)
    if commit is None:
        raise HubRefusal(hub_error(404, f"Invalid rev id: {revision}", "RevisionNotFound"))
    return commit


def _flag(request: Request, name: str) -> bool:
    return request.query_params.get(name, "false") in TRUE


class HubApi:
    """One endpoint for every Hub path; ``handle`` dispatches on the raw path segments."""

    def __init__(self, state: HubState) -> None:
        self.state = state

    async def handle(self, request: Request) -> Response:
        try:
            return await self._dispatch(request)
        except HubRefusal as refusal:
            return refusal.response

    async def _dispatch(self, request: Request) -> Response:
        parts = _segments(request)
        method = request.method
        if parts[:2] == ["api", "whoami-v2"]:
            return self._whoami(request)
        if len(parts) >= 4 and parts[:2] == ["api", "models"]:
            return await self._api(request, f"{parts[2]}/{parts[3]}", parts[4:])
        if len(parts) >= 2 and parts[0] == "api" and parts[1] in ("datasets", "spaces"):
            return hub_error(404, "Repository not found", "RepoNotFound")
        if len(parts) >= 5 and parts[2] == "resolve" and method in ("GET", "HEAD"):
            return self._resolve(request, f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]))
        return hub_error(404, "Sorry, we can't find the page you are looking for.")

    # API ----------------------------------------------------------------------------------------------------
    async def _api(self, request: Request, repo_id: str, rest: list[str]) -> Response:
        who = caller(self.state, request)
        repo = readable_repo(self.state, repo_id, who, content=False)
        kind = rest[0] if rest else "revision"
        if kind == "paths-info" and request.method == "POST":
            return await self._paths_info(request, repo, "/".join(rest[1:]) or DEFAULT_BRANCH)
        if request.method not in ("GET", "HEAD"):
            return hub_error(405, "Method not allowed")
        if kind == "revision":
            return self._model_info(request, repo, "/".join(rest[1:]) or DEFAULT_BRANCH)
        if kind == "tree":
            revision = rest[1] if len(rest) > 1 else DEFAULT_BRANCH
            return self._tree(request, repo, revision, "/".join(rest[2:]))
        if kind == "refs":
            return JSONResponse(wire.refs(repo, include_prs=_flag(request, "include_prs")))
        if kind == "commits":
            commit = _commit(repo, "/".join(rest[1:]) or DEFAULT_BRANCH)
            return JSONResponse(wire.commits(repo, commit))
        return hub_error(404, "Sorry, we can't find the page you are looking for.")

    def _model_info(self, request: Request, repo: Repo, revision: str) -> Response:
        info = wire.model_info(repo, _commit(repo, revision), blobs=_flag(request, "blobs"))
        expand = request.query_params.getlist("expand") + request.query_params.getlist("expand[]")
        if expand:
            # With expand the Hub returns only the requested properties (and the ids).
            info = {key: value for key, value in info.items() if key in {"_id", "id", *expand}}
        return JSONResponse(info)

    def _tree(self, request: Request, repo: Repo, revision: str, folder: str) -> Response:
        commit = _commit(repo, revision)
        expand = _flag(request, "expand")
        entries = wire.tree(repo, commit, folder, recursive=_flag(request, "recursive"), expand=expand)
        if entries is None:
            raise HubRefusal(hub_error(404, f"{folder} does not exist on {revision}", "EntryNotFound"))
        page = TREE_PAGE_EXPANDED if expand else TREE_PAGE
        cursor = request.query_params.get("cursor")
        start = int(base64.urlsafe_b64decode(cursor.encode())) if cursor else 0
        headers = {}
        if start + page < len(entries):
            # Cursor pagination with a GitHub-style Link header, as huggingface_hub's paginate() follows it.
            params = dict(request.query_params) | {"cursor": base64.urlsafe_b64encode(b"%d" % (start + page)).decode()}
            raw_path = (request.scope.get("raw_path") or request.url.path.encode()).decode()
            url = f"{request.url.scheme}://{request.url.netloc}{raw_path}?{urlencode(params)}"
            headers["Link"] = f'<{url}>; rel="next"'
        return JSONResponse(entries[start : start + page], headers=headers)

    async def _paths_info(self, request: Request, repo: Repo, revision: str) -> Response:
        commit = _commit(repo, revision)
        body = await request.body()
        if request.headers.get("content-type", "").startswith("application/json"):
            form = json.loads(body or b"{}")
            paths, expand = list(form.get("paths", [])), bool(form.get("expand"))
        else:
            fields = parse_qs(body.decode())
            paths, expand = fields.get("paths", []), fields.get("expand", ["false"])[0] in TRUE
        return JSONResponse(wire.paths_info(repo, commit, paths, expand))

    def _whoami(self, request: Request) -> Response:
        who: Caller = caller(self.state, request)
        if who.user is None:
            return hub_error(401, "Invalid username or password.")
        return JSONResponse(
            {
                "type": "user",
                "id": hashlib.sha1(who.user.encode()).hexdigest()[:24],
                "name": who.user,
                "fullname": who.user,
                "email": None,
                "emailVerified": False,
                "isPro": False,
                "orgs": [],
                "auth": {"type": "access_token", "accessToken": {"displayName": "sandbox", "role": "read"}},
            }
        )

    # Files --------------------------------------------------------------------------------------------------
    def _resolve(self, request: Request, repo_id: str, revision: str, path: str) -> Response:
        who = caller(self.state, request)
        base_url = f"{request.url.scheme}://{request.url.netloc}"
        repo = readable_repo(self.state, repo_id, who, content=True, base_url=base_url)
        commit = _commit(repo, revision)
        item = commit.files.get(path)
        headers = {"X-Repo-Commit": commit.sha}
        if item is None:
            # X-Repo-Commit lets huggingface_hub cache that the file does not exist at this commit.
            raise HubRefusal(hub_error(404, "Entry not found", "EntryNotFound", headers))
        if item.is_lfs:
            headers |= {
                "Location": cdn_location(self.state, item),
                "X-Linked-Etag": f'"{item.lfs_sha256}"',
                "X-Linked-Size": str(item.size),
                "ETag": f'"{item.lfs_sha256}"',
            }
            return Response(status_code=302, headers=headers)
        text = posixpath.basename(path).endswith(TEXT_SUFFIXES)
        media_type = "text/plain; charset=utf-8" if text else "application/octet-stream"
        return blob_response(request, item.blob, headers | {"ETag": f'"{item.git_oid}"'}, media_type)
