"""The mirror's names: of its working and bookkeeping columns, of its table properties,
of the columns it holds for Postgres columns (Delta refuses some characters and case
twins), and of its directory. Pure functions; everything else in the package names
columns through them."""

from __future__ import annotations

from urllib.parse import unquote

from services.kafka2spark.append_only import ROW_ID
from shared.contract.event import ROW_HASH, ROW_XID, UNFILLED
from shared.naming import DELTA_DIRECTORY, table_name

LSN = "_walcast_lsn"  # the row's version: its LSN, after epoch * 2^48 (a new source)
SOURCE_LSN = "__source_lsn"  # the event's own lsn, for the changelog
# verify's columns (docs/design.md#verification): the row hash of the version held (null:
# unknown) and the transaction that wrote it (0: a read row)
HASH, XID = ROW_HASH, ROW_XID
OWN = (LSN, ROW_ID, UNFILLED, HASH, XID)
"""walcast's own columns of a mirror (no Postgres column is named so: :func:`column_name`)."""
TRUNCATED = "walcast.truncated_lsn"
SCHEMA_AT = "walcast.schema_at"  # "lsn:seq" of the last DDL applied
NUMBERS = "walcast.column_numbers"  # JSON: column -> attnum, to recognise renames
CORRUPT = "__w_corrupt"
TKEY = "__w_table"  # db.schema.table: what a mirror is per
# Working columns of a merge; the prefix keeps them apart from any Postgres column.
W_LSN, W_SEQ, W_OP, W_TOAST, W_PRESENT = "__w_lsn", "__w_seq", "__w_op", "__w_toast", "__w_has"
W_NEW, W_KEY, W_KAFKA, W_CARRY, W_KEEP, W_RANK, W_BEYOND = (
    "__w_new", "__w_key", "__w_", "__w_carry_", "__w_keep_", "__w_rank", "__w_beyond",
)  # fmt: skip
W_UNFILLED, W_SUPPLIED = "__w_unfilled", "__w_supplied"
W_FALLBACK = "__w_fallback_"
W_HASH, W_XID = "__w_hash", "__w_xid"


def quote(name: str) -> str:
    """A Spark SQL identifier, whatever the Postgres column is called."""
    return "`" + name.replace("`", "``") + "`"


# Characters Delta refuses in column names without column mapping, and the escape itself.
_DELTA_REFUSES = frozenset(" ,;{}()\n\t=%")


def _escape(ch: str) -> str:
    return "".join(f"%{b:02X}" for b in ch.encode())


def column_name(name: str) -> str:
    """The mirror's usual name for a Postgres column: the same name when Delta accepts
    it, else each refused character (`` ,;{}()\\n\\t=``) and ``%`` as ``%XX``
    (``first name`` → ``first%20name``); a name that is walcast's own in any case
    (``_walcast_lsn``, ``__w_...``) gets a leading ``%``. Reversible (:func:`postgres_name`).
    A column whose usual name a case twin already holds gets another (:func:`mirror_names`),
    so the mirror's own schema is what maps a column to its name. Delta's column mapping
    would allow any name, but the ``deltalake`` reader returned nulls for such tables;
    Spark, delta-rs and every other reader read these names as they are."""
    if not _DELTA_REFUSES.intersection(name) and not _walcast_own(name):
        return name
    out = "".join(_escape(ch) if ch in _DELTA_REFUSES else ch for ch in name)
    return "%" + out if _walcast_own(out) else out


def _case_escaped(name: str) -> str:
    """:func:`column_name`'s escape applied to every cased letter and non-ASCII character
    too: only digits, punctuation and ``%XX`` stay, so no other column's mirror name is
    equal to it case-insensitively."""
    return "".join(
        _escape(ch) if ch in _DELTA_REFUSES or not ch.isascii() or ch.upper() != ch.lower() else ch
        for ch in name
    )


def _folded(name: str) -> str:
    """A column name as Spark and Delta compare it: case-insensitively (Spark resolves
    names ignoring case, and Delta refuses two columns that differ only by case)."""
    return name.upper().casefold()


def mirror_names(taken: list[str], columns: list[str]) -> dict[str, str]:
    """Mirror names for Postgres columns new to a mirror whose columns are named ``taken``
    (mirror names): :func:`column_name`, unless Delta would see it as equal to a taken
    one or an earlier new one (case twins, ``"Name"`` beside ``name``): then the case-free
    :func:`_case_escaped` form. Either decodes back with :func:`postgres_name`. The order
    of ``columns`` decides which twin keeps the plain name: callers pass Postgres' column
    order."""
    seen = {_folded(t) for t in taken} | {_folded(o) for o in OWN}
    out: dict[str, str] = {}
    for c in columns:
        name = column_name(c)
        if _folded(name) in seen:
            name = _case_escaped(c)
        if _folded(name) in seen:  # cannot happen for a name not already in the mirror
            raise MirrorError(f"column {c!r} has no mirror name free of its case twins")
        seen.add(_folded(name))
        out[c] = name
    return out


def postgres_name(name: str) -> str:
    """The Postgres column a mirror column holds: the inverse of :func:`column_name` and
    :func:`mirror_names`."""
    if "%" not in name:
        return name
    if name.startswith("%") and _walcast_own(name[1:]):
        name = name[1:]
    return unquote(name, errors="strict")


def _walcast_own(name: str) -> bool:
    folded = _folded(name)
    return folded in OWN or folded.startswith("__w_")


def table_dir(template: str, db: str, schema: str, table: str) -> str:
    """The mirror's directory name: collision-free (:func:`shared.naming.table_name`)."""
    return table_name(template, DELTA_DIRECTORY, db, schema, table)


class MirrorError(RuntimeError):
    """A mirror that cannot take its table's changes (a walcast check)."""


WRITER = "walcast:kafka2spark"
"""The ``userMetadata`` of every Delta commit kafka2spark makes (its Spark session's
``spark.databricks.delta.commitInfo.userMetadata``): how ``verify`` tells its commits from
another writer's (:mod:`services.kafka2spark.provenance`)."""
