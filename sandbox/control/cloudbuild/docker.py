"""The ``gcr.io/cloud-builders/docker`` step, simulated: CLI arguments, the build's checks and its output.

``simulate_build`` decides what ``docker build`` does with a workspace, in the order docker meets the problems
(seed 000, lessons 7 and 8):

1. the context folder and the Dockerfile must exist ("unable to prepare context: ...");
2. the Dockerfile must parse ("dockerfile parse error on line N: unknown instruction: X");
3. ``--target`` must name a stage ("failed to reach build target T in Dockerfile");
4. then the stages are built instruction by instruction, and the first of these ends it:
   a ``RUN --mount`` (or another BuildKit-only flag) on the classic builder; a setuptools-scm project built
   without ``.git`` in its context ("LookupError: setuptools-scm was unable to detect version for ...");
   the compile running ``max_jobs`` jobs of ``memory_per_job_gb`` each on a machine with less RAM: the compiler
   is OOM-killed ("Killed signal terminated program cc1plus", exit code 137) and Cloud Build ends the build
   INTERNAL_ERROR.

max_jobs is what the compile RUN sees: ``MAX_JOBS=N`` written in it or in its ENV; else a ``--build-arg
max_jobs=N`` (or ``MAX_JOBS=N``) the Dockerfile declares; else the ``ARG max_jobs=N`` default; else, when the
Dockerfile mentions max_jobs at all, the machine's vCPU count (vLLM's setup.py uses every CPU: 32 on
E2_HIGHCPU_32). A Dockerfile that never mentions it has no compile phase. Output follows the classic builder
("Step 2/7 : RUN ...") or BuildKit ("#5 [base 2/3] RUN ...") as the step's settings choose.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path

from sandbox.control.cloudbuild.dockerfile import (
    Dockerfile,
    DockerfileError,
    Instruction,
    Stage,
    arg_declarations,
    env_assignments,
    expand,
    parse_dockerfile,
)
from sandbox.control.cloudbuild.image_config import (
    SCRIPT_LIMIT_BYTES,
    ImageConfig,
    command_words,
    copy_destinations,
)
from sandbox.control.cloudbuild.image_env import (
    EnvRecipe,
    EnvStep,
    ImageEnvironmentError,
    chain_of,
    env_step,
    is_prefect_base,
    python_base,
)
from sandbox.control.cloudbuild.workspace import DockerIgnore, Workspace, normalize

BUILDKIT_HINT = "Refer to https://docs.docker.com/go/buildkit/ to learn how to build images with BuildKit enabled"
# Builder images whose entrypoint is the docker CLI.
DOCKER_BUILDER = re.compile(
    r"^(?:(?:[a-z0-9.-]+/)*cloud-builders/docker|docker(?:\.io/library/docker)?|docker)(?::[\w.-]+)?(?:@sha256:[0-9a-f]{64})?$"
)
# docker build flags that take a value (the rest are switches).
# fmt: off
VALUE_FLAGS = frozenset({
    "--add-host", "--allow", "--annotation", "--attest", "--build-arg", "--build-context", "--builder", "-c",
    "--cache-from", "--cache-to", "--cgroup-parent", "--cpu-period", "--cpu-quota", "--cpu-shares", "--cpuset-cpus",
    "--cpuset-mems", "-f", "--file", "--iidfile", "--isolation", "--label", "-m", "--memory", "--memory-swap",
    "--metadata-file", "--network", "-o", "--output", "--platform", "--progress", "--provenance", "--sbom",
    "--secret", "--security-opt", "--shm-size", "--ssh", "-t", "--tag", "--target", "--ulimit",
})
# fmt: on
# RUN/COPY/ADD flags only BuildKit knows; the classic builder refuses them when it reaches the instruction.
BUILDKIT_ONLY_FLAGS = {"RUN": None, "COPY": {"chmod", "link", "parents", "exclude"}, "ADD": {"chmod", "link"}}
INSTALL_RUN = re.compile(
    r"setup\.py|bdist_wheel|\buv\s+build\b|python3?\s+-m\s+build\b|\bpip3?\s+wheel\b|\bpoetry\s+install\b|"
    r"\buv\s+sync\b|\b(?:uv\s+)?pip3?\s+install\b[^&|;]*?(?:\s-e)?\s\.(?:\[|/|\s|$)",
    re.IGNORECASE,
)
COMPILE_RUN = re.compile(
    # A tool named in an install line ("pip install cmake ninja") is not a compile: only invocations count.
    INSTALL_RUN.pattern + r"|\bcmake\s+(?:--build|-S|-B|\.)|(?<![\w-])ninja\s+-[Cj]|\bmake\s+-j|\bnvcc\b|max_jobs",
    re.IGNORECASE,
)
SCM_MARKER = re.compile(r"setuptools[_-]scm", re.IGNORECASE)
SCM_PRETEND = "SETUPTOOLS_SCM_PRETEND_VERSION"
MENTIONS_MAX_JOBS = re.compile(r"max_jobs", re.IGNORECASE)
INLINE_MAX_JOBS = re.compile(r"\bMAX_JOBS=(\S+)")
# fmt: off
PROXY_ARGS = frozenset({
    "FTP_PROXY", "all_proxy", "ALL_PROXY", "https_proxy", "http_proxy", "ftp_proxy", "no_proxy", "NO_PROXY",
    "HTTP_PROXY", "HTTPS_PROXY",
})
# fmt: on
PLATFORM_ARGS = {
    "TARGETPLATFORM": "linux/amd64",
    "TARGETOS": "linux",
    "TARGETARCH": "amd64",
    "TARGETVARIANT": "",
    "BUILDPLATFORM": "linux/amd64",
    "BUILDOS": "linux",
    "BUILDARCH": "amd64",
    "BUILDVARIANT": "",
}
TRUE_VALUES = {"1", "t", "true", "yes", "on"}


@dataclass(frozen=True)
class Machine:
    """A Cloud Build machine type (FACTS.md): what the compile's jobs share."""

    name: str
    vcpus: int
    ram_gb: float


MACHINES = {
    "UNSPECIFIED": Machine("e2-standard-2 (default)", 2, 8),
    "E2_STANDARD_2": Machine("e2-standard-2", 2, 8),
    "E2_HIGHCPU_8": Machine("e2-highcpu-8", 8, 8),
    "E2_HIGHCPU_32": Machine("e2-highcpu-32", 32, 32),
    "E2_MEDIUM": Machine("e2-medium", 1, 4),
    # Legacy N1 types are still accepted by the API (n1-highcpu: 0.9 GB per vCPU).
    "N1_HIGHCPU_8": Machine("n1-highcpu-8", 8, 7.2),
    "N1_HIGHCPU_32": Machine("n1-highcpu-32", 32, 28.8),
}


def is_docker_builder(name: str, entrypoint: str) -> bool:
    """Whether a step runs the docker CLI: the docker builder image with its own entrypoint."""
    return bool(DOCKER_BUILDER.match(name.strip())) and entrypoint in ("", "docker")


def buildkit_enabled(env: dict[str, str]) -> bool:
    return env.get("DOCKER_BUILDKIT", "").strip().lower() in TRUE_VALUES


# Image references -----------------------------------------------------------------------------------------------
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
PATH_PATTERN = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
TAG_PATTERN = re.compile(r"^[\w][\w.-]{0,127}$")


def check_reference(ref: str) -> str | None:
    """docker's error for an unusable image reference, or None when it is fine."""
    name, _, digest = ref.partition("@")
    tag = ""
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name, _, tag = name.rpartition(":")
    parts = name.split("/")
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        parts = parts[1:]
    path = "/".join(parts)
    if not path:
        return "invalid reference format"
    if path != path.lower() and PATH_PATTERN.match(path.lower()):
        return "invalid reference format: repository name must be lowercase"
    if not PATH_PATTERN.match(path) or (tag and not TAG_PATTERN.match(tag)):
        return "invalid reference format"
    if digest and not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        return "invalid reference format"
    return None


def normalize_reference(ref: str) -> str:
    """``name`` -> ``name:latest``; a reference with a tag or digest stays as it is."""
    ref = ref.strip()
    if "@" in ref:
        return ref
    last = ref.rsplit("/", 1)[-1]
    return ref if ":" in last else f"{ref}:latest"


def repository_of(ref: str) -> str:
    """The reference without its tag and digest: what ``The push refers to repository [...]`` prints."""
    name = ref.partition("@")[0]
    last = name.rsplit("/", 1)[-1]
    return name.rpartition(":")[0] if ":" in last else name


# CLI ------------------------------------------------------------------------------------------------------------
@dataclass
class DockerCommand:
    """One docker CLI invocation. ``buildx`` forces BuildKit (``docker buildx build``)."""

    subcommand: str
    args: list[str]
    buildx: bool = False


def parse_command(args: list[str]) -> DockerCommand:
    args = list(args)
    # Global options before the subcommand (rare in builds): skip the ones with values.
    while args and args[0].startswith("-"):
        head = args.pop(0)
        if head in ("-H", "--host", "--config", "--context", "-c", "-l", "--log-level") and args:
            args.pop(0)
    if not args:
        return DockerCommand("", [])
    if args[0] == "buildx" and len(args) > 1 and args[1] in ("build", "b"):
        return DockerCommand("build", args[2:], buildx=True)
    if args[0] == "image" and len(args) > 1:
        return DockerCommand(args[1], args[2:])
    return DockerCommand(args[0], args[1:])


@dataclass
class BuildCommand:
    """``docker build`` arguments. A build-arg value of None is taken from the step's environment."""

    dockerfile: str | None = None
    target: str | None = None
    build_args: dict[str, str | None] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    context: str | None = None
    error: str | None = None
    exit_code: int = 1


def parse_build(args: list[str]) -> BuildCommand:
    """Parse ``docker build`` options the way the docker CLI (cobra/pflag) does for the ones that matter."""
    command = BuildCommand()
    positional: list[str] = []
    index = 0
    while index < len(args):
        token = args[index]
        index += 1
        if token == "--":
            positional.extend(args[index:])
            break
        if not token.startswith("-") or token == "-":
            positional.append(token)
            continue
        name, eq, value = token.partition("=")
        if not eq and len(token) > 2 and token[1] in "ft" and not token.startswith("--"):
            name, value, eq = token[:2], token[2:], "="  # -tNAME, -fFILE
        if name not in VALUE_FLAGS:
            continue  # a switch (--no-cache, --pull, -q, ...)
        if not eq:
            if index >= len(args):
                short = name.lstrip("-")
                command.error = f"flag needs an argument: {'-' if len(short) == 1 else '--'}{short}"
                command.exit_code = 125
                return command
            value = args[index]
            index += 1
        if name in ("-f", "--file"):
            command.dockerfile = value
        elif name in ("-t", "--tag"):
            problem = check_reference(value)
            if problem:
                command.error = f'invalid argument "{value}" for "-t, --tag" flag: {problem}'
                command.exit_code = 125
                return command
            command.tags.append(value)
        elif name == "--target":
            command.target = value
        elif name == "--build-arg":
            key, has_value, arg_value = value.partition("=")
            command.build_args[key] = arg_value if has_value else None
    if len(positional) != 1:
        command.error = (
            "\"docker build\" requires exactly 1 argument.\nSee 'docker build --help'.\n\n"
            "Usage:  docker build [OPTIONS] PATH | URL | -\n\nBuild an image from a Dockerfile"
        )
        return command
    command.context = positional[0]
    return command


# Simulation -----------------------------------------------------------------------------------------------------
@dataclass
class BuildRequest:
    """Everything one ``docker build`` step sees."""

    command: BuildCommand
    workspace: Workspace
    step_dir: str
    env: dict[str, str]
    buildkit: bool
    machine: Machine
    memory_per_job_gb: float
    build_seconds: float
    image_home: str = ""  # where built images' Python environments live (image_env.py); "" keeps none


@dataclass
class StepOutcome:
    """What a step did: its status, exit code, output lines (without the ``Step #N:`` prefix) and duration.

    ``status`` is a Build.Status name; ``images`` maps each normalized ``-t`` reference to the built digest.
    """

    status: str
    exit_code: int
    lines: list[str]
    seconds: float
    images: dict[str, str] = field(default_factory=dict)
    jobs: int | None = None
    config: ImageConfig | None = None  # what the built image runs (image_config.py); None when nothing was built


def simulate_build(request: BuildRequest) -> StepOutcome:
    """Run the checks of one ``docker build`` and return its outcome and output."""
    return _Simulation(request).run()


class _Simulation:
    def __init__(self, request: BuildRequest) -> None:
        self.request = request
        self.command = request.command
        self.ws = request.workspace
        self.seconds = max(request.build_seconds, 1.0)
        self.out = _BuildKitOutput() if request.buildkit else _ClassicOutput()

    def fail(self, lines: list[str], seconds: float = 1.0, exit_code: int = 1, status: str = "FAILURE") -> StepOutcome:
        return StepOutcome(status, exit_code, lines, seconds)

    def run(self) -> StepOutcome:
        command = self.command
        if command.error or command.context is None:
            return self.fail((command.error or "").splitlines(), exit_code=command.exit_code)
        context = normalize(posixpath.join(self.request.step_dir, command.context))
        if not self.ws.is_dir(context):
            return self.fail([f'unable to prepare context: path "{command.context}" not found'])
        if command.dockerfile:
            dockerfile_path = normalize(posixpath.join(self.request.step_dir, command.dockerfile))
        else:
            dockerfile_path = posixpath.join(context, "Dockerfile") if context else "Dockerfile"
        shown = command.dockerfile or "Dockerfile"
        if not self.ws.is_file(dockerfile_path):
            return self.fail(self.out.missing_dockerfile(dockerfile_path, posixpath.basename(shown)))
        text = (self.ws.read(dockerfile_path) or b"").decode("utf-8", "replace")
        header = self.out.header(posixpath.basename(dockerfile_path), len(text.encode()), self.ws.size_under(context))
        try:
            dockerfile = parse_dockerfile(text, heredocs=self.request.buildkit)
        except DockerfileError as exc:
            return self.fail(header + self.out.parse_error(posixpath.basename(shown), text, exc))
        target = dockerfile.stages[-1]
        if command.target:
            found = next((s for s in dockerfile.stages if s.name == command.target.lower()), None)
            if found is None:
                return self.fail(header + self.out.missing_target(command.target))
            target = found
        ignore = DockerIgnore(
            (self.ws.read(posixpath.join(context, ".dockerignore")) or b"").decode("utf-8", "replace")
        )
        return _StageWalk(self, dockerfile, target, context, ignore, header).run()


class _StageWalk:
    """Builds the stages a target needs, instruction by instruction, until one fails or all are done."""

    def __init__(
        self,
        sim: _Simulation,
        dockerfile: Dockerfile,
        target: Stage,
        context: str,
        ignore: DockerIgnore,
        header: list[str],
    ) -> None:
        self.sim = sim
        self.request = sim.request
        self.dockerfile = dockerfile
        self.target = target
        self.context = context
        self.ignore = ignore
        self.out = sim.out
        self.lines: list[str] = list(header)
        self.build_args = {
            k: (v if v is not None else self.request.env.get(k)) for k, v in self.request.command.build_args.items()
        }
        self.meta = self._meta_values()
        self.stages = self._stages_to_build()
        self.total = sum(1 + len(s.instructions) for s in self.stages)
        self.mentions_max_jobs = bool(MENTIONS_MAX_JOBS.search("\n".join(dockerfile.lines)))
        self.declared = {name for inst in dockerfile.meta_args for name, _ in arg_declarations(inst)}
        # The stages the image is made of, its external base, and that base's Python (image_env.py).
        self.chain, self.base = chain_of(dockerfile, target, self.meta)
        self.python = python_base(self.base)
        self.env_steps: list[EnvStep] = []
        for stage in self.stages:
            for inst in stage.instructions:
                if inst.keyword == "ARG":
                    self.declared.update(name for name, _ in arg_declarations(inst))

    # Which stages, and where the special RUNs are --------------------------------------------------------------
    def _stages_to_build(self) -> list[Stage]:
        stages = self.dockerfile.stages
        if not self.request.buildkit:
            # The classic builder builds every stage up to the target, needed or not.
            return stages[: self.target.index + 1]
        needed: set[int] = set()
        pending = [self.target]
        while pending:
            stage = pending.pop()
            if stage.index in needed:
                continue
            needed.add(stage.index)
            refs = [stage.base]
            for inst in stage.instructions:
                if inst.keyword in ("COPY", "ADD") and inst.flag("from"):
                    refs.append(inst.flag("from") or "")
                if inst.keyword == "RUN":
                    for _, mount in ((k, v) for k, v in inst.flags if k == "mount"):
                        found = re.search(r"(?:^|,)from=([^,]+)", mount)
                        if found:
                            refs.append(found[1])
            for ref in refs:
                dep = self.dockerfile.stage(expand(ref, self.meta))
                if dep is not None and dep.index < stage.index:
                    pending.append(dep)
        return [s for s in stages if s.index in needed]

    def _meta_values(self) -> dict[str, str | None]:
        # BuildKit sets the platform ARGs itself; the classic builder leaves them empty.
        values: dict[str, str | None] = dict(PLATFORM_ARGS) if self.request.buildkit else {}
        for inst in self.dockerfile.meta_args:
            for name, default in arg_declarations(inst):
                if name in self.build_args:
                    values[name] = self.build_args[name]
                elif default is not None:
                    values[name] = expand(default, values)
                else:
                    values.setdefault(name, None)
        return values

    def _runs(self) -> list[tuple[Stage, int, Instruction]]:
        return [(s, i, inst) for s in self.stages for i, inst in enumerate(s.instructions) if inst.keyword == "RUN"]

    def _copies_context(self, inst: Instruction) -> bool:
        if inst.keyword not in ("COPY", "ADD") or inst.flag("from"):
            return False
        sources = _copy_sources(inst)[:-1]
        return any(normalize(src) == "" for src in sources)

    def _special_runs(self) -> tuple[Instruction | None, Instruction | None]:
        """The RUN that installs the project (setuptools-scm runs there) and the RUN that compiles."""
        runs = self._runs()
        if not runs:
            return None, None
        copied: dict[int, bool] = {}
        install_after_copy = None
        for stage in self.stages:
            base = self.dockerfile.stage(expand(stage.base, self.meta))
            has_copy = copied.get(base.index, False) if base is not None else False
            for inst in stage.instructions:
                has_copy = has_copy or self._copies_context(inst)
                if install_after_copy is None and has_copy and inst.keyword == "RUN" and INSTALL_RUN.search(inst.value):
                    install_after_copy = inst
            copied[stage.index] = has_copy
        install = install_after_copy or next((r for _, _, r in runs if INSTALL_RUN.search(r.value)), runs[-1][2])
        compile_run = None
        if self.mentions_max_jobs:
            compile_run = next((r for _, _, r in runs if COMPILE_RUN.search(r.value)), runs[-1][2])
        return install, compile_run

    # Checks ------------------------------------------------------------------------------------------------------
    def _scm_failure(self) -> bool:
        project = False
        for name in ("pyproject.toml", "setup.py", "setup.cfg"):
            content = self.sim.ws.read(posixpath.join(self.context, name))
            if content and SCM_MARKER.search(content.decode("utf-8", "replace")):
                project = True
        if not project:
            return False
        has_git = self.sim.ws.is_dir(posixpath.join(self.context, ".git")) and not self.ignore.ignored(".git")
        pretend = SCM_PRETEND in "\n".join(self.dockerfile.lines) or any(
            k.startswith(SCM_PRETEND) and k in self.declared for k in self.build_args
        )
        return not has_git and not pretend

    def _jobs(self, run: Instruction, variables: dict[str, str | None]) -> int:
        """The compile's parallel jobs: see the module docstring for the order of the sources."""
        inline = INLINE_MAX_JOBS.search(run.value)
        for candidate in (expand(inline[1], variables) if inline else None, variables.get("MAX_JOBS")):
            if candidate and candidate.strip().isdigit() and int(candidate) > 0:
                return int(candidate)
        for name in ("max_jobs", "MAX_JOBS"):
            value = self.build_args.get(name)
            if name in self.declared and value and value.strip().isdigit() and int(value) > 0:
                return int(value)
        for inst in [*self.dockerfile.meta_args, *(i for s in self.dockerfile.stages for i in s.instructions)]:
            if inst.keyword == "ARG":
                for name, default in arg_declarations(inst):
                    if name in ("max_jobs", "MAX_JOBS") and default and default.isdigit() and int(default) > 0:
                        return int(default)
        return self.request.machine.vcpus

    def _missing_copy_source(self, inst: Instruction, variables: dict[str, str | None]) -> str | None:
        if inst.keyword not in ("COPY", "ADD") or inst.flag("from") or "<<" in inst.value:
            return None
        files = [f for f in self.sim.ws.files_under(self.context) if not self.ignore.ignored(f)]
        for raw in _copy_sources(inst)[:-1]:
            if "$" in raw:
                raw = expand(raw, variables)
            if inst.keyword == "ADD" and re.match(r"^[a-z]+://", raw):
                continue
            src = normalize(raw)
            if not src:
                continue
            if any(c in src for c in "*?["):
                pattern = re.compile(_glob(src))
                if not any(pattern.fullmatch(f) or pattern.fullmatch(posixpath.dirname(f)) for f in files):
                    return raw
                continue
            exists = any(f == src or f.startswith(src + "/") for f in files)
            if not exists:
                return raw
        return None

    # The walk ----------------------------------------------------------------------------------------------------
    def run(self) -> StepOutcome:
        install_run, compile_run = self._special_runs()
        scm_fails = self._scm_failure()
        memory = self.request.memory_per_job_gb
        env_by_stage: dict[int, dict[str, str | None]] = {}
        workdir_by_stage: dict[int, str] = {}
        # ENTRYPOINT, CMD and the context files each stage holds, inherited by the stages built FROM it.
        run_by_stage: dict[int, tuple[tuple[str, ...] | None, tuple[str, ...] | None, dict[str, str]]] = {}
        step = 0
        jobs_used: int | None = None
        for stage in self.stages:
            base_stage = self.dockerfile.stage(expand(stage.base, self.meta))
            if base_stage is not None and base_stage.index >= stage.index:
                base_stage = None
            env: dict[str, str | None] = dict(env_by_stage.get(base_stage.index, {})) if base_stage else {}
            workdir = workdir_by_stage.get(base_stage.index, "/") if base_stage else "/"
            inherited = run_by_stage.get(base_stage.index) if base_stage else None
            entrypoint, cmd, copied = inherited or (None, None, {})
            copied = dict(copied)
            args: dict[str, str | None] = {}
            step += 1
            self.lines += self.out.instruction(stage, 0, stage.from_instruction, step, self.total)
            for position, inst in enumerate(stage.instructions, start=1):
                step += 1
                variables = {**args, **env}
                if inst.keyword == "ARG":
                    for name, default in arg_declarations(inst):
                        if name in self.build_args:
                            args[name] = self.build_args[name]
                        elif default is not None:
                            args[name] = expand(default, {**args, **env})
                        else:
                            args[name] = self.meta.get(name) if name in self.meta else None
                elif inst.keyword == "ENV":
                    for key, value in env_assignments(inst):
                        env[key] = expand(value, {**args, **env})
                elif inst.keyword == "WORKDIR":
                    workdir = posixpath.normpath(posixpath.join(workdir, expand(inst.value, variables)))
                elif inst.keyword == "ENTRYPOINT":
                    entrypoint = command_words(inst)
                    cmd = () if cmd is None else cmd  # ENTRYPOINT resets a CMD inherited from the base image
                elif inst.keyword == "CMD":
                    cmd = command_words(inst)
                for src, dest in copy_destinations(inst, variables):
                    copied[posixpath.normpath(posixpath.join(workdir, dest))] = src
                buildkit_flag = self._classic_refuses(inst)
                if buildkit_flag:
                    message = f"the --{buildkit_flag} option requires BuildKit. {BUILDKIT_HINT}"
                    self.lines += self.out.instruction_error(stage, position, inst, step, self.total, message)
                    return self._failed(step, 1)
                missing = self._missing_copy_source(inst, variables)
                if missing is not None:
                    self.lines += self.out.copy_missing(stage, position, inst, step, self.total, missing)
                    return self._failed(step, 1)
                if stage.index in self.chain and inst.keyword in ("COPY", "ADD", "RUN") and self.python:
                    try:
                        self.env_steps.append(env_step(inst, variables, workdir, env))
                    except ImageEnvironmentError as exc:
                        if is_prefect_base(self.base):  # a Prefect image's environment is what its jobs run
                            self.lines += self.out.run_failed(stage, position, inst, step, self.total, [exc.message], 1)
                            return self._failed(step, 1)
                        self.python = None  # a python: image the sandbox's build checks use: no environment
                if inst.keyword != "RUN":
                    self.lines += self.out.instruction(stage, position, inst, step, self.total)
                    continue
                output: list[str] = []
                if inst is install_run and scm_fails:
                    output = _scm_traceback(workdir)
                    self.lines += self.out.run_failed(stage, position, inst, step, self.total, output, 1)
                    return self._failed(step, 1)
                if inst is compile_run:
                    jobs = self._jobs(inst, {**args, **env})
                    jobs_used = jobs
                    output = [f"Using MAX_JOBS={jobs} as the number of jobs."]
                    if jobs * memory > self.request.machine.ram_gb:
                        output += _oom_output()
                        self.lines += self.out.run_failed(stage, position, inst, step, self.total, output, 137)
                        outcome = StepOutcome("INTERNAL_ERROR", 137, self.lines, self.sim.seconds * 0.5, jobs=jobs)
                        return outcome
                    output += [
                        "[1/412] Building CXX object CMakeFiles/_C.dir/csrc/cpu/utils.cpp.o",
                        "[412/412] Linking CXX shared module _C.abi3.so",
                    ]
                self.lines += self.out.instruction(stage, position, inst, step, self.total, output)
            env_by_stage[stage.index] = env
            workdir_by_stage[stage.index] = workdir
            run_by_stage[stage.index] = (entrypoint, cmd, copied)
        unused = sorted(
            k for k in self.build_args if k not in self.declared and k not in PROXY_ARGS and k not in PLATFORM_ARGS
        )
        digest = self._digest()
        images = {normalize_reference(tag): digest for tag in self.request.command.tags}
        self.lines += self.out.success(digest, list(self.request.command.tags), unused)
        config = self._config(env_by_stage.get(self.target.index, {}), *run_by_stage[self.target.index])
        config = dataclasses.replace(
            config, workdir=workdir_by_stage.get(self.target.index, "/"), environment=self._recipe(digest)
        )
        return StepOutcome("SUCCESS", 0, self.lines, self.sim.seconds, images, jobs=jobs_used, config=config)

    def _config(
        self,
        env: dict[str, str | None],
        entrypoint: tuple[str, ...] | None,
        cmd: tuple[str, ...] | None,
        copied: dict[str, str],
    ) -> ImageConfig:
        """The built image's config: the target stage's ENTRYPOINT, CMD, ENV and external base image."""
        stage = self.target
        parent = self.dockerfile.stage(expand(stage.base, self.meta))
        while parent is not None and parent.index < stage.index:
            stage, parent = parent, self.dockerfile.stage(expand(parent.base, self.meta))
        files: dict[str, str] = {}
        if entrypoint and entrypoint[0] in copied:
            # A script from the build context: keep its text so the container can run it as the image would.
            data = self.sim.ws.read(posixpath.join(self.context, normalize(copied[entrypoint[0]])))
            if data is not None and len(data) <= SCRIPT_LIMIT_BYTES:
                files[entrypoint[0]] = data.decode("utf-8", "replace")
        return ImageConfig(
            base=expand(stage.base, self.meta),
            entrypoint=entrypoint,
            cmd=cmd,
            env={k: v for k, v in env.items() if v is not None},
            files=files,
        )

    def _recipe(self, digest: str) -> EnvRecipe | None:
        """How to make the image's Python environment (image_env.py); the source archive is kept for it."""
        if not self.python or not self.request.image_home:
            return None
        key = digest.removeprefix("sha256:")
        archive = Path(self.request.image_home) / f"{key[:32]}.source"
        if not archive.is_file():
            archive.parent.mkdir(parents=True, exist_ok=True)
            archive.write_bytes(self.sim.ws.archive)
        ignore = (self.sim.ws.read(posixpath.join(self.context, ".dockerignore")) or b"").decode("utf-8", "replace")
        version, requirements = self.python
        return EnvRecipe(key, self.base, version, requirements, tuple(self.env_steps), str(archive), self.context,
                         ignore, self.request.image_home)  # fmt: skip

    def _classic_refuses(self, inst: Instruction) -> str | None:
        if self.request.buildkit or inst.keyword not in BUILDKIT_ONLY_FLAGS or not inst.flags:
            return None
        allowed_only_in_buildkit = BUILDKIT_ONLY_FLAGS[inst.keyword]
        for name, _ in inst.flags:
            if allowed_only_in_buildkit is None or name in allowed_only_in_buildkit:
                return name
        return None

    def _failed(self, step: int, exit_code: int) -> StepOutcome:
        progress = step / max(self.total, 1)
        return StepOutcome("FAILURE", exit_code, self.lines, max(1.0, self.sim.seconds * 0.5 * progress))

    def _digest(self) -> str:
        """A deterministic manifest digest: the same inputs give the same image, as a reproducible build would."""
        text = "\n".join(self.dockerfile.lines)
        inputs = {
            "dockerfile": hashlib.sha256(text.encode()).hexdigest(),
            "target": self.target.label,
            "build_args": {k: v for k, v in sorted(self.build_args.items()) if k in self.declared},
            "context": self.sim.ws.digest_under(self.context, self.ignore),
        }
        return "sha256:" + hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def _copy_sources(inst: Instruction) -> list[str]:
    value = inst.value.strip()
    if value.startswith("["):
        try:
            parsed = json.loads(value)
            if isinstance(parsed, list):
                return [str(p) for p in parsed]
        except ValueError:
            pass
    return value.split()


def _glob(pattern: str) -> str:
    return "".join("[^/]*" if c == "*" else "[^/]" if c == "?" else c if c in "[]" else re.escape(c) for c in pattern)


def _scm_traceback(workdir: str) -> list[str]:
    return [
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3/dist-packages/setuptools_scm/_get_version_impl.py", line 178, in _get_version',
        "    _version_missing(config)",
        "LookupError: setuptools-scm was unable to detect version for " + workdir + ".",
        "",
        "Make sure you're either building from a fully intact git repository or PyPI tarballs. Most other sources "
        "(such as GitHub's tarballs, a git checkout without the .git folder) don't contain the necessary metadata "
        "and will not work.",
        "",
        "For example, if you're using pip, instead of https://github.com/user/proj/archive/master.zip use "
        "git+https://github.com/user/proj.git#egg=proj",
    ]


def _oom_output() -> list[str]:
    return [
        "[57/412] Building CXX object CMakeFiles/_C.dir/csrc/cpu/attention.cpp.o",
        "FAILED: CMakeFiles/_C.dir/csrc/cpu/attention.cpp.o",
        "c++: fatal error: Killed signal terminated program cc1plus",
        "compilation terminated.",
        "ninja: build stopped: subcommand failed.",
    ]


def oom_killed_output() -> list[str]:
    """A docker build whose compile RUN is OOM-killed and fails (BuildKit output): the forced OOM_KILLED outcome."""
    message = 'process "/bin/sh -c python3 setup.py bdist_wheel --dist-dir=dist" did not complete successfully'
    return [
        "Using MAX_JOBS=32 as the number of jobs.",
        *_oom_output(),
        f"ERROR: failed to solve: {message}: exit code: 137",
    ]


def _human(size: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.4g}{unit}"
    return f"{size}B"


def _fake_id(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()


def _shell(inst: Instruction) -> str:
    value = inst.value.strip()
    if value.startswith("["):
        try:
            return " ".join(json.loads(value))
        except ValueError:
            pass
    return f"/bin/sh -c {value}"


class _ClassicOutput:
    """What the classic builder prints (``DOCKER_BUILDKIT`` unset)."""

    def header(self, _dockerfile: str, _size: int, context_size: int) -> list[str]:
        return [f"Sending build context to Docker daemon  {_human(context_size)}", ""]

    def missing_dockerfile(self, path: str, _shown: str) -> list[str]:
        return [
            "unable to prepare context: unable to evaluate symlinks in Dockerfile path: "
            f"lstat /workspace/{path}: no such file or directory"
        ]

    def parse_error(self, shown: str, _text: str, error: DockerfileError) -> list[str]:
        if error.message == "file with no instructions":
            return [f"Error response from daemon: the Dockerfile ({shown}) cannot be empty"]
        return [f"Error response from daemon: {error.docker_message()}"]

    def missing_target(self, target: str) -> list[str]:
        return [f"Error response from daemon: failed to reach build target {target} in Dockerfile"]

    def _step(self, inst: Instruction, step: int, total: int) -> str:
        return f"Step {step}/{total} : {inst.text}"

    def instruction(
        self, _stage: Stage, _position: int, inst: Instruction, step: int, total: int, output: list[str] = ()
    ) -> list[str]:
        layer = _fake_id(inst.line, inst.text)
        if inst.keyword == "FROM":
            return [self._step(inst, step, total), f" ---> {layer[:12]}"]
        container = _fake_id("container", inst.line, inst.text)[:12]
        return [
            self._step(inst, step, total),
            f" ---> Running in {container}",
            *output,
            f"Removing intermediate container {container}",
            f" ---> {layer[:12]}",
        ]

    def instruction_error(
        self, _stage: Stage, _position: int, inst: Instruction, step: int, total: int, message: str
    ) -> list[str]:
        return [self._step(inst, step, total), message]

    def copy_missing(
        self, _stage: Stage, _position: int, inst: Instruction, step: int, total: int, src: str
    ) -> list[str]:
        return [
            self._step(inst, step, total),
            f"{inst.keyword} failed: file not found in build context or excluded by .dockerignore: stat {src}: file "
            "does not exist",
        ]

    def run_failed(
        self, _stage: Stage, _position: int, inst: Instruction, step: int, total: int, output: list[str], code: int
    ) -> list[str]:
        container = _fake_id("container", inst.line, inst.text)[:12]
        return [
            self._step(inst, step, total),
            f" ---> Running in {container}",
            *output,
            f"The command '{_shell(inst)}' returned a non-zero code: {code}",
        ]

    def success(self, digest: str, tags: list[str], unused: list[str]) -> list[str]:
        lines = [f"[Warning] One or more build-args [{' '.join(unused)}] were not consumed"] if unused else []
        lines.append(f"Successfully built {_fake_id('image', digest)[:12]}")
        return lines + [f"Successfully tagged {normalize_reference(t)}" for t in tags]


class _BuildKitOutput:
    """What BuildKit prints with plain progress, as Cloud Build's log shows it."""

    def __init__(self) -> None:
        self.vertex = 0

    def _next(self) -> int:
        self.vertex += 1
        return self.vertex

    def header(self, dockerfile: str, size: int, context_size: int) -> list[str]:
        load, ignore, context = self._next(), self._next(), self._next()
        return [
            '#0 building with "default" instance using docker driver',
            "",
            f"#{load} [internal] load build definition from {dockerfile}",
            f"#{load} transferring dockerfile: {size}B done",
            f"#{load} DONE 0.0s",
            "",
            f"#{ignore} [internal] load .dockerignore",
            f"#{ignore} transferring context: 2B done",
            f"#{ignore} DONE 0.0s",
            "",
            f"#{context} [internal] load build context",
            f"#{context} transferring context: {_human(context_size)} done",
            f"#{context} DONE 0.1s",
            "",
        ]

    def missing_dockerfile(self, _path: str, shown: str) -> list[str]:
        load = self._next()
        return [
            '#0 building with "default" instance using docker driver',
            "",
            f"#{load} [internal] load build definition from {shown}",
            f"#{load} transferring dockerfile: 2B done",
            f"#{load} DONE 0.0s",
            f"ERROR: failed to solve: failed to read dockerfile: open {shown}: no such file or directory",
        ]

    def parse_error(self, shown: str, text: str, error: DockerfileError) -> list[str]:
        lines = []
        if error.line:
            source = text.splitlines()
            first = max(1, error.line - 2)
            lines += [f"{shown}:{error.line}", "--------------------"]
            for number in range(first, min(error.line, len(source)) + 1):
                marker = ">>>" if number == error.line else "   "
                lines.append(f"{number:>4} | {marker} {source[number - 1]}")
            lines.append("--------------------")
        return [*lines, f"ERROR: failed to solve: {error.docker_message()}"]

    def missing_target(self, target: str) -> list[str]:
        return [f'ERROR: failed to solve: target stage "{target}" could not be found']

    def _title(self, stage: Stage, position: int, inst: Instruction) -> str:
        return f"[{stage.label} {position + 1}/{len(stage.instructions) + 1}] {inst.text.splitlines()[0]}"

    def instruction(
        self, stage: Stage, position: int, inst: Instruction, _step: int, _total: int, output: list[str] = ()
    ) -> list[str]:
        vertex = self._next()
        lines = [f"#{vertex} {self._title(stage, position, inst)}"]
        lines += [f"#{vertex} {0.5 + i * 0.1:.3f} {line}" for i, line in enumerate(output)]
        return [*lines, f"#{vertex} DONE {1.0 + len(output) * 0.1:.1f}s", ""]

    def instruction_error(
        self, stage: Stage, position: int, inst: Instruction, _step: int, _total: int, message: str
    ) -> list[str]:
        return [f"ERROR: failed to solve: {message}"]

    def copy_missing(
        self, stage: Stage, position: int, inst: Instruction, _step: int, _total: int, src: str
    ) -> list[str]:
        vertex = self._next()
        title = self._title(stage, position, inst)
        message = f'failed to compute cache key: failed to calculate checksum of ref: "/{normalize(src)}": not found'
        return [
            f"#{vertex} {title}",
            f"#{vertex} ERROR: {message}",
            "------",
            f" > {title}:",
            "------",
            f"ERROR: failed to solve: {message}",
        ]

    def run_failed(
        self, stage: Stage, position: int, inst: Instruction, _step: int, _total: int, output: list[str], code: int
    ) -> list[str]:
        vertex = self._next()
        title = self._title(stage, position, inst)
        message = f'process "{_shell(inst)}" did not complete successfully: exit code: {code}'
        timed = [f"{0.5 + i * 0.1:.3f} {line}" for i, line in enumerate(output)]
        return [
            f"#{vertex} {title}",
            *(f"#{vertex} {line}" for line in timed),
            f"#{vertex} ERROR: {message}",
            "------",
            f" > {title}:",
            *timed[-10:],
            "------",
            f"ERROR: failed to solve: {message}",
        ]

    def success(self, digest: str, tags: list[str], _unused: list[str]) -> list[str]:
        vertex = self._next()
        return [
            f"#{vertex} exporting to image",
            f"#{vertex} exporting layers done",
            f"#{vertex} writing image sha256:{_fake_id('image', digest)} done",
            *(f"#{vertex} naming to {normalize_reference(t)} done" for t in tags),
            f"#{vertex} DONE 0.1s",
        ]
