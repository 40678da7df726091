# The image a Cloud Run work pool runs the flows in (prefect.yaml: *cloud_run_pool, *cloud_run_pull).
#   gcloud builds submit --tag us-central1-docker.pkg.dev/YOUR_PROJECT/pipelines/hf-cloudrun-pipeline:latest
# The sandbox extra is left out: a production run talks to Google and the Hub.
FROM prefecthq/prefect:3.9.1-python3.11
WORKDIR /opt/hf-cloudrun-pipeline
COPY . .
RUN pip install --no-cache-dir .
