"""``verify``: proving a sink equals its Postgres source on a running pipeline
(docs/design.md#verification). :mod:`.core` holds the comparison and the two sides'
protocols; :mod:`.postgres` the Postgres side."""
