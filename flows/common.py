"""What the flows share: loading blocks by name, model spec files, the per-service lock, events."""

from __future__ import annotations

import contextlib
import inspect
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

import yaml
from prefect.blocks.core import Block
from prefect.events import emit_event
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from blocks.images import ImageBuild
from blocks.profile import PRESETS, ServingProfile
from blocks.target import GcpTarget
from flows.service_lock import ServiceLock, held
from flows.service_lock import service_lock_name as lock_name
from tasks.deploy.rollout import Rollout
from tasks.quality.spec import QualitySpec
from tasks.report.schedules import WarmHours
from tasks.watch.canary import WatchOptions, check_canary

M = TypeVar("M", bound=BaseModel)
B = TypeVar("B", bound=Block)
# The GcpTarget block a run uses when none is named: the one `python -m flows.bootstrap gcp` saves by default.
DEFAULT_TARGET = "production"


class ModelSpec(BaseModel):
    """A model file in deployments/: the promote-model parameters it may give. Unknown keys are refused at every
    depth (``build:`` and ``schedule:`` too), so a misspelt key is an error rather than a silently ignored setting."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    revision: str | None = None
    profile: str | None = None
    target: str | None = None
    service: str | None = None
    token_secret_block: str | None = None
    hub_endpoint: str | None = None
    allow_patterns: list[str] | None = None
    ignore_patterns: list[str] | None = None
    image: str | None = None
    build: ImageBuild | None = None
    load_mode: str | None = None
    schedule: WarmHours | None = None
    canary: list[int] | None = None
    rollout: Rollout | None = None
    watch: WatchOptions | None = None
    metrics: Literal["none", "vllm"] | None = None  # the profile's metrics sidecar choice, for this model
    quality: QualitySpec | None = None  # the quality set the candidate must answer (tasks/quality)

    @field_validator("canary")
    @classmethod
    def _canary(cls, value: list[int] | None) -> list[int] | None:
        return check_canary(value) if value is not None else None


SPEC_KEYS = set(ModelSpec.model_fields)


def field_path(loc: tuple[int | str, ...], prefix: str = "") -> str:
    """pydantic's error location as the path a user writes: ``vllm.max_model_len``, ``allow_patterns[0]``."""
    path = prefix
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path = f"{path}.{part}" if path else str(part)
    return path


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds (``ImageBuild | None`` -> ImageBuild), if any."""
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for m in map(_model_in, get_args(annotation)) if m is not None), None)


def _keys_at(model: type[BaseModel] | None, loc: tuple[int | str, ...]) -> list[str]:
    """The keys allowed at ``loc`` inside ``model`` (empty when the path leads somewhere not a model)."""
    for part in loc:
        field = model.model_fields.get(part) if model is not None and isinstance(part, str) else None
        model = _model_in(field.annotation) if field is not None else None
    return sorted(model.model_fields) if model is not None else []


def _problem(error: Any, prefix: str, model: type[BaseModel] | None) -> str:
    loc = tuple(error["loc"])
    path = field_path(loc, prefix)
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        allowed = _keys_at(model, loc[:-1])
        fix = f"; allowed: {allowed}" if allowed else "; remove it"
        return f"{path}: unknown key '{loc[-1]}'{fix}"
    leaf = next((str(part) for part in reversed(loc) if isinstance(part, str)), "")
    if not path or (error["type"] == "value_error" and leaf and leaf in message):
        return message  # our own validators' messages already name the field and the fix
    return f"{path}: {message}"


def _problems(exc: ValidationError, prefix: str = "", model: type[BaseModel] | None = None) -> str:
    """One line per problem, each led by the field's full path (``vllm.max_model_len``, ``schedule.warm_from``),
    without pydantic's framing or the input (it may hold a pasted token)."""
    return "; ".join(_problem(error, prefix, model) for error in exc.errors(include_input=False))


def validated(model: type[M], data: dict, prefix: str = "") -> M:
    """``model`` from ``data``, or a ValueError naming each bad field by its path under ``prefix``."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ValueError(_problems(exc, prefix, model)) from None


def _load_block(block: type[B], field: str, name: str, missing: str) -> B:
    """A saved block by name; one whose values its own checks refuse says which field and what to set (not Prefect's
    `validate=False` advice), and a missing one says ``missing``."""
    try:
        loaded = block.load(name)
    except (ValueError, RuntimeError) as exc:
        if isinstance(exc.__cause__, ValidationError):
            raise ValueError(
                f"{field}: the saved {block.__name__} block '{name}' is not valid: "
                f"{_problems(exc.__cause__, model=block)}. Fix it in the UI"
            ) from None
        raise ValueError(missing) from None
    # Blocks accept unknown keys (Prefect's models allow extras): a key misspelt in the UI's JSON editor would be
    # ignored silently, and the setting the user meant would not apply.
    unknown = sorted(loaded.model_extra or {})
    if unknown:
        problems = "; ".join(f"{key}: unknown key '{key}'" for key in unknown)
        raise ValueError(
            f"{field}: the saved {block.__name__} block '{name}' is not valid: {problems}; allowed: "
            f"{sorted(block.model_fields)}. Fix it in the UI"
        )
    return loaded


def load_target(name: str) -> GcpTarget:
    """The GcpTarget block saved under ``name`` (``python -m flows.bootstrap`` creates them)."""
    return _load_block(
        GcpTarget, "target", name,
        f"target: no GcpTarget block named '{name}'; create it with `python -m flows.bootstrap` (a sandbox's: "
        "`python -m sandbox blocks`) or in the UI",
    )  # fmt: skip


def load_profile(
    name: str, image: str | None = None, load_mode: str | None = None, build: dict | ImageBuild | None = None
) -> ServingProfile:
    """A preset (l4, rtx-pro-6000, cpu) or a saved ServingProfile block, with the run's overrides: the image
    strategy (a pinned ``image``, or a ``build``) and the load mode."""
    if image and build:
        raise ValueError("image and build: give one image strategy, a pinned image or how to build one, not both")
    overrides: dict = {}
    if image:
        overrides.update({"image": image, "build": None})
    if build:
        overrides.update({"image": None, "build": build})
    if load_mode:
        overrides["load_mode"] = load_mode
    if name in PRESETS:
        return validated(ServingProfile, {**PRESETS[name], "name": name, **overrides})
    block = _load_block(
        ServingProfile, "profile", name,
        f"profile: '{name}' is neither a preset ({', '.join(PRESETS)}) nor a saved ServingProfile block",
    )  # fmt: skip
    return validated(ServingProfile, {**block.model_dump(), **overrides}) if overrides else block


def read_spec(path: str | None, within: Path | None = None) -> dict:
    """A model's deployment file (model, revision, profile, target, service, ...), checked whole before any use.

    The file must lie inside ``within``: by default the project's deployments/ folder, the project being the folder
    the run works in (the deployments' pull step moves there, flows/project.py). ``spec_file`` is a parameter anyone
    who may start a run can set; it must not read, and echo into errors, any file the worker can reach."""
    if not path:
        return {}
    folder = (within or Path.cwd() / "deployments").resolve()
    file = Path(path).resolve()  # follows symlinks and `..`: where the file really is
    if not file.is_relative_to(folder):
        raise ValueError(
            f"spec_file: {path} is not inside {folder}; give the path of a model file in deployments/, relative to "
            "the project folder (e.g. deployments/gemma-4-e2b.yaml)"
        )
    try:
        data = yaml.safe_load(file.read_text())
    except FileNotFoundError:
        raise ValueError(
            f"spec_file: {path} does not exist; give the path of a model file in deployments/, relative to the "
            "project folder (e.g. deployments/gemma-4-e2b.yaml)"
        ) from None
    except IsADirectoryError:
        raise ValueError(f"spec_file: {path} is a folder; give the path of a model file (.yaml) in it") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ValueError(
            f"spec_file {path}{where}: not valid YAML ({problem}); fix the file there (a value holding ': ' or "
            "' #' needs quotes)"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(
            f"{path}: holds a {type(data).__name__}, not a mapping of keys; write `key: value` lines, e.g. "
            "`model: google/gemma-4-E2B-it`"
        )
    try:
        ModelSpec.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"{path}: {_problems(exc, model=ModelSpec)}") from None
    return data


def service_resource(target: GcpTarget, service_id: str) -> dict[str, str]:
    return {
        "prefect.resource.id": f"gcp.cloudrun.service.{target.project}.{target.region}.{service_id}",
        "prefect.resource.name": service_id,
        "gcp.project": target.project,
        "gcp.region": target.region,
    }


def emit(event: str, target: GcpTarget, service_id: str, payload: dict) -> None:
    """An event about the service, so Prefect automations can notify on promotions and scaling."""
    emit_event(event=event, resource=service_resource(target, service_id), payload=payload)


def service_lock_name(target: GcpTarget, service_id: str) -> str:
    """The global concurrency limit that serializes the runs changing one service (`prefect gcl inspect NAME`)."""
    return lock_name(target.project, target.region, service_id)


def service_lock(
    target: GcpTarget, service_id: str, timeout_s: float = 3600
) -> contextlib.AbstractContextManager[ServiceLock]:
    """Two runs that change one service never interleave; runs for other services are not held up. A renewal that
    fails does not crash the run (flows/service_lock.py): writes to the service are fenced instead."""
    return held(service_lock_name(target, service_id), timeout_s)
