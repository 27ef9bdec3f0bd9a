"""Apache Airflow provider for RabbitMQ Streams (rmqs).

Public names live in their modules, imported lazily so that the triggerer and sensors never pull
in pyspark: `airflow_rmqs.hooks.RabbitMQStreamHook`, `airflow_rmqs.operators.RabbitMQStream{Read,
Drain,Publish}Operator`, `airflow_rmqs.sensors.RabbitMQStream{NewData,Lag}Sensor`,
`airflow_rmqs.triggers.RabbitMQStream{NewData,Lag}Trigger`.

An Airflow older than the provider supports fails here, on import (Airflow's provider discovery
imports this package first), naming the version it needs and why (`pyspark_rmqs.core.versions`).
"""

from __future__ import annotations

from pyspark_rmqs import __version__  # the one version source
from pyspark_rmqs.core.versions import AIRFLOW, require

require(AIRFLOW)

__all__ = ["__version__"]
