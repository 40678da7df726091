"""What to serve: a Hugging Face repo at a revision, which files of it, and where its token lives."""

from __future__ import annotations

import re
from typing import ClassVar

from prefect.blocks.core import Block
from pydantic import Field, field_validator

REPO_PART = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$")
HUB_ENDPOINT = re.compile(r"^https?://[^/\s]+/?$")
BLOCK_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")


class ModelSource(Block):
    """A Hugging Face model repo at a revision (branch, tag or commit), with the files to stage.

    The Hub token is never stored here: ``token_secret_block`` names a Prefect Secret block that holds it.
    Without one, the HF_TOKEN environment variable of the worker is used. Anonymous downloads from cloud
    egress IPs are rate limited (lesson 11), so set a token even for public models.
    """

    _block_type_name: ClassVar[str] = "Model Source"
    _block_type_slug: ClassVar[str] = "model-source"
    _description: ClassVar[str] = "A Hugging Face model repo and revision to stage and serve."

    repo_id: str = Field(..., description="Hub repo id, e.g. 'google/gemma-4-E2B-it'.")
    revision: str = Field("main", description="Branch, tag or 40-character commit sha; resolved to a commit.")
    allow_patterns: list[str] | None = Field(
        None, description="Only files matching these globs; the default picks safetensors, config and tokenizer."
    )
    ignore_patterns: list[str] | None = Field(None, description="Files matching these globs are skipped.")
    token_secret_block: str | None = Field(
        None, description="Name of the Prefect Secret block holding the Hub token (read access is enough)."
    )
    hub_endpoint: str | None = Field(None, description="Hub base URL; https://huggingface.co when empty.")

    @field_validator("repo_id")
    @classmethod
    def _repo_id(cls, value: str) -> str:
        value = value.strip()
        if value.startswith(("http://", "https://", "hf://")) or value.startswith("huggingface.co/"):
            raise ValueError(f"repo_id '{value}' is a URL; give the repo id only, e.g. 'google/gemma-4-E2B-it'")
        parts = value.split("/")
        if len(parts) > 2 or not all(REPO_PART.match(p) for p in parts) or "--" in value or ".." in value:
            raise ValueError(
                f"repo_id '{value}' is not a Hub repo id: write 'namespace/name' with letters, digits, '-', '_' "
                "or '.', e.g. 'google/gemma-4-E2B-it'"
            )
        return value

    @field_validator("revision")
    @classmethod
    def _revision(cls, value: str) -> str:
        value = value.strip()
        if not value or any(c.isspace() for c in value) or ".." in value:
            raise ValueError(f"revision '{value}' must be a branch, tag or commit sha without spaces, e.g. 'main'")
        return value

    @field_validator("allow_patterns", "ignore_patterns")
    @classmethod
    def _patterns(cls, value: list[str] | None, info) -> list[str] | None:
        if value is not None and (not value or any(not p.strip() for p in value)):
            raise ValueError(f"{info.field_name}: give non-empty glob patterns, or leave it unset for the default")
        return value

    @field_validator("token_secret_block")
    @classmethod
    def _secret_name(cls, value: str | None) -> str | None:
        if value is not None and value.startswith("hf_"):
            raise ValueError(
                "token_secret_block must be the NAME of a Prefect Secret block, not the token itself; create one "
                "with `prefect block create secret` and put its name here"
            )
        if value is not None and not BLOCK_NAME.match(value):
            raise ValueError(f"token_secret_block '{value}' is not a block name (lowercase letters, digits, '-')")
        return value

    @field_validator("hub_endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None and not HUB_ENDPOINT.match(value):
            raise ValueError(f"hub_endpoint '{value}' must be a base URL with scheme, e.g. 'https://huggingface.co'")
        return value.rstrip("/") if value else value

    @property
    def served_model_name(self) -> str:
        """The name clients put in requests: the repo id, whatever commit is served."""
        return self.repo_id
