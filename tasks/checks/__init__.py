"""Checks before any cloud write: preflight of the profile, vLLM's own rules, quotas, doctor, act-as."""
