"""Admin API of the Hub stand-in, mounted at ``/_sandbox/hub`` on the control plane. JSON in, JSON out.

Repo ids are always ``namespace/name``. Errors answer ``{"error": ...}`` with 400 (bad input), 404 (no such
repo or revision) or 409 (repo exists). Work that hashes weights runs in a worker thread.

- ``GET /repos`` -> ``[RepoSummary]``; a summary is ``{repo_id, private, gated, granted, branches: {name: sha},
  tags: {name: sha}, commits: [{sha, parent, message, date}] (newest first), generator}``.
- ``POST /repos`` ``{repo_id, private?, gated?: false|"auto"|"manual", replace?, message?, ...ModelSpec}``
  (ModelSpec: weight_bytes, shards, dtype, include_bin_duplicate, bin_bytes, include_original,
  original_bytes, seed, context_length, architecture, model_type, answers, reference) -> ``RepoDetail`` of a
  generated model.
- ``POST /repos/from-folder`` ``{repo_id, folder, private?, gated?, replace?, message?}`` -> ``RepoDetail``.
- ``GET /repos/{ns}/{name}?revision=main`` -> ``RepoDetail`` = summary + ``{revision, sha, files: [{path,
  size, oid, lfs_sha256}]}`` at that revision.
- ``PATCH /repos/{ns}/{name}`` ``{private?, gated?}`` -> ``RepoSummary``.
- ``DELETE /repos/{ns}/{name}`` -> ``{"deleted": repo_id}``.
- ``POST /repos/{ns}/{name}/commits`` ``{branch?: "main", message?, files?: {path: base64 | null},
  regenerate_weights?: seed, base?: revision for a new branch}`` -> ``{"commit": sha, ...RepoDetail}``.
  ``null`` deletes a file; ``regenerate_weights`` rewrites every weight file of a generated repo.
  Paths are refused as the Hub refuses them (a '..' or '.git' segment), unless ``hostile_mirror: true``, which
  stores any name (absolute, '..', '//', backslashes, control characters) and takes ``listed_sizes: {path: int |
  null}``, the sizes the repo's listings then announce instead of the real ones (null leaves the size out): what a
  broken or hostile mirror given as ``hub_endpoint`` can serve.
- ``POST /repos/{ns}/{name}/tags`` and ``/branches`` ``{name, revision?: "main"}`` -> ``{name, sha}``;
  ``DELETE /repos/{ns}/{name}/tags/{name}`` and ``/branches/{name}``.
- ``POST /repos/{ns}/{name}/grants`` ``{user}`` or ``{token}`` grants gated/private access;
  ``DELETE /repos/{ns}/{name}/grants/{user}`` revokes it -> ``RepoSummary``.
- ``GET /tokens`` -> ``{token: user}``; ``POST /tokens`` ``{token, user}`` adds a valid token.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from sandbox.hub import models
from sandbox.hub.repo import DEFAULT_BRANCH, GatedMode, Repo
from sandbox.hub.state import HubState
from sandbox.hub.wire import iso

REPO_ID = r"^[A-Za-z0-9][\w.-]*/[\w.-]+$"


class CreateRepo(models.ModelSpec):
    repo_id: str = Field(pattern=REPO_ID)
    private: bool = False
    gated: GatedMode = False
    replace: bool = False
    message: str = "Initial upload"


class FolderRepo(BaseModel):
    repo_id: str = Field(pattern=REPO_ID)
    folder: str
    private: bool = False
    gated: GatedMode = False
    replace: bool = False
    message: str = "Upload folder using huggingface_hub"


class RepoPatch(BaseModel):
    private: bool | None = None
    gated: GatedMode | None = None


class NewCommit(BaseModel):
    branch: str = DEFAULT_BRANCH
    message: str | None = None
    files: dict[str, str | None] = Field(default_factory=dict, description="path -> base64 content, null deletes")
    regenerate_weights: int | None = Field(None, description="seed of new weights for a generated repo")
    base: str | None = Field(None, description="where a new branch starts; default the head of main")
    hostile_mirror: bool = Field(False, description="store any path and lie about sizes, as a bad mirror can")
    listed_sizes: dict[str, int | None] = Field(default_factory=dict, description="hostile_mirror: sizes to announce")


def hub_path_error(path: str) -> str | None:
    """Why the Hub would refuse ``path`` in a commit, as huggingface_hub 2.4.0 checks it before sending
    (``_commit_api._validate_path_in_repo``: a '..' segment, or a '.git' / '.cache' folder), else None."""
    path = path.removeprefix("/").removeprefix("./")
    parts = path.split("/")
    if path in ("", ".") or ".." in parts:
        return f"Invalid `path_in_repo` in CommitOperation: '{path}'"
    if ".git" in parts or ".cache" in parts:
        return f"Invalid `path_in_repo` in CommitOperation: cannot update files under a '.git/' folder (path: '{path}')"
    return None


class NewRef(BaseModel):
    name: str = Field(min_length=1)
    revision: str = DEFAULT_BRANCH


class Grant(BaseModel):
    user: str | None = None
    token: str | None = None


class NewToken(BaseModel):
    token: str = Field(min_length=8)
    user: str = Field(min_length=1)


class _NotFound(Exception):
    pass


def summary(repo: Repo) -> dict:
    """The repo's settings and refs, and every commit newest first."""
    history = sorted(repo.commits.values(), key=lambda c: c.date, reverse=True)
    return {
        "repo_id": repo.repo_id,
        "private": repo.private,
        "gated": repo.gated,
        "granted": sorted(repo.granted),
        "branches": dict(repo.branches),
        "tags": dict(repo.tags),
        "commits": [{"sha": c.sha, "parent": c.parent, "message": c.message, "date": iso(c.date)} for c in history],
        "generator": repo.generator,
    }


def detail(repo: Repo, revision: str = DEFAULT_BRANCH) -> dict:
    """``summary`` plus the files at ``revision``."""
    commit = repo.resolve(revision)
    if commit is None:
        raise _NotFound(f"revision {revision!r} not found in {repo.repo_id}")
    files = [
        {"path": f.path, "size": f.size, "oid": f.git_oid, "lfs_sha256": f.lfs_sha256} for f in commit.files.values()
    ]
    return summary(repo) | {"revision": revision, "sha": commit.sha, "files": files}


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


Handler = Callable[[Request], Awaitable[Any]]


def _json_endpoint(handler: Handler) -> Callable[[Request], Awaitable[JSONResponse]]:
    """Turn a handler's result into JSON and its exceptions into the error statuses listed above."""

    async def endpoint(request: Request) -> JSONResponse:
        try:
            return JSONResponse(await handler(request))
        except ValidationError as exc:
            return JSONResponse({"error": exc.errors(include_url=False, include_context=False)}, status_code=400)
        except (_NotFound, KeyError) as exc:
            return _error(404, str(exc.args[0]) if exc.args else "not found")
        except FileExistsError as exc:
            return _error(409, str(exc))
        except (ValueError, FileNotFoundError) as exc:
            return _error(400, str(exc))

    return endpoint


def hub_admin_routes(state: HubState) -> list[BaseRoute]:
    """The admin routes described in this module's docstring."""

    def repo_of(request: Request) -> Repo:
        repo_id = f"{request.path_params['ns']}/{request.path_params['name']}"
        repo = state.repos.get(repo_id)
        if repo is None:
            raise _NotFound(f"repo {repo_id} not found")
        return repo

    def locked(fn: Callable[[], Any]) -> Awaitable[Any]:
        def run() -> Any:
            with state.lock:
                return fn()

        return asyncio.to_thread(run)

    async def list_repos(_: Request) -> list[dict]:
        return [summary(repo) for repo in list(state.repos.values())]

    async def publish(repo_id: str, replace: bool, build: Callable[[], Repo]) -> dict:
        if repo_id in state.repos and not replace:
            raise FileExistsError(f"repo {repo_id} already exists")  # refuse before spending time hashing
        repo = await asyncio.to_thread(build)
        return detail(await locked(lambda: state.add_repo(repo, replace=replace)))

    async def create_repo(request: Request) -> dict:
        body = CreateRepo.model_validate(await request.json())
        spec = body.model_dump(include=set(models.ModelSpec.model_fields))
        options = {"gated": body.gated, "private": body.private, "message": body.message}
        return await publish(
            body.repo_id, body.replace, lambda: models.generate_model_repo(body.repo_id, **options, **spec)
        )

    async def create_from_folder(request: Request) -> dict:
        body = FolderRepo.model_validate(await request.json())
        options = {"gated": body.gated, "private": body.private, "message": body.message}
        return await publish(
            body.repo_id, body.replace, lambda: models.repo_from_folder(body.repo_id, Path(body.folder), **options)
        )

    async def get_repo(request: Request) -> dict:
        return detail(repo_of(request), request.query_params.get("revision", DEFAULT_BRANCH))

    async def patch_repo(request: Request) -> dict:
        repo = repo_of(request)
        body = RepoPatch.model_validate(await request.json())
        if body.private is not None:
            repo.private = body.private
        if "gated" in body.model_fields_set and body.gated is not None:
            repo.gated = body.gated
        return summary(repo)

    async def delete_repo(request: Request) -> dict:
        repo = repo_of(request)
        state.delete_repo(repo.repo_id)
        return {"deleted": repo.repo_id}

    async def add_commit(request: Request) -> dict:
        repo = repo_of(request)
        body = NewCommit.model_validate(await request.json())
        if not body.hostile_mirror:
            if body.listed_sizes:
                raise ValueError("listed_sizes needs hostile_mirror: true")
            refused = [error for error in map(hub_path_error, body.files) if error]
            if refused:
                raise ValueError(refused[0])
        # The Hub client strips a leading '/' or './' before committing; a hostile mirror keeps names verbatim.
        keep = (lambda p: p) if body.hostile_mirror else (lambda p: p.removeprefix("/").removeprefix("./"))
        changes = {keep(path): None if data is None else base64.b64decode(data) for path, data in body.files.items()}

        def commit() -> str:
            sha = ""
            if body.regenerate_weights is not None:
                if body.branch not in repo.branches:
                    models.create_branch(repo, body.branch, body.base or DEFAULT_BRANCH)
                sha = models.regenerate_weights(repo, body.regenerate_weights, body.branch, body.message).sha
            if changes or not sha:
                message = body.message or "Update files"
                sha = models.add_commit(repo, changes, body.branch, message, base=body.base).sha
            return sha

        sha = await locked(commit)
        repo.listed_sizes |= body.listed_sizes
        return {"commit": sha} | detail(repo, sha)

    def ref_routes(kind: str) -> tuple[Handler, Handler]:
        point = models.tag if kind == "tags" else models.create_branch

        async def create(request: Request) -> dict:
            repo = repo_of(request)
            body = NewRef.model_validate(await request.json())
            return {"name": body.name, "sha": point(repo, body.name, body.revision)}

        async def delete(request: Request) -> dict:
            repo = repo_of(request)
            refs = repo.tags if kind == "tags" else repo.branches
            name = request.path_params["ref"]
            if refs.pop(name, None) is None:
                raise _NotFound(f"{kind[:-1]} {name!r} not found in {repo.repo_id}")
            return {"deleted": name}

        return create, delete

    async def grant(request: Request) -> dict:
        repo = repo_of(request)
        body = Grant.model_validate(await request.json())
        user = body.user or (state.user_for_token(body.token) if body.token else None)
        if user is None:
            raise ValueError("give a user, or a token known to the sandbox")
        repo.granted.add(user)
        return summary(repo)

    async def revoke(request: Request) -> dict:
        repo = repo_of(request)
        repo.granted.discard(request.path_params["user"])
        return summary(repo)

    async def list_tokens(_: Request) -> dict:
        return dict(state.tokens)

    async def add_token(request: Request) -> dict:
        body = NewToken.model_validate(await request.json())
        state.tokens[body.token] = body.user
        return dict(state.tokens)

    create_tag, delete_tag = ref_routes("tags")
    create_branch, delete_branch = ref_routes("branches")
    one = "/repos/{ns}/{name}"
    table: list[tuple[str, Handler, str]] = [
        ("/repos", list_repos, "GET"),
        ("/repos", create_repo, "POST"),
        ("/repos/from-folder", create_from_folder, "POST"),
        (one, get_repo, "GET"),
        (one, patch_repo, "PATCH"),
        (one, delete_repo, "DELETE"),
        (f"{one}/commits", add_commit, "POST"),
        (f"{one}/tags", create_tag, "POST"),
        (one + "/tags/{ref:path}", delete_tag, "DELETE"),
        (f"{one}/branches", create_branch, "POST"),
        (one + "/branches/{ref:path}", delete_branch, "DELETE"),
        (f"{one}/grants", grant, "POST"),
        (one + "/grants/{user}", revoke, "DELETE"),
        ("/tokens", list_tokens, "GET"),
        ("/tokens", add_token, "POST"),
    ]
    return [Route(path, _json_endpoint(handler), methods=[method]) for path, handler, method in table]
