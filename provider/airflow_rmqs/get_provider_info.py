"""Provider metadata for Airflow's `apache_airflow_provider` entry point.

Airflow reads this without importing the hooks, so the connection form (`conn-fields`,
`ui-field-behaviour`) is declared here rather than on the hook (hook methods for it are
deprecated in Airflow 3.2+).
"""

from __future__ import annotations

from typing import Any

INTEGRATION = "RabbitMQ Streams"


def _text(label: str, description: str) -> dict[str, Any]:
    return {"label": label, "schema": {"type": ["string", "null"]}, "description": description}


def _flag(label: str, description: str) -> dict[str, Any]:
    return {
        "label": label,
        "schema": {"type": ["boolean", "null"], "default": False},
        "description": description,
    }


def _secret(label: str, description: str) -> dict[str, Any]:
    return {
        "label": label,
        "schema": {"type": ["string", "null"], "format": "password"},
        "description": description,
    }


CONN_FIELDS: dict[str, dict[str, Any]] = {
    "vhost": _text("Virtual host", "Virtual host (default '/'); overrides the Schema field"),
    "tls": _flag("TLS", "Connect with TLS (port 5551 unless Port is set)"),
    "tls_ca_file": _text("TLS CA file", "PEM file of the CA certificates to trust"),
    "tls_cert_file": _text("TLS client certificate", "PEM client certificate (mutual TLS)"),
    "tls_key_file": _text("TLS client key", "PEM private key of the client certificate"),
    "tls_trust_all": _flag("TLS trust all", "Skip server certificate verification (testing only)"),
    "tls_truststore": _text("TLS truststore", "JKS/PKCS12 truststore path (alternative to the CA file)"),
    "tls_truststore_password": _secret("TLS truststore password", "Password of the truststore"),
    "tls_keystore": _text("TLS keystore", "JKS/PKCS12 keystore path (alternative to cert/key files)"),
    "tls_keystore_password": _secret("TLS keystore password", "Password of the keystore"),
    "uris": _text(
        "URIs",
        "Comma-separated rabbitmq-stream://user:password@host:port/vhost URIs; override Host and Port",
    ),
}


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "rmqs",
        "name": "RabbitMQ Streams (rmqs)",
        "description": "Read, drain and publish RabbitMQ Streams and Super Streams with Spark or "
        "plain Python (Arrow, Parquet); sensors and triggers on consumer lag and new data; OpenLineage.",
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "external-doc-url": "https://www.rabbitmq.com/docs/streams",
                "tags": ["service"],
            }
        ],
        "hooks": [{"integration-name": INTEGRATION, "python-modules": ["airflow_rmqs.hooks"]}],
        "operators": [
            {
                "integration-name": INTEGRATION,
                "python-modules": ["airflow_rmqs.operators", "airflow_rmqs.plain_operators"],
            }
        ],
        "sensors": [{"integration-name": INTEGRATION, "python-modules": ["airflow_rmqs.sensors"]}],
        "triggers": [{"integration-name": INTEGRATION, "python-modules": ["airflow_rmqs.triggers"]}],
        "connection-types": [
            {
                "connection-type": "rabbitmq_stream",
                "hook-class-name": "airflow_rmqs.hooks.RabbitMQStreamHook",
                "hook-name": "RabbitMQ Stream",
                "conn-fields": CONN_FIELDS,
                "ui-field-behaviour": {
                    "hidden-fields": [],
                    "relabeling": {},
                    "placeholders": {
                        "host": "localhost (comma-separated for several nodes)",
                        "port": "5552",
                        "login": "guest",
                        "schema": "/ (virtual host, when the Virtual host field is empty)",
                        "vhost": "/",
                        "uris": "rabbitmq-stream://user:password@host:5552/%2F",
                    },
                },
            }
        ],
        "asset-uris": [
            {
                "schemes": ["rabbitmq-stream"],
                "handler": "airflow_rmqs.assets.sanitize_uri",
                "factory": "airflow_rmqs.assets.create_asset",
                "to_openlineage_converter": "airflow_rmqs.assets.convert_asset_to_openlineage",
            }
        ],
        "queues": ["airflow_rmqs.queues.RabbitMQStreamMessageQueueProvider"],
        "config": {
            "rabbitmq_streams": {
                "description": "Settings of the RabbitMQ Streams (rmqs) provider.",
                "options": {
                    "triggerer_gc_freeze": {
                        "description": "When True, the first rmqs trigger a triggerer runs collects "
                        "once and moves every object alive then (Airflow's and the providers' start-up "
                        "heap) out of CPython's garbage collections (gc.freeze()), so the full "
                        "collections that stop the triggerer's event loop scan only what it made since. "
                        "Process-wide: it affects every trigger of that triggerer. Reference cycles "
                        "among the frozen objects are never reclaimed.",
                        "version_added": "0.1.0",
                        "type": "boolean",
                        "example": "True",
                        "default": "False",
                    }
                },
            }
        },
    }
