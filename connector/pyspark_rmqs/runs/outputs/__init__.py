"""What a run delivers into: exactly-once files (range-keyed staging, publish, commit records),
Apache Iceberg tables, object-store locations, and the readers of committed files only."""
