"""A job's image, "pulled" when its execution is provisioned: the Python environment its build recorded, made on this
host the first time a job runs the image (sandbox/control/cloudbuild/image_env.py), found ready after.

Cloud Run pulls a job's image while the execution waits to start (its ``Started`` condition comes after); making the
environment stands for that pull, so its minutes count before the tasks start and never against the task timeout.
An execution cancelled meanwhile stops waiting; the environment is still finished, for the next execution.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from google.cloud import run_v2

from sandbox.control.cloudbuild.image_env import ImageEnvironment, materialise, ready

if TYPE_CHECKING:
    from sandbox.control import ControlContext


async def image_environment(
    ctx: ControlContext, template: run_v2.TaskTemplate, stop: asyncio.Event
) -> ImageEnvironment | None:
    """The environment of the task's image; None for an image without one (it runs in this host's environment) or
    when ``stop`` is set first. Raises ImageEnvironmentError when it cannot be made."""
    builds = ctx.module("cloudbuild")
    if builds is None or not template.containers:
        return None
    config = builds.image_config(template.containers[0].image)
    recipe = config.environment if config is not None else None
    if recipe is None:
        return None
    made = ready(recipe)
    if made is not None:
        return made
    making = asyncio.ensure_future(asyncio.to_thread(materialise, recipe))
    making.add_done_callback(lambda task: task.cancelled() or task.exception())  # read even when no one waits
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({making, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    return making.result() if making.done() and not stop.is_set() else None
