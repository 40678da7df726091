"""The model files shipped with the project say they are examples to adapt, in the file and in the UI (issue 33)."""

from __future__ import annotations

import yaml

from flows.sync_deployments import ROOT, example_note, model_deployments


def entries(path, relative_to) -> list[dict]:
    return yaml.safe_load(model_deployments(path, relative_to=relative_to).replace("*pipeline_pool", "x"))


def test_the_shipped_gemma_files_are_marked_examples_in_prefect_yaml():
    deployments = {d["name"]: d for d in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]}
    assert "RTX Pro 6000" in example_note(ROOT / "deployments" / "gemma-4-31b.yaml")
    for name in ("gemma-4-e2b", "gemma-4-31b"):
        assert example_note(ROOT / "deployments" / f"{name}.yaml")
        assert "EXAMPLE to adapt" in deployments[name]["description"]
        assert "until" in deployments[f"{name}-hours"]["description"]  # its runs change nothing before a promotion
    assert not [d for d in deployments.values() if "sandbox" in d["name"]]


def test_an_example_line_reaches_both_descriptions_and_stays_valid_yaml(tmp_path):
    model = tmp_path / "chat.yaml"
    model.write_text("# Chat model.\n# example: needs a quota: ask for it # first\nmodel: org/chat\n")
    promote, hours = entries(model, tmp_path)
    assert promote["description"].endswith("EXAMPLE to adapt: needs a quota: ask for it # first.")
    assert "EXAMPLE to adapt (chat.yaml): needs a quota" in hours["description"]


def test_a_file_of_your_own_keeps_plain_descriptions(tmp_path):
    model = tmp_path / "chat.yaml"
    model.write_text("# Chat model.\nmodel: org/chat\n# example: below the header: not a mark\n")
    assert example_note(model) is None
    promote, _ = entries(model, tmp_path)
    assert promote["description"] == "Promote org/chat (chat.yaml) to its Cloud Run service org-chat."
