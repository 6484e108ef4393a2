"""What producer and consumers agree on: the change event and the Postgres types.

Everything a service needs to know about the shape of a walcast event or about a Postgres
type comes from here, so the producer and the sinks cannot drift apart:

* :mod:`shared.contract.event` — the change event: fields, operations, the ordering key,
  the version rules, and the one decoder every consumer reads records through;
* :mod:`shared.contract.pgtypes` — the one table of Postgres types (OID, name, array
  type, how pg2kafka converts a value, the search field and the Spark column it becomes).
"""
