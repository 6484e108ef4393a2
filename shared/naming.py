"""Names of per-table things in the sinks — Kafka topics, search indices, Delta
directories — from a template over ``{db}``, ``{schema}`` and ``{table}``.

Postgres allows almost anything in an identifier; each sink allows less. Replacing what a
sink refuses was not enough: ``"Orders"`` and ``orders`` (lower-cased for an index),
``"a b"`` and ``a_b``, ``"a.b".c`` and ``a."b.c"`` got the same index or mirror, and a
TRUNCATE of one removed the other's rows. So a name is used as is only when it cannot
be confused with another table's:

* the filled template needed no change for the sink (no character replaced, no case
  folded, nothing stripped or cut), and
* every part the template uses is plain (``[a-z0-9_]``, without any character of the
  template's text between its fields, such as the ``.`` in ``{schema}.{table}``), and
  the template puts text between its fields — then the parts can be read back from
  the name.

Any other name gets ``-`` and ten hex digits of the SHA-256 of ``db``, ``schema`` and
``table`` appended (the readable part is the sanitised name, cut to fit). Two tables can
share a name only through a hash collision (2^-40 for a given pair).
"""

from __future__ import annotations

import hashlib
import re
import string
from dataclasses import dataclass

_PLAIN = frozenset(string.ascii_lowercase + string.digits + "_")
HASH_HEX = 10


@dataclass(frozen=True)
class NameRules:
    """What one sink accepts in a name."""

    invalid: re.Pattern[str]  # characters to replace with "_"
    max_length: int  # in UTF-8 bytes
    lower: bool = False  # the sink folds case (search indices)
    strip_leading: str = ""  # characters a name may not start with
    fallback: str = "walcast"  # when nothing is left


KAFKA_TOPIC = NameRules(re.compile(r"[^A-Za-z0-9._-]"), 249, strip_leading=".")
SEARCH_INDEX = NameRules(re.compile(r'[\\/*?"<>| ,#:]'), 200, lower=True, strip_leading="-_+")
DELTA_DIRECTORY = NameRules(re.compile(r"[^A-Za-z0-9_.\-]"), 200, strip_leading=".")


def _template_parts(template: str) -> tuple[frozenset[str], list[str], bool]:
    """(characters of the text between the template's fields, fields used, whether every
    field but the first has text before it)."""
    between: set[str] = set()
    fields: list[str] = []
    separated = True
    for text, field, _spec, _conv in string.Formatter().parse(template):
        if field is not None:
            if fields:
                between.update(text)
                separated = separated and bool(text)
            fields.append(field)
    return frozenset(between), fields, separated


def table_name(template: str, rules: NameRules, db: str, schema: str, table: str) -> str:
    """The sink's name for a table: collision-free (see the module doc)."""
    values = {"db": db, "schema": schema, "table": table}
    filled = template.format(**values)
    name = filled.lower() if rules.lower else filled
    name = rules.invalid.sub("_", name).lstrip(rules.strip_leading)
    if name in ("", ".", ".."):
        name = rules.fallback
    literal, fields, separated = _template_parts(template)
    plain = _PLAIN - literal
    exact = (
        name == filled
        and separated
        and all(values[f] and set(values[f]) <= plain for f in fields)
        and len(name.encode()) <= rules.max_length
    )
    if exact:
        return name
    digest = hashlib.sha256("\0".join((db, schema, table)).encode()).hexdigest()[:HASH_HEX]
    room = rules.max_length - HASH_HEX - 1
    head = name.encode()[:room].decode(errors="ignore")  # cut at a character boundary
    return f"{head}-{digest}"


def wildcard(pattern: str) -> re.Pattern[str]:
    """A name pattern in which ``*`` matches any text (nothing else is special): the one
    rule of every ``schema.table`` filter, transform rule and webhook subscription."""
    return re.compile("^" + ".*".join(re.escape(p) for p in pattern.split("*")) + "$", re.DOTALL)
