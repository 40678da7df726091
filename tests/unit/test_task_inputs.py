"""A task whose inputs are not data computes no cache key (issue 34).

Prefect hashes every task run's inputs for its default cache policy; an input it cannot serialize (a bound method of
the service lock, which holds a thread lock) makes it log "Error encountered when computing cache key" at ERROR, with
30 lines of traceback, in the middle of a successful promotion. Such a task takes data, or has ``NO_CACHE``.
tests/e2e/test_progressive_delivery.py reads a whole promotion's logs for the same thing; this covers every task,
including those of the flows that promotion does not run.
"""

from __future__ import annotations

import collections.abc
import importlib
import pkgutil
import threading
import typing

import httpx
from prefect.cache_policies import NO_CACHE
from prefect.tasks import Task

from flows.service_lock import ServiceLock

NOT_DATA = (ServiceLock, httpx.Client, type(threading.Lock()))


def _tasks() -> dict[str, Task]:
    found: dict[str, Task] = {}
    for package in ("tasks", "flows"):
        for info in pkgutil.walk_packages(importlib.import_module(package).__path__, f"{package}."):
            module = importlib.import_module(info.name)
            found |= {value.name: value for value in vars(module).values() if isinstance(value, Task)}
    return found


def _not_data(hint: object) -> bool:
    """A callable, a lock or a client, alone or inside a union or a container."""
    if typing.get_origin(hint) is collections.abc.Callable:
        return True
    if isinstance(hint, type) and issubclass(hint, NOT_DATA):
        return True
    return any(_not_data(arg) for arg in typing.get_args(hint))


def test_every_task_given_inputs_that_are_not_data_has_no_cache_policy():
    tasks = _tasks()
    assert "run_deploy_candidate" in tasks and len(tasks) > 40  # the walk found the tasks
    not_data = {
        name: [param for param, hint in typing.get_type_hints(task.fn).items() if param != "return" and _not_data(hint)]
        for name, task in tasks.items()
    }
    cached = {name: params for name, params in not_data.items() if params and tasks[name].cache_policy is not NO_CACHE}
    assert cached == {}
    assert not_data["run_deploy_candidate"] == ["before_retry"]  # the check sees the one task that takes a callable
