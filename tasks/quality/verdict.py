"""The gate's verdict from both revisions' answers: pure, so every rule is tested without a server.

Pass: the candidate scores at least ``min_score``; and, when a serving revision answered, at least its score less
``max_drop``; and, when the candidate runs on the serving revision's own weights (a new image, vLLM version, flags
or dtype), at least ``min_agreement`` of its greedy answers are the serving revision's word for word.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from tasks.quality.scoring import agreement, at_least, passes, score
from tasks.quality.spec import QualitySet

ANSWER_SHOWN = 60  # characters of an answer the report's table shows


class Answer(BaseModel):
    """One revision's answer to one prompt."""

    text: str = ""
    passed: bool = False
    error: str | None = Field(None, description="Why there is no answer (an HTTP status, a timeout).")
    tokens: int = 0


class PromptResult(BaseModel):
    prompt: str
    candidate: Answer
    serving: Answer | None = None


class GateResult(BaseModel):
    """What the gate found: each prompt's answers, both scores, and what it cost."""

    candidate_revision: str
    serving_revision: str | None = Field(None, description="None: a first deploy, or nothing could answer beside it.")
    candidate_score: float
    serving_score: float | None = None
    same_weights: bool = False
    agreement: float | None = None
    min_score: float
    max_drop: float
    min_agreement: float
    passed: bool
    reason: str
    prompts: list[PromptResult]
    requests: int = 0
    seconds: float = 0.0
    note: str | None = Field(None, description="Why only the floor applied, when a serving revision exists.")

    def scores(self) -> str:
        """Both scores as the failure message and the report's headline give them."""
        total = len(self.prompts)
        mine = f"candidate {self.candidate_revision} scored {self.candidate_score:.2f} " \
               f"({round(self.candidate_score * total)}/{total})"  # fmt: skip
        if self.serving_score is None:
            return f"{mine}; no serving revision answered ({self.note or 'a first deploy'}): floor only"
        theirs = f"serving {self.serving_revision} scored {self.serving_score:.2f} " \
                 f"({round(self.serving_score * total)}/{total})"  # fmt: skip
        same = f"; same weights, agreement {self.agreement:.2f}" if self.agreement is not None else ""
        return f"{mine}, {theirs}{same}"


def judge(
    quality: QualitySet, candidate_revision: str, candidate: list[Answer], serving_revision: str | None = None,
    serving: list[Answer] | None = None, same_weights: bool = False, note: str | None = None,
) -> GateResult:  # fmt: skip
    """The verdict on the candidate's ``candidate`` answers beside the serving revision's (None: floor only)."""
    marked = [a.model_copy(update={"passed": a.error is None and passes(p.expect, a.text)})
              for p, a in zip(quality.prompts, candidate, strict=True)]  # fmt: skip
    mine = score([a.passed for a in marked])
    theirs_marked = None
    theirs = agreed = None
    if serving is not None:
        theirs_marked = [a.model_copy(update={"passed": a.error is None and passes(p.expect, a.text)})
                         for p, a in zip(quality.prompts, serving, strict=True)]  # fmt: skip
        theirs = score([a.passed for a in theirs_marked])
        if same_weights:  # an answer missing on either side agrees with nothing
            answered = [(a, b) for a, b in zip(marked, theirs_marked, strict=True) if not (a.error or b.error)]
            agreed = (
                agreement([a.text for a, _ in answered], [b.text for _, b in answered]) * len(answered) / len(marked)
            )
    failures = []
    if not at_least(mine, quality.min_score):
        failures.append(f"below min_score {quality.min_score:.2f}")
    if theirs is not None and not at_least(mine, theirs - quality.max_drop):
        failures.append(f"more than max_drop {quality.max_drop:.2f} below the serving revision")
    if agreed is not None and not at_least(agreed, quality.min_agreement):
        failures.append(f"on the serving revision's own weights, agreement below min_agreement "
                        f"{quality.min_agreement:.2f}")  # fmt: skip
    prompts = [PromptResult(prompt=p.prompt, candidate=c, serving=s) for p, c, s in
               zip(quality.prompts, marked, theirs_marked or [None] * len(marked), strict=True)]  # fmt: skip
    result = GateResult(
        candidate_revision=candidate_revision, serving_revision=serving_revision if serving is not None else None,
        candidate_score=mine, serving_score=theirs, same_weights=same_weights, agreement=agreed,
        min_score=quality.min_score, max_drop=quality.max_drop, min_agreement=quality.min_agreement,
        passed=not failures, reason="", prompts=prompts, note=note,
    )  # fmt: skip
    verdict = "passed" if not failures else f"refused the candidate: {'; '.join(failures)}"
    result.reason = f"quality gate {verdict}: {result.scores()}"
    return result


def _cell(answer: Answer | None) -> str:
    if answer is None:
        return "-"
    text = answer.error or answer.text.strip()
    shown = text if len(text) <= ANSWER_SHOWN else text[: ANSWER_SHOWN - 1] + "…"
    mark = "pass" if answer.passed else "FAIL"
    return f"{mark}: `{shown}`".replace("|", "/").replace("\n", " ")


def table(result: GateResult) -> list[str]:
    """The report's section: the verdict, both scores, the cost, and each prompt with both answers."""
    lines = ["## Quality gate", "", f"**{result.reason}**", ""]
    cost = f"{result.requests} requests in {result.seconds:.1f} s (both revisions side by side)"
    lines += ["| | |", "|---|---|", f"| candidate score | {result.candidate_score:.2f} (min_score "
              f"{result.min_score:.2f}) |"]  # fmt: skip
    if result.serving_score is not None:
        lines.append(f"| serving score | {result.serving_score:.2f} ({result.serving_revision}; max_drop "
                     f"{result.max_drop:.2f}) |")  # fmt: skip
    if result.agreement is not None:
        lines.append(f"| agreement | {result.agreement:.2f} (same weights; min_agreement {result.min_agreement:.2f}) |")
    if result.note:
        lines.append(f"| note | {result.note} |")
    lines += [f"| gate cost | {cost} |", "", "| prompt | candidate | serving |", "|---|---|---|"]
    for row in result.prompts:
        prompt = row.prompt.replace("|", "/").replace("\n", " ")[:ANSWER_SHOWN]
        lines.append(f"| {prompt} | {_cell(row.candidate)} | {_cell(row.serving)} |")
    return [*lines, ""]
