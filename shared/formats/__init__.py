"""Formats that are not walcast's own contract (``shared.contract``): the Debezium
PostgreSQL connector's envelope, written (pg2kafka's ``debezium`` format) and read
(translated into walcast's change events by the sinks), in JSON and in Avro."""
