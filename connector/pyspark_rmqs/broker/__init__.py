"""Everything that talks to RabbitMQ; no Spark imports below this package."""
