# The image a cloud-run-v2 work pool runs the flows in. `python -m flows.bootstrap gcp ... --pool-type cloud-run-v2
# --build-worker-image` builds it with Cloud Build (context: .dockerignore applied) into the target's Artifact
# Registry repository as hf-cloudrun-pipeline, and puts it in the pool's base job template.
# The sandbox extra is left out: a production run talks to Google and the Hub.
FROM prefecthq/prefect:3.9.1-python3.11
WORKDIR /opt/hf-cloudrun-pipeline
COPY . .
# Editable: the deployments' pull step (flows/project.py) runs flows from the folder the package is installed from.
RUN pip install --no-cache-dir -e .
