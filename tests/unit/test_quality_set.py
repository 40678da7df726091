"""The quality set (issue 37): parsed and checked before any cloud write, each bad entry named by its full path with
its fix; answers scored as the set says; the gate's verdict from both revisions' answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.common import read_spec
from tasks.checks.quality_budget import check_quality_budget
from tasks.deploy.probe import VerifyOptions
from tasks.quality.scoring import agreement, passes, score
from tasks.quality.spec import Expect, resolve_quality
from tasks.quality.verdict import Answer, judge, table
from tasks.watch.canary import WatchOptions

SET = {
    "prompts": [
        {"prompt": "Capital of France?", "expect": {"contains": "Paris"}, "max_tokens": 16},
        {"prompt": "2+2?", "expect": {"exact": "4"}},
        {"prompt": "Colour of the sky?", "expect": {"one_of": ["blue", "Blue"]}},
        {"prompt": "A year?", "expect": {"regex": r"^\d{4}$"}},
    ],
    "min_score": 0.75,
}


def answers(*texts: str) -> list[Answer]:
    return [Answer(text=t) for t in texts]


def test_each_matcher_compares_the_stripped_answer_as_the_set_says():
    assert passes(Expect(contains="Paris"), "  It is Paris.\n")
    assert passes(Expect(exact="4"), " 4\n") and not passes(Expect(exact="4"), "4.")
    assert passes(Expect(one_of=["blue", "Blue"]), "Blue ") and not passes(Expect(one_of=["blue"]), "BLUE")
    assert passes(Expect(regex=r"^\d{4}$"), " 1969 ") and not passes(Expect(regex=r"^\d{4}$"), "in 1969")
    assert score([True, False, True, True]) == 0.75 and score([]) == 0.0
    assert agreement(["a ", "b"], ["a", "c"]) == 0.5


def test_inline_prompts_come_first_then_the_files_and_defaults_apply(tmp_path):
    lines = [{"prompt": "Largest planet?", "expect": {"contains": "Jupiter"}, "max_tokens": 8}, {}]
    (tmp_path / "qa.jsonl").write_text(json.dumps(lines[0]) + "\n\n")
    quality = resolve_quality({**SET, "file": "qa.jsonl"}, tmp_path)
    assert quality is not None
    assert [p.prompt for p in quality.prompts][-1] == "Largest planet?" and len(quality.prompts) == 5
    assert quality.prompts[1].max_tokens == 32 and quality.max_drop == 0.0 and quality.min_agreement == 1.0
    assert quality.max_tokens == 16 + 32 * 3 + 8


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"prompts": [{"prompt": "x", "expect": {"contains": "a", "exact": "a"}}]},
         ["quality.prompts[0].expect: give exactly one of exact, contains, regex, one_of (gives exact, contains)"]),
        ({"prompts": [{"prompt": "x", "expect": {"regex": "("}}]}, ["quality.prompts[0].expect.regex", "fix the"]),
        ({"prompts": [{"prompt": "x", "expect": {"contains": "a"}, "max_token": 3}]},
         ["quality.prompts[0].max_token: unknown key; remove it (keys here: prompt, expect, max_tokens)"]),
        ({"perplexity": {"text": "a", "ratio": 2}},
         ["quality.perplexity.ratio: unknown key; remove it (keys here: text, max_ratio, max)"]),
        ({"perplexity": {"text": "a", "max_ratio": 0.9}},
         ["quality.perplexity.max_ratio: Input should be greater than or equal to 1"]),
        ({"min_score": 1.5}, ["quality.min_score: Input should be less than or equal to 1"]),
        ({"prompts": []}, ["quality.prompts: the quality set has no prompt; give prompts"]),
    ],
)  # fmt: skip
def test_a_bad_entry_is_named_by_its_full_path_with_its_fix(tmp_path, change, words):
    with pytest.raises(ValueError) as caught:
        resolve_quality({**SET, **change}, tmp_path)
    assert all(w in str(caught.value) for w in words), str(caught.value)


def test_the_jsonl_file_must_lie_beside_the_model_file_and_its_bad_line_is_named(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "secret.jsonl").write_text("{}\n")
    for name in ("../secret.jsonl", str(tmp_path / "secret.jsonl")):
        with pytest.raises(ValueError, match=r"quality.file: .* is not inside .*; put the JSONL file beside"):
            resolve_quality({**SET, "file": name}, tmp_path / "models")
    with pytest.raises(ValueError, match=r"quality\.file: none\.jsonl is not a file in"):
        resolve_quality({**SET, "file": "none.jsonl"}, tmp_path / "models")
    (tmp_path / "models" / "qa.jsonl").write_text('{"prompt": "a", "expect": {"exact": "b"}}\n{"prompt": "c"}\nnope\n')
    with pytest.raises(ValueError, match=r"quality.file qa.jsonl line 2: expect: Field required"):
        resolve_quality({**SET, "file": "qa.jsonl"}, tmp_path / "models")


def test_a_model_files_quality_set_is_checked_with_the_rest_of_the_file(tmp_path):
    folder = tmp_path / "deployments"
    folder.mkdir()
    model = folder / "m.yaml"
    model.write_text("model: org/m\nquality:\n  min_score: 0.5\n  prompts:\n    - prompt: hi\n"
                     "      expect: {exact: a}\n      max_tokens: 0\n  max_dorp: 0.1\n")  # fmt: skip
    with pytest.raises(ValueError) as caught:
        read_spec(str(model), within=folder)
    said = str(caught.value)
    assert "quality.prompts[0].max_tokens: Input should be greater than or equal to 1" in said
    assert "quality.max_dorp: unknown key 'max_dorp'; allowed: [" in said and "'max_drop'" in said


def test_the_floor_alone_judges_a_first_deploy():
    quality = resolve_quality(SET, Path("."))
    assert quality is not None
    good = judge(quality, "r2", answers("Paris", "4", "blue", "nope"))
    assert good.passed and good.candidate_score == 0.75 and good.serving_score is None
    assert "floor only" in good.reason
    bad = judge(quality, "r2", answers("Lyon", "4", "red", "nope"))
    assert not bad.passed
    assert bad.reason.startswith(
        "quality gate refused the candidate: below min_score 0.75: candidate r2 scored 0.25 (1/4)"
    )


def test_a_candidate_may_not_drop_below_the_serving_revision_by_more_than_max_drop():
    quality = resolve_quality({**SET, "min_score": 0.5, "max_drop": 0.25}, Path("."))
    assert quality is not None
    serving = answers("Paris", "4", "blue", "1969")
    held = judge(quality, "r2", answers("Paris", "4", "blue", "x"), "r1", serving)
    assert held.passed and (held.candidate_score, held.serving_score) == (0.75, 1.0)
    dropped = judge(quality, "r2", answers("Paris", "4", "x", "x"), "r1", serving)
    assert not dropped.passed and "more than max_drop 0.25 below the serving revision" in dropped.reason
    assert "candidate r2 scored 0.50 (2/4), serving r1 scored 1.00 (4/4)" in dropped.reason


def test_on_the_same_weights_the_greedy_answers_must_agree():
    quality = resolve_quality({**SET, "min_score": 0.5, "max_drop": 1.0, "min_agreement": 0.75},
                              Path("."))  # fmt: skip
    assert quality is not None
    serving = answers("Paris.", "4", "blue", "1969")
    agreeing = judge(quality, "r2", answers("Paris.", "4", "blue", "2001"), "r1", serving, same_weights=True)
    assert agreeing.passed and agreeing.agreement == 0.75
    # Both answers pass every prompt, but two of four differ: a flags change changed what the model says.
    differing = judge(quality, "r2", answers("Paris!", "4", "Blue", "1969"), "r1", serving, same_weights=True)
    assert not differing.passed and differing.agreement == 0.5
    assert "agreement below min_agreement 0.75" in differing.reason
    failed = [Answer(error="HTTP 500")] * 4
    assert judge(quality, "r2", failed, "r1", failed, same_weights=True).agreement == 0.0


def test_the_reports_table_shows_each_prompt_both_answers_and_the_gates_cost():
    quality = resolve_quality(SET, Path("."))
    assert quality is not None
    result = judge(quality, "r2", answers("Lyon | " + "x" * 100, "4", "blue", "1969"), "r1",
                   [Answer(error="HTTP 503"), *answers("4", "blue", "1969")])  # fmt: skip
    result.requests, result.seconds = 8, 1.5
    lines = table(result)
    assert "| gate cost | 8 requests in 1.5 s (both revisions side by side) |" in lines
    row = next(line for line in lines if line.startswith("| Capital of France?"))
    assert "FAIL: `Lyon / xxx" in row and "…`" in row and "FAIL: `HTTP 503`" in row
    assert "| 2+2? | pass: `4` | pass: `4` |" in lines


def test_a_quality_set_the_verify_window_cannot_hold_is_refused_saying_what_to_change():
    many = {"prompts": [{"prompt": f"q{i}", "expect": {"exact": "a"}, "max_tokens": 64} for i in range(20)],
            "min_score": 0.5}  # fmt: skip
    quality = resolve_quality(many, Path("."))
    # 20 x (2 s to the first token + 64 tokens at 10 tokens/s): 168 s, more than the 120 s verify window.
    (finding,) = check_quality_budget(quality, None, WatchOptions())
    assert (finding.severity, finding.setting) == ("error", "quality")
    assert "20 prompts of up to 1280 tokens in all may take 168 s at the slowest speed the watch calls healthy " \
           "(10 tokens/s, first token in 2 s), more than the verify window of 120 s" in finding.message  # fmt: skip
    assert finding.message.endswith("use fewer prompts or smaller max_tokens, or raise verify.request_timeout_s")
    assert check_quality_budget(quality, VerifyOptions(request_timeout_s=180), WatchOptions()) == []
    assert check_quality_budget(resolve_quality(SET, Path(".")), None, WatchOptions()) == []
    assert check_quality_budget(None, None, WatchOptions()) == []
