"""Bad input from the Hub itself (issue 14, section 1): a listing is untrusted, whoever serves it.

A mirror given as ``hub_endpoint`` (or a Hub bug) can list names that are not plain relative paths, sizes that
are negative, absurd or missing, and repos whose selection has nothing vLLM could load. Each case promotes
through the real huggingface_hub client over HTTP against the Hub stand-in in its ``hostile_mirror`` mode, and
checks that the run stops before any download and any cloud write, with a message that names the file and says
what to do, and that no object exists under the model's prefix.
"""

from __future__ import annotations

import base64
import itertools
import json
import tempfile
from pathlib import Path

import pytest
from google.cloud import storage as gcs
from huggingface_hub import hf_hub_download

from tasks.common import clients
from tests.support.bad_input import fails_cleanly, new_repo, promote

pytestmark = pytest.mark.prefect
GGUF = base64.b64encode(b"GGUF" + bytes(60)).decode()
_ids = itertools.count()
CACHE = tempfile.mkdtemp(prefix="hub-bad-input-")


def hostile_commit(sb, repo_id: str, files: dict[str, bytes | None], sizes: dict | None = None) -> str:
    """Commit ``files`` verbatim (any name) as a hostile mirror would list them; returns the new commit sha."""
    body = {
        "hostile_mirror": True,
        "files": {path: None if data is None else base64.b64encode(data).decode() for path, data in files.items()},
        "listed_sizes": sizes or {},
    }
    return sb.hub("POST", f"/repos/{repo_id}/commits", json=body)["commit"]


def raw_file(sb, repo_id: str, path: str) -> bytes:
    """A file as the Hub serves it, read with the real huggingface_hub client."""
    return Path(hf_hub_download(repo_id, path, endpoint=sb.hub_url, token=False, cache_dir=CACHE)).read_bytes()


def repo_files(sb, repo_id: str) -> list[dict]:
    return sb.hub("GET", f"/repos/{repo_id}")["files"]


def objects_under_model_prefix(target, repo_id: str) -> list[str]:
    """Every object of the repo in the target's bucket, read with the real GCS client."""
    storage: gcs.Client = clients.storage(target)
    if storage.lookup_bucket(target.bucket_name) is None:
        return []
    return [blob.name for blob in storage.list_blobs(target.bucket_name, prefix=f"{target.model_prefix}/{repo_id}")]


def hub_downloads(sb, since: int) -> list[str]:
    """File downloads (resolve and CDN) the Hub stand-ins served since ``since``."""
    return [
        f"{r['server']} {r['path']}"
        for r in sb.requests(since=since)
        if r["server"] == "cdn" or (r["server"] == "hub" and "/resolve/" in r["path"])
    ]


def refused(sb, target, repo_id: str, field: str, fix: str, **params) -> str:
    """promote-model on ``repo_id`` fails naming ``field`` with ``fix``: no download, no cloud write, no object."""
    since = sb.last_request_seq()
    message = fails_cleanly(sb, lambda: promote(model=repo_id, **params), field, fix)
    assert repo_id in message, message
    assert hub_downloads(sb, since) == [], f"files were downloaded before the refusal: {hub_downloads(sb, since)}"
    assert objects_under_model_prefix(target, repo_id) == []
    return message


# Names --------------------------------------------------------------------------------------------------------
BAD_NAMES = [
    pytest.param("../../escape.safetensors", id="dotdot"),
    pytest.param("weights/../../../other-model/model.safetensors", id="dotdot-inside"),
    pytest.param("/abs/model.safetensors", id="absolute"),
    pytest.param("shards//model.safetensors", id="empty-segment"),
    pytest.param("./config.json", id="dot-segment"),
    pytest.param("win\\model.safetensors", id="backslash"),
    pytest.param("evil\nname.safetensors", id="newline"),
    pytest.param("nul\x00.json", id="nul"),
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_listed_name_that_is_not_a_plain_relative_path_is_refused(sb, flow_env, name):
    repo_id = new_repo(sb, "hostile-name")
    commit = hostile_commit(sb, repo_id, {name: b"{}"})
    assert name in [f["path"] for f in repo_files(sb, repo_id)]  # the mirror really lists it verbatim
    message = refused(
        sb, flow_env, repo_id, repr(name), "ignore_patterns", allow_patterns=["*"], hub_endpoint=sb.hub_url
    )
    assert commit in message and "hub_endpoint" in message


def test_a_bad_name_the_user_excludes_does_not_block_the_repo(sb, flow_env):
    """The refusal's first fix works: ignore_patterns steps around the file, and the rest stages cleanly."""
    repo_id = new_repo(sb, "hostile-ignored")
    hostile_commit(sb, repo_id, {"../escape.json": b"{}"})
    promote(model=repo_id, allow_patterns=["*"], ignore_patterns=["../*"])
    names = objects_under_model_prefix(flow_env, repo_id)
    assert names and all(".." not in n.split("/") for n in names)


def test_the_stand_in_refuses_such_names_unless_it_plays_a_hostile_mirror(sb):
    """Fidelity: the Hub's own client refuses '..' on commit, so the stand-in does too by default."""
    repo_id = new_repo(sb, "honest-hub")
    body = {"files": {"../escape.json": base64.b64encode(b"{}").decode()}}
    response = sb.admin.post(f"/hub/repos/{repo_id}/commits", json=body)
    assert response.status_code == 400 and "Invalid `path_in_repo`" in response.text


# Selections that cannot serve ---------------------------------------------------------------------------------
def test_a_gguf_only_repo_with_config_and_tokenizer_fails_before_any_upload(sb, flow_env):
    repo_id = new_repo(sb, "gguf-only")
    gone = {f["path"]: None for f in repo_files(sb, repo_id) if f["path"].endswith((".safetensors", ".index.json"))}
    sb.hub("POST", f"/repos/{repo_id}/commits", json={"files": gone | {"model-Q4_K_M.gguf": GGUF}})
    paths = [f["path"] for f in repo_files(sb, repo_id)]
    assert "config.json" in paths and "tokenizer.json" in paths and not any(p.endswith(".safetensors") for p in paths)
    message = refused(sb, flow_env, repo_id, "model-Q4_K_M.gguf", "choose a repo with safetensors weights")
    assert "no *.safetensors or *.bin weights" in message


def test_a_shard_of_a_numbered_set_absent_from_the_listing_fails(sb, flow_env):
    repo_id = f"badinput/two-shards-{next(_ids)}"
    spec = {"weight_bytes": 300_000, "shards": 2, "include_bin_duplicate": False, "include_original": False}
    sb.hub("POST", "/repos", json={"repo_id": repo_id, "replace": True, **spec})
    shards = sorted(f["path"] for f in repo_files(sb, repo_id) if f["path"].endswith(".safetensors"))
    assert len(shards) == 2
    sb.hub("POST", f"/repos/{repo_id}/commits", json={"files": {shards[1]: None}})
    refused(sb, flow_env, repo_id, shards[1], "Select every shard")


def test_an_index_naming_a_shard_absent_from_the_listing_fails(sb, flow_env):
    repo_id = f"badinput/stale-index-{next(_ids)}"
    spec = {"weight_bytes": 300_000, "shards": 2, "include_bin_duplicate": False, "include_original": False}
    sb.hub("POST", "/repos", json={"repo_id": repo_id, "replace": True, **spec})
    index = json.loads(raw_file(sb, repo_id, "model.safetensors.index.json"))
    tensor = next(iter(index["weight_map"]))
    index["weight_map"][tensor] = "model-extra.safetensors"  # a shard the repo never had
    edit = {"model.safetensors.index.json": base64.b64encode(json.dumps(index).encode()).decode()}
    sb.hub("POST", f"/repos/{repo_id}/commits", json={"files": edit})
    since = sb.last_request_seq()
    message = fails_cleanly(sb, lambda: promote(model=repo_id), "'model-extra.safetensors'", "Select every shard")
    assert "absent from the repo's listing" in message
    assert not [r for r in sb.requests(since=since) if r["server"] == "cdn"]  # no weights were downloaded
    assert objects_under_model_prefix(flow_env, repo_id) == []


def test_a_config_that_is_not_json_is_named(sb, flow_env):
    repo_id = new_repo(sb, "broken-config")
    edit = {"config.json": base64.b64encode(b"{'model_type': llama,}").decode()}
    sb.hub("POST", f"/repos/{repo_id}/commits", json={"files": edit})
    message = fails_cleanly(sb, lambda: promote(model=repo_id), "config.json of " + repo_id, "pin revision")
    assert "is not valid JSON" in message
    assert objects_under_model_prefix(flow_env, repo_id) == []


# Numbers ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("size", "field", "fix"),
    [
        pytest.param(-5, "implausible size -5", "MAX_FILE_BYTES", id="negative"),
        pytest.param(3 * 1000**4, "implausible size 3000000000000", "50 GB", id="three-terabytes"),
        pytest.param(None, "without its size", "hub_endpoint", id="missing-lfs-size"),
    ],
)
def test_an_implausible_size_in_the_listing_is_refused(sb, flow_env, size, field, fix):
    repo_id = new_repo(sb, "hostile-size")
    shard = next(f["path"] for f in repo_files(sb, repo_id) if f["path"].endswith(".safetensors"))
    hostile_commit(sb, repo_id, {}, sizes={shard: size})
    message = refused(sb, flow_env, repo_id, field, fix, hub_endpoint=sb.hub_url)
    assert repr(shard) in message
