"""Example Dagster definitions for rmqs (`dagster dev -m dagster_rmqs.examples.definitions`)."""
