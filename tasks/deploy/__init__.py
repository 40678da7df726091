"""Deploy: render the Cloud Run service, roll out a tagged candidate, probe it, move traffic, keep verdicts."""
