"""Prefect tasks, one package per pipeline stage, layered one way (.importlinter): a package imports only those below.

report   what a run says: the promotion report, cost and prices, run outcomes, schedules, the work pool
checks   before any cloud write: findings, preflight, vLLM's own rules, quotas, doctor, act-as
watch    each traffic step judged on Cloud Monitoring: the canary judge, Cloud Run and vLLM metrics
deploy   the Cloud Run service: render, candidate revision, probe, traffic, rollout, verdicts
image    the serving image: a pinned reference, or a Cloud Build down the OOM ladder
infra    get-or-create and teardown: bucket, registry, network, accounts, grants, secrets, who shares them
weights  the Hub revision, its files, streamed into GCS
common   clients (every cloud API is reached through tasks.common.clients), GCP errors, logs, names, roles
"""
