"""What the flows share: loading blocks by name, model spec files, the per-service lock, events."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import yaml
from prefect.blocks.core import Block
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency
from prefect.events import emit_event
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from pydantic import BaseModel, ValidationError

from blocks.images import ImageBuild
from blocks.profile import PRESETS, ServingProfile
from blocks.target import GcpTarget

M = TypeVar("M", bound=BaseModel)
B = TypeVar("B", bound=Block)
LOCK_LEASE_S = 60  # the server accepts no shorter lease
# The GcpTarget block a run uses when none is named: the one `python -m flows.bootstrap gcp` saves by default.
DEFAULT_TARGET = "production"
SPEC_KEYS = {"model", "revision", "profile", "target", "service", "token_secret_block", "hub_endpoint",
             "allow_patterns", "ignore_patterns", "image", "build", "load_mode", "schedule"}  # fmt: skip


def _problems(exc: ValidationError) -> str:
    """The models' own messages (they name the field and the fix), without pydantic's framing or the input (it may
    hold a pasted token)."""
    return "; ".join(error["msg"].removeprefix("Value error, ") for error in exc.errors(include_input=False))


def validated(model: type[M], data: dict) -> M:
    """``model`` from ``data``, or a ValueError with the models' own messages."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ValueError(_problems(exc)) from None


def _load_block(block: type[B], field: str, name: str, missing: str) -> B:
    """A saved block by name; one whose values its own checks refuse says which field and what to set (not Prefect's
    `validate=False` advice), and a missing one says ``missing``."""
    try:
        return block.load(name)
    except (ValueError, RuntimeError) as exc:
        if isinstance(exc.__cause__, ValidationError):
            raise ValueError(
                f"{field}: the saved {block.__name__} block '{name}' is not valid: {_problems(exc.__cause__)}. "
                "Fix it in the UI"
            ) from None
        raise ValueError(missing) from None


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
        return ServingProfile.preset(name, **overrides)
    block = _load_block(
        ServingProfile, "profile", name,
        f"profile: '{name}' is neither a preset ({', '.join(PRESETS)}) nor a saved ServingProfile block",
    )  # fmt: skip
    return ServingProfile.model_validate({**block.model_dump(), **overrides}) if overrides else block


def read_spec(path: str | None) -> dict:
    """A model's deployment file from deployments/ (model, revision, profile, target, service, ...)."""
    if not path:
        return {}
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except FileNotFoundError:
        raise ValueError(
            f"spec_file: {path} does not exist; give the path of a model file in deployments/, relative to the "
            "project folder (e.g. deployments/gemma-4-e2b.yaml)"
        ) from None
    unknown = sorted(set(data) - SPEC_KEYS)
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown}; allowed: {sorted(SPEC_KEYS)}")
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
    return f"cloudrun-service:{target.project}:{target.region}:{service_id}"


@contextmanager
def service_lock(target: GcpTarget, service_id: str, timeout_s: float = 3600) -> Iterator[None]:
    """Two runs that change one service never interleave; runs for other services are not held up."""
    name = service_lock_name(target, service_id)
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            with contextlib.suppress(ObjectAlreadyExists):  # another run created it first: fine
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
    # A short lease, renewed while the run lives: a run killed holding the lock frees it after about a minute,
    # not after the default five.
    with concurrency(name, occupy=1, timeout_seconds=timeout_s, strict=True, lease_duration=LOCK_LEASE_S):
        yield
