"""Everything that talks to RabbitMQ, and where a read starts and ends (`positions`); no Spark imports."""
