"""How a serving image is built with Cloud Build: source, Dockerfile, target, build args, the OOM ladder."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MachineType = Literal["E2_HIGHCPU_8", "E2_HIGHCPU_32", "E2_MEDIUM", "E2_STANDARD_2"]
Recipe = Literal["vllm-cpu", "serve-wrapper"]
VLLM_GIT_URL = "https://github.com/vllm-project/vllm.git"
VLLM_PINNED_REF = "v0.33.0"  # lesson 10: build the Python from the commit its base image was built from
IMAGE_NAME = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$")
BUILD_ARG = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
JOBS_ARGS = ("max_jobs", "MAX_JOBS")


class ImageBuild(BaseModel):
    """A Dockerfile built by Cloud Build into the target's Artifact Registry.

    Give a recipe (``vllm-cpu``: vLLM's docker/Dockerfile.cpu at a pinned tag, seed 000; ``serve-wrapper``: a
    thin image over a vLLM base that serves the model named in env variables, seed 002), or a source: a git
    repository URL at a ref (cloned shallow, keeping .git, lesson 8) or a local folder.
    """

    model_config = ConfigDict(extra="forbid")

    recipe: Recipe | None = Field(None, description="Built-in recipe; its fields can still be overridden.")
    git_url: str | None = Field(None, description="Git repository to build, e.g. vLLM's.")
    git_ref: str | None = Field(None, description="Branch, tag or commit sha of git_url.")
    source_dir: str | None = Field(None, description="Local folder to build instead of a git repository.")
    dockerfile: str = Field("Dockerfile", description="Path of the Dockerfile inside the source.")
    target: str | None = Field(None, description="Build stage (docker build --target).")
    build_args: dict[str, str] = Field(default_factory=dict, description="docker build --build-arg values.")
    image_name: str = Field("vllm", description="Image name inside the Artifact Registry repository.")
    base_image: str | None = Field(None, description="Base image for the serve-wrapper recipe.")
    max_jobs_ladder: list[int] = Field(
        default_factory=lambda: [32, 16, 8, 4],
        description="max_jobs per attempt: a build killed for memory is retried with the next, smaller value "
        "(Cloud Build machines are high-CPU, low-RAM: vLLM's default 32 jobs OOM an E2_HIGHCPU_32, lesson 7).",
    )
    max_jobs_floor: int = Field(4, ge=1, description="Never try fewer compile jobs than this.")
    machine_type: MachineType = Field("E2_HIGHCPU_32", description="Cloud Build machine type.")
    disk_size_gb: int = Field(200, ge=10, le=4000, description="Build disk, GB.")
    timeout_seconds: int = Field(7200, ge=60, le=86400, description="Build timeout (vLLM CPU takes ~56 min).")

    @field_validator("image_name")
    @classmethod
    def _image_name(cls, value: str) -> str:
        if not IMAGE_NAME.match(value):
            raise ValueError(f"build.image_name '{value}' must be lowercase letters, digits and . _ - / separators")
        return value

    @field_validator("build_args")
    @classmethod
    def _build_args(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not BUILD_ARG.match(key):
                raise ValueError(f"build.build_args: '{key}' is not a valid build argument name")
            if key in JOBS_ARGS:
                raise ValueError(f"build.build_args: {key} is set per attempt from max_jobs_ladder; set the ladder")
        return value

    @field_validator("max_jobs_ladder")
    @classmethod
    def _ladder(cls, value: list[int]) -> list[int]:
        if (
            not value
            or any(j < 1 for j in value)
            or value != sorted(value, reverse=True)
            or len(set(value)) != len(value)
        ):
            raise ValueError(f"build.max_jobs_ladder {value} must be distinct positive numbers, largest first")
        return value

    @model_validator(mode="after")
    def _source(self) -> ImageBuild:
        if self.recipe == "vllm-cpu":
            self.git_url = self.git_url or VLLM_GIT_URL
            self.git_ref = self.git_ref or VLLM_PINNED_REF
            if self.dockerfile == "Dockerfile":
                self.dockerfile = "docker/Dockerfile.cpu"
            self.target = self.target or "vllm-openai"
            if self.image_name == "vllm":
                self.image_name = "vllm-cpu"
        elif self.recipe == "serve-wrapper" and self.image_name == "vllm":
            self.image_name = "vllm-serve"
        sources = [s for s in (self.git_url, self.source_dir) if s]
        if self.recipe != "serve-wrapper" and len(sources) != 1:
            raise ValueError("build: give exactly one source, git_url (with git_ref) or source_dir, or a recipe")
        if self.git_url and not self.git_ref:
            raise ValueError("build.git_ref: pin the git source to a branch, tag or commit sha")
        if self.max_jobs_floor > self.max_jobs_ladder[0]:
            raise ValueError(
                f"build.max_jobs_floor ({self.max_jobs_floor}) is above the first rung of max_jobs_ladder "
                f"({self.max_jobs_ladder[0]})"
            )
        return self

    @property
    def ladder(self) -> list[int]:
        """The rungs actually tried: the ladder down to the floor."""
        return [jobs for jobs in self.max_jobs_ladder if jobs >= self.max_jobs_floor]
