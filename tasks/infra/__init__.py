"""Infrastructure: get-or-create (and teardown) of bucket, registry, network, accounts, grants and secrets."""
