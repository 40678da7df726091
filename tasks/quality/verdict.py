"""The gate's verdict from both revisions' answers: pure, so every rule is tested without a server.

Pass: the candidate scores at least ``min_score``; and, when a serving revision answered, at least its score less
``max_drop``; and, when the candidate runs on the serving revision's own weights (a new image, vLLM version, flags
or dtype), at least ``min_agreement`` of its greedy answers are the serving revision's word for word; and, with a
reference text, its perplexity is at most the serving revision's times ``max_ratio`` and at most ``max``.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from tasks.quality.perplexity import Measured
from tasks.quality.scoring import agreement, at_least, passes, score
from tasks.quality.spec import Perplexity, QualitySet

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


def shown(value: float) -> str:
    """A perplexity as people read one: 1.002, 14.3, 284 (never 1.2e+03, nor 1 for 1.002)."""
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.3f}"


class PerplexityResult(BaseModel):
    """Both revisions' perplexity of the reference text and the limits the candidate's was held to."""

    candidate: Measured
    serving: Measured | None = None
    max_ratio: float
    max: float | None = None

    def said(self) -> str:
        """Both values as the verdict and the report give them."""
        mine = self.candidate.error or shown(self.candidate.value)
        theirs = "" if self.serving is None else f", serving {self.serving.error or shown(self.serving.value)}"
        return f"candidate {mine}{theirs}"


def judge_perplexity(
    spec: Perplexity, candidate: Measured, serving: Measured | None
) -> tuple[PerplexityResult, list[str]]:
    """The perplexity check's result and its failures: a candidate that could not be measured fails (the quality set
    asks for it); a serving revision that could not be, leaves the ceiling alone to judge."""
    result = PerplexityResult(candidate=candidate, serving=serving, max_ratio=spec.max_ratio, max=spec.max)
    if candidate.value is None:
        return result, [f"perplexity not measured on the candidate ({candidate.error})"]
    failures = []
    if spec.max is not None and candidate.value > spec.max:
        failures.append(f"perplexity {shown(candidate.value)} above max {shown(spec.max)}")
    if serving is not None and serving.value is not None and candidate.value > serving.value * spec.max_ratio:
        failures.append(f"perplexity {shown(candidate.value)} above the serving revision's {shown(serving.value)} "
                        f"times max_ratio {spec.max_ratio:.3g}")  # fmt: skip
    return result, failures


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
    perplexity: PerplexityResult | None = None
    requests: int = 0
    seconds: float = 0.0
    note: str | None = Field(None, description="Why only the floor applied, when a serving revision exists.")

    def scores(self) -> str:
        """Both scores as the failure message and the report's headline give them."""
        total = len(self.prompts)
        mine = f"candidate {self.candidate_revision} scored {self.candidate_score:.2f} " \
               f"({round(self.candidate_score * total)}/{total})"  # fmt: skip
        if self.serving_score is None:
            alone = f"no serving revision answered ({self.note or 'a first deploy'}): floor only"
            return f"{mine}; {alone}{self._perplexity()}"
        theirs = f"serving {self.serving_revision} scored {self.serving_score:.2f} " \
                 f"({round(self.serving_score * total)}/{total})"  # fmt: skip
        same = f"; same weights, agreement {self.agreement:.2f}" if self.agreement is not None else ""
        return f"{mine}, {theirs}{same}{self._perplexity()}"

    def _perplexity(self) -> str:
        return f"; perplexity {self.perplexity.said()}" if self.perplexity is not None else ""


def judge(
    quality: QualitySet, candidate_revision: str, candidate: list[Answer], serving_revision: str | None = None,
    serving: list[Answer] | None = None, same_weights: bool = False, note: str | None = None,
    perplexity: tuple[Measured, Measured | None] | None = None,
) -> GateResult:  # fmt: skip
    """The verdict on the candidate's ``candidate`` answers beside the serving revision's (None: floor only), and on
    both revisions' ``perplexity`` of the reference text when the set has one."""
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
    checked = None
    if quality.perplexity is not None and perplexity is not None:
        checked, missed = judge_perplexity(quality.perplexity, *perplexity)
        failures += missed
    prompts = [PromptResult(prompt=p.prompt, candidate=c, serving=s) for p, c, s in
               zip(quality.prompts, marked, theirs_marked or [None] * len(marked), strict=True)]  # fmt: skip
    result = GateResult(
        candidate_revision=candidate_revision, serving_revision=serving_revision if serving is not None else None,
        candidate_score=mine, serving_score=theirs, same_weights=same_weights, agreement=agreed,
        min_score=quality.min_score, max_drop=quality.max_drop, min_agreement=quality.min_agreement,
        passed=not failures, reason="", prompts=prompts, note=note, perplexity=checked,
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
    if result.perplexity is not None:
        ceiling = f"; max {result.perplexity.max:.3g}" if result.perplexity.max is not None else ""
        limits = f"max_ratio {result.perplexity.max_ratio:.3g}{ceiling}"
        lines.append(
            f"| perplexity | {result.perplexity.said()} ({limits}; {result.perplexity.candidate.tokens} tokens) |"
        )
    if result.note:
        lines.append(f"| note | {result.note} |")
    lines += [f"| gate cost | {cost} |", "", "| prompt | candidate | serving |", "|---|---|---|"]
    for row in result.prompts:
        prompt = row.prompt.replace("|", "/").replace("\n", " ")[:ANSWER_SHOWN]
        lines.append(f"| {prompt} | {_cell(row.candidate)} | {_cell(row.serving)} |")
    return [*lines, ""]
