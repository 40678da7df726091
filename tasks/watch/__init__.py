"""Watch: judge each traffic step on Cloud Monitoring's Cloud Run and vLLM metrics."""
