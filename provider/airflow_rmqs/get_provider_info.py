"""Airflow provider metadata (filled in with the provider)."""


def get_provider_info() -> dict[str, object]:
    return {"package-name": "rmqs", "name": "RabbitMQ Streams (rmqs)", "description": "RabbitMQ Streams for Airflow"}
