"""Prefect tasks, one module per concern; each cloud API is reached through tasks.common.clients."""
