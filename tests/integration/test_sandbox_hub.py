"""The Hub stand-in as huggingface_hub 2.4.0 sees it: downloads, revisions, gating, errors, faults, admin API.

Every call goes through the real client with ``endpoint=sb.hub_url`` (HF_ENDPOINT points at a closed port).
Public calls pass ``token=False`` so a token saved on the machine can never leak into a test.
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile, RepoFolder

from sandbox.config import SANDBOX_HF_TOKEN_NO_ACCESS
from sandbox.handle import SandboxHandle
from sandbox.safetensors_format import ParsedHeader, TensorSpec, build_header, header_length, parse_header

TINY = "sandbox/tiny-chat"
GATED = "sandbox/gated-chat"
PRIVATE = "sandbox/private-chat"
MIB = 1024 * 1024


def hub_api(sb: SandboxHandle, token: str | bool = False) -> HfApi:
    return HfApi(endpoint=sb.hub_url, token=token)


def remote_files(
    sb: SandboxHandle, repo_id: str, revision: str | None = None, token: str | bool = False
) -> dict[str, RepoFile]:
    listing = hub_api(sb, token).list_repo_tree(repo_id, recursive=True, revision=revision)
    return {entry.path: entry for entry in listing if isinstance(entry, RepoFile)}


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(MIB), b""):
            digest.update(chunk)
    return digest.hexdigest()


def git_oid_of(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def local_files(folder: Path) -> dict[str, Path]:
    return {
        p.relative_to(folder).as_posix(): p
        for p in folder.rglob("*")
        if p.is_file() and p.relative_to(folder).parts[0] != ".cache"
    }


def assert_same_as_listed(folder: Path, remote: dict[str, RepoFile]) -> None:
    """Each downloaded file hashes to what the tree listing promises (LFS sha256, or git blob id)."""
    for path, entry in remote.items():
        local = folder / path
        assert local.stat().st_size == entry.size, path
        if entry.lfs is not None:
            assert sha256_of(local) == entry.lfs.sha256, path
        else:
            assert git_oid_of(local) == entry.blob_id, path


def read_header(path: Path) -> ParsedHeader:
    with path.open("rb") as handle:
        prefix = handle.read(8)
        return parse_header(prefix + handle.read(header_length(prefix)))


@pytest.fixture
def new_repo_id(sb: SandboxHandle) -> Iterator[str]:
    """A fresh repo id, deleted after the test if the test created it."""
    repo_id = f"tests/repo-{uuid.uuid4().hex[:8]}"
    yield repo_id
    if repo_id in {repo["repo_id"] for repo in sb.hub("GET", "/repos")}:
        sb.hub("DELETE", f"/repos/{repo_id}")


def test_snapshot_download_matches_tree_listing_byte_for_byte(sb: SandboxHandle, tmp_path: Path) -> None:
    folder = Path(snapshot_download(TINY, local_dir=tmp_path / "m", endpoint=sb.hub_url, token=False))
    remote = remote_files(sb, TINY)

    assert set(local_files(folder)) == set(remote)
    assert_same_as_listed(folder, remote)
    assert {"pytorch_model.bin", "original/consolidated.00.pth"} <= set(remote)  # clutter the product skips

    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert shards == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    tensors: dict[str, dict] = {}
    for shard in shards:
        header = read_header(folder / shard)
        assert header.file_bytes == (folder / shard).stat().st_size
        tensors |= header.tensors
    assert set(tensors) == set(index["weight_map"])
    assert sum(t["data_offsets"][1] - t["data_offsets"][0] for t in tensors.values()) == index["metadata"]["total_size"]

    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["torch_dtype"] == "bfloat16"
    assert tensors["model.embed_tokens.weight"]["shape"] == [config["vocab_size"], config["hidden_size"]]
    assert sum(1 for name in tensors if name.endswith("q_proj.weight")) == config["num_hidden_layers"]
    assert "chat_template" in json.loads((folder / "tokenizer_config.json").read_text())


def test_hf_hub_download_of_one_file(sb: SandboxHandle, tmp_path: Path) -> None:
    path = Path(hf_hub_download(TINY, "config.json", cache_dir=tmp_path, endpoint=sb.hub_url, token=False))

    assert git_oid_of(path) == remote_files(sb, TINY)["config.json"].blob_id
    assert json.loads(path.read_text())["model_type"] == "llama"


def test_revisions_by_tag_branch_and_sha(sb: SandboxHandle, tmp_path: Path) -> None:
    api = hub_api(sb)
    refs = api.list_repo_refs(TINY)
    shas = {rev: api.model_info(TINY, revision=rev).sha for rev in ("main", "v1.0", "dev")}

    assert len(set(shas.values())) == 3
    assert {t.name: t.target_commit for t in refs.tags} == {"v1.0": shas["v1.0"]}
    assert {b.name: b.target_commit for b in refs.branches} == {"main": shas["main"], "dev": shas["dev"]}
    assert api.model_info(TINY, revision="refs/heads/dev").sha == shas["dev"]  # revision sent as refs%2Fheads%2Fdev

    def readme(revision: str) -> str:
        path = hf_hub_download(
            TINY, "README.md", revision=revision, cache_dir=tmp_path, endpoint=sb.hub_url, token=False
        )
        return Path(path).read_text()

    assert "Changelog" in readme("main") and "Changelog" not in readme("v1.0")
    assert readme(shas["v1.0"]) == readme("v1.0")

    shard = "model-00001-of-00002.safetensors"
    by_sha = snapshot_download(
        TINY, revision=shas["dev"], allow_patterns=[shard], local_dir=tmp_path / "dev", endpoint=sb.hub_url, token=False
    )
    dev_sha256 = sha256_of(Path(by_sha) / shard)
    assert dev_sha256 == remote_files(sb, TINY, revision="dev")[shard].lfs.sha256
    assert dev_sha256 != remote_files(sb, TINY, revision="main")[shard].lfs.sha256  # dev has other weights


def test_allow_patterns_download_only_matching_files(sb: SandboxHandle, tmp_path: Path) -> None:
    since = sb.last_request_seq()
    folder = snapshot_download(
        TINY, allow_patterns=["*.json"], local_dir=tmp_path / "m", endpoint=sb.hub_url, token=False
    )

    expected = {path for path in remote_files(sb, TINY) if path.endswith(".json")}
    assert set(local_files(Path(folder))) == expected
    assert sb.requests("cdn", since=since) == []  # no weights were fetched


@pytest.mark.parametrize("server", ["hub", "cdn"])
def test_rate_limited_file_get_is_retried(sb: SandboxHandle, tmp_path: Path, server: str) -> None:
    remote = remote_files(sb, TINY)
    filename = "tokenizer_config.json" if server == "hub" else "model-00002-of-00002.safetensors"
    # The Hub serves small files itself; LFS downloads go to the CDN, addressed by sha256.
    pattern = r"/resolve/.*/tokenizer_config\.json$" if server == "hub" else remote[filename].lfs.sha256
    rule = sb.add_fault(server, path=pattern, method="GET", status=429, retry_after="0", times=1)
    since = sb.last_request_seq()

    path = Path(hf_hub_download(TINY, filename, cache_dir=tmp_path, endpoint=sb.hub_url, token=False))

    assert_same_as_listed(path.parent, {filename: remote[filename]})
    assert next(r for r in sb.faults() if r["id"] == rule["id"])["fired"] == 1
    gets = [r for r in sb.requests(server, since=since) if r["method"] == "GET"]
    assert [r["status"] for r in gets] == [429, 200]


def test_gated_repo_needs_an_accepted_licence(sb: SandboxHandle, tmp_path: Path) -> None:
    assert hub_api(sb).model_info(GATED).gated == "manual"  # metadata stays public, as on the Hub

    with pytest.raises(GatedRepoError) as anonymous:
        hf_hub_download(GATED, "config.json", cache_dir=tmp_path, endpoint=sb.hub_url, token=False)
    assert anonymous.value.response.status_code == 401

    with pytest.raises(GatedRepoError) as refused:
        snapshot_download(GATED, cache_dir=tmp_path, endpoint=sb.hub_url, token=SANDBOX_HF_TOKEN_NO_ACCESS)
    assert refused.value.response.status_code == 403
    assert "accept the licence" in str(refused.value)

    folder = snapshot_download(GATED, local_dir=tmp_path / "ok", endpoint=sb.hub_url, token=sb.hub_token)
    assert_same_as_listed(Path(folder), remote_files(sb, GATED, token=sb.hub_token))


def test_missing_repo_revision_and_file_raise_typed_errors(sb: SandboxHandle, tmp_path: Path) -> None:
    common = {"cache_dir": tmp_path, "endpoint": sb.hub_url, "token": False}
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("sandbox/no-such-model", "config.json", **common)
    with pytest.raises(RepositoryNotFoundError):
        snapshot_download("sandbox/no-such-model", **common)
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(TINY, "config.json", revision="no-such-branch", **common)
    with pytest.raises(RevisionNotFoundError):
        snapshot_download(TINY, revision="no-such-branch", **common)
    with pytest.raises(RemoteEntryNotFoundError):
        hf_hub_download(TINY, "no-such-file.json", **common)


def test_private_repo_and_bad_tokens(sb: SandboxHandle, tmp_path: Path) -> None:
    with pytest.raises(RepositoryNotFoundError):
        hub_api(sb).model_info(PRIVATE)  # a private repo looks missing to strangers
    with pytest.raises(RepositoryNotFoundError):
        hub_api(sb, SANDBOX_HF_TOKEN_NO_ACCESS).model_info(PRIVATE)
    assert hub_api(sb, sb.hub_token).model_info(PRIVATE).private is True

    with pytest.raises(HfHubHTTPError) as bad:
        hf_hub_download(TINY, "config.json", cache_dir=tmp_path, endpoint=sb.hub_url, token="hf_notAValidToken")
    assert bad.value.response.status_code == 401  # even a public repo refuses an unknown token
    assert not isinstance(bad.value, RepositoryNotFoundError)


def test_dropped_cdn_connection_is_resumed_with_a_range_request(sb: SandboxHandle, tmp_path: Path) -> None:
    # Bigger than huggingface_hub's 10 MiB read size, so the resume does not start from zero.
    repo_id = f"tests/resume-{uuid.uuid4().hex[:8]}"
    spec = {"weight_bytes": 24 * MIB, "shards": 1, "include_bin_duplicate": False, "include_original": False}
    sb.hub("POST", "/repos", json={"repo_id": repo_id, **spec})
    try:
        entry = remote_files(sb, repo_id)["model.safetensors"]
        rule = sb.add_fault("cdn", path=entry.lfs.sha256, method="GET", action="drop", after_bytes=15 * MIB, times=1)
        since = sb.last_request_seq()

        path = hf_hub_download(repo_id, "model.safetensors", cache_dir=tmp_path, endpoint=sb.hub_url, token=False)

        assert sha256_of(Path(path)) == entry.lfs.sha256
        assert next(r for r in sb.faults() if r["id"] == rule["id"])["fired"] == 1
        gets = [r for r in sb.requests("cdn", since=since) if r["method"] == "GET"]
        assert len(gets) == 2
        assert gets[1]["headers"].get("range") == f"bytes={10 * MIB}-" and gets[1]["status"] == 206
    finally:
        sb.hub("DELETE", f"/repos/{repo_id}")


def test_file_metadata_points_lfs_files_at_the_cdn(sb: SandboxHandle) -> None:
    shard = "model-00001-of-00002.safetensors"
    entry = remote_files(sb, TINY)[shard]
    meta = get_hf_file_metadata(hf_hub_url(TINY, shard, endpoint=sb.hub_url), token=False)

    assert meta.etag == entry.lfs.sha256 and meta.size == entry.size
    assert meta.commit_hash == hub_api(sb).model_info(TINY).sha
    assert meta.location.startswith(sb.info["cdn_url"] + "/")

    # Streaming without the client library: the signed URL needs no Authorization header.
    body = httpx.get(meta.location).content
    assert hashlib.sha256(body).hexdigest() == entry.lfs.sha256
    partial = httpx.get(meta.location, headers={"Range": "bytes=100-199"})
    assert partial.status_code == 206 and partial.content == body[100:200]
    assert httpx.get(meta.location.replace("Signature=", "Signature=0")).status_code == 403

    small = get_hf_file_metadata(hf_hub_url(TINY, "config.json", endpoint=sb.hub_url), token=False)
    assert small.etag == remote_files(sb, TINY)["config.json"].blob_id
    assert small.location.startswith(sb.hub_url)


def test_tree_listing_recursive_and_per_folder(sb: SandboxHandle) -> None:
    api = hub_api(sb)
    top = {entry.path: entry for entry in api.list_repo_tree(TINY)}
    assert isinstance(top["original"], RepoFolder) and "original/params.json" not in top

    inside = {entry.path for entry in api.list_repo_tree(TINY, path_in_repo="original")}
    assert inside == {"original/consolidated.00.pth", "original/params.json"}
    with pytest.raises(RemoteEntryNotFoundError):
        list(api.list_repo_tree(TINY, path_in_repo="no-such-folder"))


def test_long_tree_listings_are_paginated(sb: SandboxHandle, tmp_path: Path, new_repo_id: str) -> None:
    for i in range(60):  # expanded listings come 50 entries a page
        (tmp_path / f"file-{i:02d}.txt").write_text(str(i))
    sb.hub("POST", "/repos/from-folder", json={"repo_id": new_repo_id, "folder": str(tmp_path)})

    entries = list(hub_api(sb).list_repo_tree(new_repo_id, expand=True))

    assert sorted(e.path for e in entries) == [f"file-{i:02d}.txt" for i in range(60)]
    assert all(e.last_commit is not None and e.last_commit.title.startswith("Upload folder") for e in entries)


def test_admin_generated_repo_with_custom_size_and_new_weights(
    sb: SandboxHandle, tmp_path: Path, new_repo_id: str
) -> None:
    spec = {"weight_bytes": 300_000, "shards": 3, "dtype": "F16", "include_original": False}
    created = sb.hub("POST", "/repos", json={"repo_id": new_repo_id, **spec})
    assert sum(f["path"].endswith(".safetensors") for f in created["files"]) == 3

    folder = Path(snapshot_download(new_repo_id, local_dir=tmp_path / "v1", endpoint=sb.hub_url, token=False))
    assert_same_as_listed(folder, remote_files(sb, new_repo_id))
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    headers = [read_header(folder / name) for name in sorted(set(index["weight_map"].values()))]
    assert len(headers) == 3 and sum(h.data_bytes for h in headers) == index["metadata"]["total_size"]
    assert 250_000 < index["metadata"]["total_size"] < 350_000
    assert {t["dtype"] for h in headers for t in h.tensors.values()} == {"F16"}

    first = created["sha"]
    update = sb.hub("POST", f"/repos/{new_repo_id}/commits", json={"regenerate_weights": 5})
    old, new = remote_files(sb, new_repo_id, revision=first), remote_files(sb, new_repo_id)
    assert update["commit"] != first and update["branches"]["main"] == update["commit"]
    assert old["config.json"].blob_id == new["config.json"].blob_id
    assert old["model-00001-of-00003.safetensors"].lfs.sha256 != new["model-00001-of-00003.safetensors"].lfs.sha256

    shard = "model-00001-of-00003.safetensors"
    pinned = hf_hub_download(new_repo_id, shard, revision=first, cache_dir=tmp_path, endpoint=sb.hub_url, token=False)
    assert sha256_of(Path(pinned)) == old[shard].lfs.sha256


def test_admin_repo_from_folder_commits_refs_and_delete(sb: SandboxHandle, tmp_path: Path, new_repo_id: str) -> None:
    source = tmp_path / "source"
    (source / "sub").mkdir(parents=True)
    (source / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (source / "sub" / "notes.txt").write_text("first")
    tensor = TensorSpec("w", "F32", (4, 4))
    (source / "model.safetensors").write_bytes(build_header([tensor]) + bytes(range(64)))

    sb.hub("POST", "/repos/from-folder", json={"repo_id": new_repo_id, "folder": str(source)})
    folder = Path(snapshot_download(new_repo_id, local_dir=tmp_path / "copy", endpoint=sb.hub_url, token=False))
    assert {p: f.read_bytes() for p, f in local_files(folder).items()} == {
        p: f.read_bytes() for p, f in local_files(source).items()
    }

    changes = {"sub/notes.txt": base64.b64encode(b"second").decode(), "config.json": None}
    sb.hub("POST", f"/repos/{new_repo_id}/commits", json={"branch": "feature/x", "files": changes})
    sb.hub("POST", f"/repos/{new_repo_id}/tags", json={"name": "v2", "revision": "feature/x"})

    common = {"cache_dir": tmp_path / "cache", "endpoint": sb.hub_url, "token": False}
    assert Path(hf_hub_download(new_repo_id, "sub/notes.txt", revision="v2", **common)).read_text() == "second"
    assert Path(hf_hub_download(new_repo_id, "sub/notes.txt", revision="main", **common)).read_text() == "first"
    with pytest.raises(RemoteEntryNotFoundError):
        hf_hub_download(new_repo_id, "config.json", revision="feature/x", **common)

    sb.hub("DELETE", f"/repos/{new_repo_id}")
    with pytest.raises(RepositoryNotFoundError):
        hub_api(sb).model_info(new_repo_id)


def test_admin_grants_open_and_close_a_gated_repo(sb: SandboxHandle, tmp_path: Path, new_repo_id: str) -> None:
    sb.hub("POST", "/repos", json={"repo_id": new_repo_id, "weight_bytes": 100_000, "shards": 1, "gated": "auto"})
    common = {"endpoint": sb.hub_url, "token": SANDBOX_HF_TOKEN_NO_ACCESS}

    def download(into: str) -> str:
        return hf_hub_download(new_repo_id, "config.json", cache_dir=tmp_path / into, **common)

    with pytest.raises(GatedRepoError):
        download("before")
    sb.hub("POST", f"/repos/{new_repo_id}/grants", json={"token": SANDBOX_HF_TOKEN_NO_ACCESS})
    assert json.loads(Path(download("granted")).read_text())["model_type"] == "llama"
    user = next(u for u in sb.hub("GET", "/tokens").values() if u != "sandbox-user")
    sb.hub("DELETE", f"/repos/{new_repo_id}/grants/{user}")
    with pytest.raises(GatedRepoError):
        download("revoked")
