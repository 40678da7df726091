"""STUB"""
from __future__ import annotations


class CloudRun:
    def __init__(self, config, faults, gcs_url, state_dir):
        self.control_url = ""

    def routes(self):
        return []

    def admin_routes(self):
        return []

    async def shutdown(self):
        pass
