"""The quality set: prompts with expected answers and the scores a candidate must reach (docs/quality-gate.md).

Given in a model file's ``quality:`` or as promote-model's ``quality`` parameter (the same shape); its prompts
inline and/or in a JSONL file beside the model file. Everything is checked before any cloud write: a bad entry
is named by its full path (``quality.prompts[1].expect``, ``quality.file qa.jsonl line 3: expect``) with its fix.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

DEFAULT_MAX_TOKENS = 32
MATCHERS = ("exact", "contains", "regex", "one_of")


class Expect(BaseModel):
    """What a right answer looks like: exactly one matcher. Answers are compared stripped of surrounding whitespace;
    ``exact`` and ``one_of`` are case-sensitive equality, ``contains`` a substring test, ``regex`` Python's
    ``re.search``."""

    model_config = ConfigDict(extra="forbid")

    exact: str | None = None
    contains: str | None = None
    regex: str | None = None
    one_of: list[str] | None = None

    @field_validator("regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a Python regular expression ({exc}); fix the pattern") from None
        return value

    @field_validator("one_of")
    @classmethod
    def _not_empty(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not value:
            raise ValueError("an empty list matches no answer; list the answers that are right")
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> Expect:
        given = [name for name in MATCHERS if getattr(self, name) is not None]
        if len(given) != 1:
            said = f"gives {', '.join(given)}" if given else "gives none"
            raise ValueError(f"give exactly one of {', '.join(MATCHERS)} ({said}), e.g. {{contains: Paris}}")
        return self


class QualityPrompt(BaseModel):
    """One prompt, sent as a single user message to /v1/chat/completions at temperature 0."""

    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1, description="The user message.")
    expect: Expect
    max_tokens: int = Field(DEFAULT_MAX_TOKENS, ge=1, le=4096, description="The answer's length limit.")


class Perplexity(BaseModel):
    """A reference text the model should know: its perplexity (vLLM's ``prompt_logprobs``) on the candidate must be at
    most the serving revision's times ``max_ratio`` and, when given, at most ``max`` (which holds a first deploy)."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, description="A text the model has seen (a passage from its training data).")
    max_ratio: float = Field(
        1.10, ge=1.0, description="The candidate's perplexity over the serving revision's, at most."
    )
    max: float | None = Field(None, ge=1.0, description="An absolute ceiling on the candidate's perplexity.")


class QualitySpec(BaseModel):
    """A quality set as written: inline prompts and/or a JSONL ``file`` beside the model file (its prompts after
    the inline ones), the absolute floor ``min_score``, the largest drop below the serving revision's score
    ``max_drop``, and ``min_agreement`` for a candidate on the serving revision's own weights."""

    model_config = ConfigDict(extra="forbid")

    prompts: list[QualityPrompt] = Field(default_factory=list)
    file: str | None = Field(None, description="A JSONL file beside the model file: one prompt object a line.")
    min_score: float = Field(ge=0, le=1, description="Fraction of prompts the candidate must pass (0..1).")
    max_drop: float = Field(0.0, ge=0, le=1, description="How far below the serving revision's score it may be.")
    min_agreement: float = Field(
        1.0, ge=0, le=1, description="Same weights as the serving revision: fraction of identical greedy answers."
    )
    perplexity: Perplexity | None = None


class QualitySet(BaseModel):
    """A quality set resolved: every prompt (inline, then the file's) and the thresholds."""

    prompts: list[QualityPrompt]
    min_score: float
    max_drop: float = 0.0
    min_agreement: float = 1.0
    perplexity: Perplexity | None = None
    source: str = "quality"  # where it was given, for messages: "quality" or "deployments/x.yaml quality"

    @property
    def max_tokens(self) -> int:
        """Tokens the set may generate per revision, at most."""
        return sum(p.max_tokens for p in self.prompts)


def _keys_at(loc: tuple, root: type[BaseModel]) -> list[str]:
    """The keys allowed where an unknown key was found (``loc``: the path of the object holding it in ``root``)."""
    names = [part for part in loc if isinstance(part, str)]
    if not loc:
        return list(root.model_fields)
    if names[-1:] == ["expect"]:
        return list(MATCHERS)
    if names[-1:] == ["perplexity"]:
        return list(Perplexity.model_fields)
    if names[-1:] == ["prompts"]:
        return list(QualityPrompt.model_fields)
    return list(root.model_fields)


def _problems(exc: ValidationError, prefix: str, root: type[BaseModel]) -> str:
    """One line per problem, each led by its full path; never the input (a prompt may be long)."""
    lines = []
    for error in exc.errors(include_input=False):
        path = prefix
        for part in error["loc"]:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = f"unknown key; remove it (keys here: {', '.join(_keys_at(error['loc'][:-1], root))})"
        lines.append(f"{path}: {message}")
    return "; ".join(lines)


def _prompts_file(name: str, folder: Path, where: str) -> list[QualityPrompt]:
    """The JSONL file's prompts; the file must lie inside ``folder`` (the model file's own)."""
    root = folder.resolve()
    path = (root / name).resolve()  # follows symlinks and `..`: where the file really is
    if Path(name).is_absolute() or not path.is_relative_to(root):
        raise ValueError(f"{where}.file: {name} is not inside {root}; put the JSONL file beside the model file and "
                         "give its name (e.g. my-model.quality.jsonl)")  # fmt: skip
    try:
        lines = path.read_text().splitlines()
    except (FileNotFoundError, IsADirectoryError):
        raise ValueError(f"{where}.file: {name} is not a file in {root}; create it (one JSON object a line: "
                         '{"prompt": ..., "expect": {...}, "max_tokens": ...}) or fix the name') from None  # fmt: skip
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        at = f"{where}.file {name} line {number}"
        try:
            data = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{at}: not JSON ({exc.args[0].split(':')[0]}); write one JSON object a line") from None
        try:
            prompts.append(QualityPrompt.model_validate(data))
        except ValidationError as exc:
            raise ValueError(_problems(exc, at, QualityPrompt).replace(f"{at}.", f"{at}: ", 1)) from None
    return prompts


def resolve_quality(given: QualitySpec | dict | None, folder: Path, where: str = "quality") -> QualitySet | None:
    """The quality set ``given`` (a model file's ``quality:`` or the run's parameter), its file read from
    ``folder``; None when there is none. A ValueError names each bad field by its path under ``where``."""
    if given is None:
        return None
    try:
        spec = given if isinstance(given, QualitySpec) else QualitySpec.model_validate(given)
    except ValidationError as exc:
        raise ValueError(_problems(exc, where, QualitySpec)) from None
    prompts = list(spec.prompts)
    if spec.file:
        prompts += _prompts_file(spec.file, folder, where)
    if not prompts:
        raise ValueError(f"{where}.prompts: the quality set has no prompt; give prompts, or a file with one a line, "
                         "or remove quality")  # fmt: skip
    return QualitySet(prompts=prompts, min_score=spec.min_score, max_drop=spec.max_drop,
                      min_agreement=spec.min_agreement, perplexity=spec.perplexity, source=where)  # fmt: skip
