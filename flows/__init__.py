"""Prefect flows: promote-model, scale-service, rollback-model, teardown (one module each)."""
