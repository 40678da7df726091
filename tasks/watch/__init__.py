"""Watch: what a serving revision does. Each traffic step judged on Cloud Monitoring's Cloud Run and vLLM metrics
(canary.py); its cold starts measured phase by phase (coldstart/)."""
