"""``python -m sandbox hub publish ORG/NAME [--from-dir DIR] [--replace]``: a model of one's own on the running
sandbox's Hub, through its admin API (sandbox/hub/admin.py): a generated tiny model, or a local folder as is."""

from __future__ import annotations

import json
from pathlib import Path

import httpx


def publish(state_dir: Path, repo_id: str, from_dir: Path | None = None, replace: bool = False) -> str:
    """Publish ``repo_id`` on the sandbox of ``state_dir``; returns a line saying what the Hub now serves."""
    info = json.loads((state_dir / "sandbox.json").read_text())
    body: dict = {"repo_id": repo_id, "replace": replace}
    path = "/repos"
    if from_dir is not None:
        path = "/repos/from-folder"
        body["folder"] = str(from_dir.resolve())  # the sandbox reads it: its own working folder may differ
    # Hashing a folder's weights takes a while for a large model.
    response = httpx.post(f"{info['control_url']}/_sandbox/hub{path}", json=body, timeout=600)
    if response.is_error:
        raise ValueError(f"the sandbox Hub refused {repo_id}: {_reason(response)}")
    repo = response.json()
    megabytes = sum(f["size"] for f in repo["files"]) / 1e6
    return (
        f"published {repo_id} on the sandbox Hub ({info['hub_url']}): commit {repo['sha'][:12]}, "
        f"{len(repo['files'])} files, {megabytes:.1f} MB; promote it with -p model={repo_id}"
    )


def _reason(response: httpx.Response) -> str:
    """The admin API's error: a message, or pydantic's list of field errors."""
    try:
        error = response.json()["error"]
    except (ValueError, KeyError):
        return f"HTTP {response.status_code}"
    if isinstance(error, list):
        return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error)
    hint = " (--replace publishes it again)" if response.status_code == 409 else ""
    return f"{error}{hint}"
