"""The region left as a test found it: the sandbox is a new project, so what one test leaves running takes the next
one's room (preflight counts it: tasks/checks/in_use.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def services_deleted_after(target) -> Iterator[None]:
    """Delete, on exit, the Cloud Run services made inside the block (their instances stop)."""
    from google.api_core import exceptions as gexc

    from tasks.common import clients

    services = clients.run_services(target)
    before = {s.name for s in services.list_services(parent=target.location_path)}
    yield
    for service in services.list_services(parent=target.location_path):
        if service.name not in before:
            with contextlib.suppress(gexc.GoogleAPICallError):
                services.delete_service(name=service.name).result(polling=clients.operation_polling(target))


def running(sb, service: str) -> list[str]:
    """The revisions of ``service`` with a running instance, as the sandbox's admin API lists them."""
    return sorted(i["revision"].rsplit("/", 1)[1] for i in sb.run("GET", "/instances")
                  if f"/services/{service}/" in i["revision"] and i["running"])  # fmt: skip


def writes(sb, since: int) -> list[str]:
    """The control plane's writes since ``since`` ("METHOD path"), permission checks and batch reads left out."""
    reads = (":testIamPermissions", ":batchGet")
    return [f"{r['method']} {r['path']}" for r in sb.requests("control", since=since)
            if r["method"] != "GET" and not r["path"].endswith(reads)]  # fmt: skip
