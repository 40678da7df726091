"""Names and numbers from a Hub listing are untrusted (issue 14): pure checks, no servers.

A mirror given as ``hub_endpoint`` (or a Hub bug) can list any name and any size. Names become GCS object names
and manifest entries, sizes drive memory, probes and costs: each is checked before anything is downloaded.
"""

from __future__ import annotations

import pytest

from tasks.weights.hub_errors import HubListingError
from tasks.weights.hub_listing import MAX_MODEL_BYTES, HubFile, check_path, unsafe_path_reason
from tasks.weights.selection import SelectionError, check_index, select_files
from tasks.weights.staging import Manifest, StagingError, object_name

COMMIT = "a" * 40
GOOD = ("config.json", "model.safetensors", "original/params.json", "a b/ü.json", "x..y.json", ".gitattributes")
BAD = {
    "/etc/passwd": "is absolute",
    "../../escape.safetensors": "has a '..' segment",
    "a/../b.json": "has a '..' segment",
    "a//b.json": "has an empty segment",
    "weights/": "has an empty segment",
    "./config.json": "has a '.' segment",
    "a\\b.safetensors": "holds a backslash",
    "evil\n.safetensors": "holds a control character",
    "nul\x00.safetensors": "holds a control character",
    "del\x7f.json": "holds a control character",
    "c1\x85.json": "holds a control character",
    "lone\ud800.json": "is not valid UTF-8",
    "": "is empty",
    "x" * 600: "is longer than 512 bytes",
}


def files(*paths: str, size: int = 10) -> list[HubFile]:
    return [HubFile(p, size, "1" * 40, "2" * 64 if p.endswith((".safetensors", ".bin")) else None) for p in paths]


@pytest.mark.parametrize("path", GOOD)
def test_plain_relative_paths_pass(path):
    assert unsafe_path_reason(path) is None
    assert object_name("models/org/m/" + COMMIT, path) == f"models/org/m/{COMMIT}/{path}"


@pytest.mark.parametrize(("path", "reason"), BAD.items(), ids=[repr(p)[:20] for p in BAD])
def test_names_that_are_not_plain_relative_paths_are_refused_with_repr(path, reason):
    assert unsafe_path_reason(path).startswith(reason)
    with pytest.raises(HubListingError) as caught:
        check_path(path, "org/m", COMMIT)
    message = str(caught.value)
    # repr, so a newline or NUL shows as \n or \x00 instead of breaking or truncating the message
    assert repr(path) in message and "org/m@" + COMMIT in message and reason in message
    assert "ignore_patterns" in message and "hub_endpoint" in message


@pytest.mark.parametrize("path", [p for p in BAD if p])
def test_allow_patterns_never_select_a_bad_name(path):
    listing = files("config.json", "model.safetensors", path)
    with pytest.raises(HubListingError, match="a plain relative path"):
        select_files(listing, allow_patterns=["*"], repo_id="org/m", commit=COMMIT)
    # ... and the user can step around a file they do not need
    kept = select_files(listing, allow_patterns=["*"], ignore_patterns=[path], repo_id="org/m", commit=COMMIT)
    assert [f.path for f in kept] == ["config.json", "model.safetensors"]


def test_the_default_selection_refuses_a_bad_name_it_would_take():
    with pytest.raises(HubListingError, match=r"'\\n\.safetensors'"):
        select_files(files("config.json", "model.safetensors", "\n.safetensors"), repo_id="org/m", commit=COMMIT)


@pytest.mark.parametrize("path", ["../x", "a//b", "/abs", "a\\b", "c\x00"])
def test_object_names_and_manifest_entries_are_guarded_where_they_are_built(path):
    with pytest.raises(StagingError, match="nothing was written"):
        object_name("models/org/m/" + COMMIT, path)
    entry = {"path": path, "size": 1, "sha256": "s", "git_blob_id": "g"}
    with pytest.raises(ValueError, match="manifest path"):
        Manifest(repo_id="org/m", commit=COMMIT, revision="main", files=[entry], total_bytes=1, staged_at="now")


# Selections that cannot serve ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("listing", "allow", "expected"),
    [
        pytest.param(("config.json", "tokenizer.json", "model-q4_k_m.gguf"), None, "model-q4_k_m.gguf", id="gguf-only"),
        pytest.param(("config.json", "tokenizer.json", "consolidated.00.pth"), None, "consolidated.00.pth", id="pth"),
        pytest.param(
            ("config.json", "original/model.safetensors"),
            ["*"],
            "original/model.safetensors",
            id="weights-in-subfolder",
        ),
        pytest.param(
            ("config.json", "tokenizer.json", "model.safetensors"),
            ["*.json"],
            "model.safetensors",
            id="allow-patterns-leave-out-weights",
        ),
        pytest.param(("config.json", "tokenizer.json", "training_args.bin"), None, "training_args.bin", id="training"),
        pytest.param(("config.json", "tokenizer.json"), None, "the repo has no weights at all", id="config-only"),
    ],
)
def test_a_selection_without_servable_weights_fails(listing, allow, expected):
    with pytest.raises(SelectionError) as caught:
        select_files(files(*listing), allow_patterns=allow, repo_id="org/m", commit=COMMIT)
    message = str(caught.value)
    assert "org/m" in message and "no *.safetensors or *.bin weights at the repo root" in message
    assert expected in message
    assert "allow_patterns" in message


def test_a_numbered_shard_set_must_be_complete():
    absent = files("config.json", "model-00001-of-00003.safetensors", "model-00003-of-00003.safetensors",
                   "model.safetensors.index.json")  # fmt: skip
    with pytest.raises(SelectionError, match=r"not model-00002-of-00003\.safetensors \(1 of 3 shards absent from"):
        select_files(absent, repo_id="org/m")
    full = files("config.json", *(f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)))
    with pytest.raises(SelectionError, match=r"\(2 of 3 shards left out by the selection\)"):
        select_files(full, allow_patterns=["config.json", "model-00001-*"], repo_id="org/m")
    assert len(select_files(full, repo_id="org/m")) == 4


def test_a_selection_above_the_plausible_size_fails():
    huge = files("config.json", *(f"model-0000{i}-of-00005.safetensors" for i in range(1, 6)), size=45 * 1024**3)
    huge = [HubFile(f.path, f.size * 10, f.git_blob_id, f.lfs_sha256) for f in huge]  # 5 x 450 GiB
    with pytest.raises(SelectionError, match=r"adds up to 2\.\d TB, above the 2 TB .*MAX_MODEL_BYTES"):
        select_files(huge, repo_id="org/m")
    assert sum(f.size for f in huge) > MAX_MODEL_BYTES


def test_the_index_must_name_only_selected_shards():
    chosen = files("config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    check_index(index, chosen, chosen, "org/m")  # complete: no error
    stale = {"weight_map": {**index["weight_map"], "c": "extra.safetensors"}}
    with pytest.raises(SelectionError, match=r"names 3 shards, 1 of them absent from the repo's listing: 'extra"):
        check_index(stale, chosen, chosen, "org/m")
    with pytest.raises(SelectionError, match=r"1 of them left out by the selection"):
        check_index(index, chosen[:2], chosen, "org/m")
    with pytest.raises(SelectionError, match=r"has no weight_map .* ignore_patterns="):
        check_index({"metadata": {}}, chosen, chosen, "org/m")
