"""Weights: resolve a Hub revision, choose its files, stream them into GCS."""
