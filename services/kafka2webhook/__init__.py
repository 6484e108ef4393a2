"""kafka2webhook: change events and subscription events from Kafka to HTTP endpoints."""
