"""Configuration blocks: where to serve (GcpTarget), how (ServingProfile) and what (ModelSource)."""

from blocks.images import ImageBuild
from blocks.profile import PRESETS, ServingProfile, VllmOptions
from blocks.source import ModelSource
from blocks.target import ApiEndpoints, GcpTarget

__all__ = ["PRESETS", "ApiEndpoints", "GcpTarget", "ImageBuild", "ModelSource", "ServingProfile", "VllmOptions"]
