"""STUB: replaced by the Hub stand-in implementation."""

from __future__ import annotations

from starlette.applications import Starlette


def build_hub_app(state):
    return Starlette()


def build_cdn_app(state):
    return Starlette()


def hub_admin_routes(state):
    return []
