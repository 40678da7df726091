"""STUB: replaced by the Hub stand-in implementation."""

from __future__ import annotations


class HubState:
    def __init__(self) -> None:
        self.repos: dict = {}
        self.cdn_url = ""


def seed_default_repos(state: HubState) -> None:
    pass
