"""Dockerfile parsing as docker's own parser does it: the parts a build's failure modes depend on.

Line continuations (with the ``# escape=`` directive), comments inside continuations, flags such as
``RUN --mount=...``, stages (``FROM image AS name``), and heredocs (``RUN <<EOF``), which only BuildKit reads:
the classic builder sees a heredoc's body as instructions and stops at the first one it does not know, as
docker does. Variable expansion follows the Dockerfile rules for ``$VAR``, ``${VAR}``, ``${VAR:-x}`` and
``${VAR:+x}``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

INSTRUCTIONS = frozenset(
    {
        "ADD",
        "ARG",
        "CMD",
        "COPY",
        "ENTRYPOINT",
        "ENV",
        "EXPOSE",
        "FROM",
        "HEALTHCHECK",
        "LABEL",
        "MAINTAINER",
        "ONBUILD",
        "RUN",
        "SHELL",
        "STOPSIGNAL",
        "USER",
        "VOLUME",
        "WORKDIR",
    }
)
DIRECTIVE = re.compile(r"^#\s*([a-zA-Z][a-zA-Z0-9]*)\s*=\s*(.+?)\s*$")
FLAG = re.compile(r"\s*(--[A-Za-z][A-Za-z0-9-]*(?:=\S*)?)")
HEREDOC = re.compile(r"<<(-?)\s*([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")
STAGE_NAME = re.compile(r"^[a-z][a-z0-9._-]*$")
VARIABLE = re.compile(r"\\\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([-+])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


class DockerfileError(Exception):
    """A Dockerfile docker refuses before building. ``line`` is 1-based (0: not tied to a line).

    ``parse`` errors print as ``dockerfile parse error on line N: ...``; the others print their message alone.
    """

    def __init__(self, line: int, message: str, parse: bool = True) -> None:
        super().__init__(message)
        self.line = line
        self.message = message
        self.parse = parse

    def docker_message(self) -> str:
        return f"dockerfile parse error on line {self.line}: {self.message}" if self.parse else self.message


@dataclass
class Instruction:
    """One instruction: its keyword (upper case), leading ``--flags``, the rest, and the text as written."""

    line: int
    keyword: str
    flags: list[tuple[str, str]]
    value: str
    text: str

    def flag(self, name: str) -> str | None:
        return next((v for k, v in self.flags if k == name), None)


@dataclass
class Stage:
    """``FROM base [AS name]`` and the instructions up to the next FROM."""

    index: int
    name: str | None  # lower case, as docker compares stage names
    base: str
    from_instruction: Instruction
    instructions: list[Instruction] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.name or f"stage-{self.index}"


@dataclass
class Dockerfile:
    meta_args: list[Instruction]  # ARGs before the first FROM: visible to FROM lines only
    stages: list[Stage]
    lines: list[str]

    def stage(self, ref: str) -> Stage | None:
        """The stage a ``FROM``/``--from`` reference names (by name, case-insensitive, or by index)."""
        ref = ref.strip().lower()
        for stage in self.stages:
            if stage.name == ref:
                return stage
        if ref.isdigit() and int(ref) < len(self.stages):
            return self.stages[int(ref)]
        return None


def parse_dockerfile(text: str, heredocs: bool) -> Dockerfile:
    """Parse ``text``; ``heredocs`` is True under BuildKit. Raises DockerfileError as docker would."""
    lines = text.splitlines()
    escape = "\\"
    index = 0
    # Parser directives only count at the very top, before any comment, blank line or instruction.
    while index < len(lines):
        match = DIRECTIVE.match(lines[index].strip())
        if not match:
            break
        if match[1].lower() == "escape" and match[2] in ("\\", "`"):
            escape = match[2]
        index += 1
    instructions: list[Instruction] = []
    while index < len(lines):
        stripped = lines[index].strip()
        if not stripped or stripped.startswith("#"):
            index += 1
            continue
        start = index + 1
        parts: list[str] = []
        current = lines[index].rstrip()
        index += 1
        while current.endswith(escape):
            parts.append(current[: -len(escape)])
            # Comment and blank lines inside a continuation are dropped, as docker does.
            while index < len(lines) and (not lines[index].strip() or lines[index].lstrip().startswith("#")):
                index += 1
            if index >= len(lines):
                current = ""
                break
            current = lines[index].rstrip()
            index += 1
        parts.append(current)
        joined = " ".join(p.strip() for p in parts if p.strip())
        keyword, _, rest = joined.partition(" ")
        upper = keyword.upper()
        if upper not in INSTRUCTIONS:
            raise DockerfileError(start, f"unknown instruction: {upper}")
        flags, value = _split_flags(rest)
        if heredocs and upper in ("RUN", "COPY", "ADD"):
            for strip_tabs, _, word in HEREDOC.findall(value):
                body = []
                while index < len(lines):
                    candidate = lines[index].lstrip("\t") if strip_tabs else lines[index]
                    index += 1
                    if candidate == word:
                        break
                    body.append(lines[index - 1])
                else:
                    raise DockerfileError(start, f"unterminated heredoc {word}")
                value += "\n" + "\n".join(body)
        instructions.append(Instruction(start, upper, flags, value.strip(), joined))
    return _stages(instructions, lines)


def _split_flags(rest: str) -> tuple[list[tuple[str, str]], str]:
    flags: list[tuple[str, str]] = []
    while True:
        match = FLAG.match(rest)
        if match is None:
            return flags, rest.strip()
        name, _, value = match[1][2:].partition("=")
        flags.append((name.lower(), value))
        rest = rest[match.end() :]


def _stages(instructions: list[Instruction], lines: list[str]) -> Dockerfile:
    meta: list[Instruction] = []
    stages: list[Stage] = []
    for inst in instructions:
        if inst.keyword == "FROM":
            words = inst.value.split()
            if not words:
                raise DockerfileError(inst.line, "FROM requires either one or three arguments")
            name = None
            if len(words) >= 3 and words[1].lower() == "as":
                name = words[2].lower()
                if not STAGE_NAME.match(name):
                    raise DockerfileError(
                        inst.line,
                        f'invalid name for build stage: "{words[2]}", name can\'t start with a number or contain '
                        "symbols",
                    )
            elif len(words) != 1:
                raise DockerfileError(inst.line, "FROM requires either one or three arguments")
            stages.append(Stage(len(stages), name, words[0], inst))
        elif not stages:
            if inst.keyword != "ARG":
                raise DockerfileError(inst.line, "no build stage in current context", parse=False)
            meta.append(inst)
        else:
            stages[-1].instructions.append(inst)
    if not stages and not meta:
        raise DockerfileError(0, "file with no instructions", parse=False)
    if not stages:
        raise DockerfileError(meta[-1].line, "no build stage in current context", parse=False)
    return Dockerfile(meta, stages, lines)


def arg_declarations(inst: Instruction) -> list[tuple[str, str | None]]:
    """``ARG a=1 b`` -> [("a", "1"), ("b", None)]."""
    found = []
    for word in _words(inst.value):
        name, eq, default = word.partition("=")
        found.append((name, _unquote(default) if eq else None))
    return found


def env_assignments(inst: Instruction) -> list[tuple[str, str]]:
    """``ENV a=1 b="x y"`` or the legacy ``ENV a 1 2`` form."""
    words = _words(inst.value)
    if words and "=" not in words[0]:
        key, _, value = inst.value.strip().partition(" ")
        return [(key, value.strip())]
    return [(k, _unquote(v)) for k, _, v in (w.partition("=") for w in words)]


def expand(text: str, variables: dict[str, str | None]) -> str:
    """Dockerfile variable substitution; unset variables expand to the empty string."""

    def replace(match: re.Match[str]) -> str:
        if match[0] == "\\$":
            return "$"
        name = match[1] or match[4]
        value = variables.get(name)
        if match[2] == "-":
            return value if value else match[3]
        if match[2] == "+":
            return match[3] if value else ""
        return value or ""

    return VARIABLE.sub(replace, text)


def _words(text: str) -> list[str]:
    """Split on whitespace outside double or single quotes (quotes kept for _unquote)."""
    return re.findall(r"(?:[^\s\"']|\"[^\"]*\"|'[^']*')+", text)


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value
