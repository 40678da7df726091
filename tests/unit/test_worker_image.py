"""Whether an image holds this tree, judged from its reference where that is enough (no registry call): an image
that is not ours cannot be judged, and a content tag in the reference is compared with the tree's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.image.worker_image import judge_worker_image, tree_tag

ROOT = Path(__file__).resolve().parents[2]
OURS = "europe-west4-docker.pkg.dev/acme-ml-prod/vllm-images/hf-cloudrun-pipeline"


def no_registry():
    raise AssertionError("the registry was asked, though the reference alone decides")


@pytest.mark.parametrize(
    "image",
    [
        "prefecthq/prefect:3.9.1-python3.11",  # a user's own image
        "europe-west4-docker.pkg.dev/acme-ml-prod/vllm-images/team-worker@sha256:" + "a" * 64,  # another name
        f"{OURS}:v42",  # our name, the team's CI's tag
        f"{OURS}",
    ],
)
def test_an_image_we_did_not_tag_cannot_be_judged_and_says_why(image):
    verdict = judge_worker_image(image, ROOT, no_registry)
    assert verdict.state == "unknown" and verdict.why and verdict.tree_tag == tree_tag(ROOT)


def test_a_content_tag_in_the_reference_is_compared_with_the_trees():
    tag = tree_tag(ROOT)
    assert judge_worker_image(f"{OURS}:{tag}", ROOT, no_registry).state == "current"
    stale = judge_worker_image(f"{OURS}:src-00000000000000000000", ROOT, no_registry)
    assert (stale.state, stale.image_tag, stale.tree_tag) == ("stale", "src-00000000000000000000", tag)


def test_the_trees_tag_follows_a_model_file(tmp_path):
    for name in ("Dockerfile", ".dockerignore", "pyproject.toml", "prefect.yaml"):
        (tmp_path / name).write_bytes((ROOT / name).read_bytes())
    (tmp_path / "deployments").mkdir()
    before = tree_tag(tmp_path)
    (tmp_path / "deployments" / "team.yaml").write_text("model: org/model\n")
    with_model = tree_tag(tmp_path)
    assert with_model != before
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.md").write_text("a doc edit reaches no run\n")
    assert tree_tag(tmp_path) == with_model
