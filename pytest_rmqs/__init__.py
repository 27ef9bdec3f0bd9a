"""pytest fixtures for pipelines built on rmqs: a real RabbitMQ broker, fresh streams, test data.

Installed with `rmqs[testing]`; pytest loads `pytest_rmqs.plugin` through its `pytest11` entry
point. Fixtures: `rmqs_broker` (a `RabbitMQTestBroker`: RMQS_TEST_URI's broker, else a container
started through testcontainers), `rmqs_stream` and `rmqs_superstream` (fresh names, deleted after
the test), `rmqs_airflow_conn_id` (the Airflow connection) and `rmqs_dagster_resource` (the Dagster
resource) pointing at that broker. `RabbitMQTestBroker.publish` and `.read_arrow` put test
messages in and read a stream back as an Arrow table. docs/testing.md has worked examples.
"""

from pyspark_rmqs import __version__  # the one version source (it imports nothing heavy)
from pytest_rmqs.broker import RabbitMQTestBroker, broker_from_uri, unique_name

__all__ = ["RabbitMQTestBroker", "__version__", "broker_from_uri", "unique_name"]
