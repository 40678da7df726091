"""What every step shares: cloud clients, GCP retries and errors, run loggers, progress, the deployer's roles."""
