"""Who is calling the Hub stand-in and what they may see, answered with the real Hub's error responses.

huggingface_hub maps errors to typed exceptions by the ``X-Error-Code`` header (on http:// endpoints it has no
other clue), so every refusal carries ``X-Error-Code`` and ``X-Error-Message`` plus a JSON ``{"error": ...}``.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandbox.hub.repo import Repo
from sandbox.hub.state import HubState

INVALID_CREDENTIALS = "Invalid credentials in Authorization header"


def hub_error(status: int, message: str, code: str | None = None, headers: dict[str, str] | None = None) -> Response:
    """An error as the Hub sends it."""
    extra = {"X-Error-Message": message, **(headers or {})}
    if code:
        extra["X-Error-Code"] = code
    return JSONResponse({"error": message}, status_code=status, headers=extra)


class HubRefusal(Exception):
    """Raised by the checks below; the Hub app turns it into ``response``."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status_code)
        self.response = response


@dataclass(frozen=True)
class Caller:
    """The user behind the request's token; ``user`` is None for anonymous calls."""

    user: str | None


def caller(state: HubState, request: Request) -> Caller:
    """Read ``Authorization: Bearer <token>``; an unknown token is refused even on public repos, as the Hub does."""
    header = request.headers.get("authorization")
    if not header:
        return Caller(None)
    scheme, _, token = header.partition(" ")
    user = state.user_for_token(token.strip()) if scheme.lower() == "bearer" else None
    if user is None:
        raise HubRefusal(hub_error(401, INVALID_CREDENTIALS))
    return Caller(user)


def readable_repo(state: HubState, repo_id: str, who: Caller, *, content: bool, base_url: str = "") -> Repo:
    """The repo if ``who`` may see it, and (``content``) download its files.

    A private repo the caller cannot read looks exactly like a missing one: 401 without a token, 404 with one.
    Gated repos show their metadata and file list to anyone; downloads need a granted user (401 anonymous,
    403 for a user who has not accepted the licence).
    """
    repo = state.repos.get(repo_id)
    if repo is None or (repo.private and not repo.can_read(who.user)):
        raise HubRefusal(hub_error(404 if who.user else 401, "Repository not found", "RepoNotFound"))
    if content and repo.gated and not repo.can_read(who.user):
        if who.user is None:
            message = (
                f"Access to model {repo_id} is restricted. You must have access to it and be authenticated to"
                " access it. Please log in."
            )
            raise HubRefusal(hub_error(401, message, "GatedRepo"))
        message = (
            f"Access to model {repo_id} is restricted and you are not in the authorized list. Visit"
            f" {base_url}/{repo_id} to accept the licence and ask for access."
        )
        raise HubRefusal(hub_error(403, message, "GatedRepo"))
    return repo
