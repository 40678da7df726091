"""Cold starts measured on a copy of the serving revision (flows/cold_start.py): phases from the logs, a report."""
