"""The serving image: a pinned reference, or a Cloud Build from source down the OOM ladder."""
