"""The quality gate: a candidate answers a quality set beside the serving revision before any traffic moves."""
