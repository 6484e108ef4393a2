"""Secrets out of the statement text of DDL events.

The event triggers capture ``current_query()``: the whole text the client sent, which may
hold several statements — ``ALTER TABLE t ADD c int; ALTER ROLE app PASSWORD 'secret'``
fires the trigger for the ``ALTER TABLE`` and carries the password along. Every consumer
of the topic (and the search index, the Delta changelog) would see it.
:func:`scrub_statement` replaces such string literals with ``'***'`` before the event is
built (pg2kafka's ``ddl.scrub_secrets``, on by default).

What is replaced — a string constant of any form (``'...'`` with doubled quotes,
``E'...'`` with backslash escapes, ``U&'...'``, dollar-quoted ``$$...$$`` /
``$tag$...$tag$``) that follows, past whitespace and comments:

* a word or quoted identifier that names a secret (:func:`shared.secrets.is_secret_key`):
  ``PASSWORD '...'`` of CREATE / ALTER ROLE / USER, ``password '...'`` and the like in
  ``OPTIONS (...)`` of CREATE / ALTER SERVER / USER MAPPING / FOREIGN TABLE, also after
  ``ADD`` / ``SET`` and ``=`` / ``TO``;
* ``CONNECTION`` (a subscription's conninfo);
* another masked literal (adjacent constants are one string in SQL).

Any other literal's content, and every comment, is scrubbed by pattern (URL passwords,
``password=...`` pairs) and, being possibly code (a function body, a ``DO`` block, an
``EXECUTE`` string, a commented-out statement), scanned the same way, a few levels deep.
The lexer follows Postgres with ``standard_conforming_strings = on`` (the default since
9.1): in ``'...'`` a backslash is an ordinary character. A statement cut short (the
triggers keep 10,000 characters) may end inside a literal: the rest of the text is that
literal.
"""

from __future__ import annotations

import re

from shared.secrets import MASK, is_secret_key, scrub

MASKED_LITERAL = f"'{MASK}'"
_MAX_DEPTH = 4
_DOLLAR = re.compile(r"\$([A-Za-z_\u0080-\uffff][\w\u0080-\uffff]*)?\$")
_WORD = re.compile(r"[\w\u0080-\uffff$]+")
_SPACE = re.compile(r"\s+")
# A string constant's prefix: E (escapes), U& (unicode escapes), N (national), B / X (bits).
_PREFIX = re.compile(r"(?i)(e|u&|n|b|x)?'")
# Words after which a literal is a secret regardless of its name.
_SECRET_BEFORE = {"connection"}
# Words and signs that keep the name before them: SET password TO '...', password = '...'.
_TRANSPARENT = {"to", "="}


def scrub_statement(sql: str, _depth: int = 0) -> str:
    """``sql`` with the string literals that hold secrets replaced by ``'***'`` (see the
    module docstring); everything else is left as it was, byte for byte."""
    out: list[str] = []
    i, n = 0, len(sql)
    name: str | None = None  # the word before the current token, lower-cased
    masked_last = False  # the previous token was a masked literal
    while i < n:
        c = sql[i]
        if c.isspace():
            m = _SPACE.match(sql, i)
            assert m is not None
            out.append(m.group(0))
            i = m.end()
            continue
        if sql.startswith("--", i):
            end = sql.find("\n", i)
            end = n if end < 0 else end
            out.append("--" + _scrub_code(sql[i + 2 : end], _depth))
            i = end
            continue
        if sql.startswith("/*", i):
            end = _comment_end(sql, i)
            closed = end - i >= 4 and sql.startswith("*/", end - 2)
            body = sql[i + 2 : end - 2 if closed else end]
            out.append("/*" + _scrub_code(body, _depth) + ("*/" if closed else ""))
            i = end
            continue
        literal = _literal(sql, i)
        if literal is not None:
            end, text = literal
            secret = masked_last or (
                name is not None and (is_secret_key(name) or name in _SECRET_BEFORE)
            )
            out.append(MASKED_LITERAL if secret else _scrub_literal(text, _depth))
            masked_last, name = secret, None
            i = end
            continue
        masked_last = False
        if c == '"':
            end = _quoted_end(sql, i)
            out.append(sql[i:end])
            name = sql[i + 1 : end - 1].replace('""', '"').lower()
            i = end
            continue
        m = _WORD.match(sql, i)
        if m is not None:
            word = m.group(0).lower()
            if word not in _TRANSPARENT:
                name = word
            out.append(m.group(0))
            i = m.end()
            continue
        if c not in _TRANSPARENT:
            name = None
        out.append(c)
        i += 1
    return "".join(out)


def _literal(sql: str, i: int) -> tuple[int, str] | None:
    """(end, text) of the string constant starting at ``i``, or None if none does."""
    m = _DOLLAR.match(sql, i)
    if m is not None:
        close = sql.find(m.group(0), m.end())
        end = len(sql) if close < 0 else close + len(m.group(0))
        return end, sql[i:end]
    m = _PREFIX.match(sql, i)
    if m is None:
        return None
    escapes = (m.group(1) or "").lower() == "e"
    j, n = m.end(), len(sql)
    while j < n:
        ch = sql[j]
        if escapes and ch == "\\":
            j += 2
        elif ch == "'":
            if j + 1 < n and sql[j + 1] == "'":
                j += 2
            else:
                return j + 1, sql[i : j + 1]
        else:
            j += 1
    return n, sql[i:]


def _scrub_code(text: str, depth: int) -> str:
    """Text that may be SQL (a literal's content, a comment — a commented-out ALTER ROLE
    is as telling as a run one), scrubbed like a statement and by pattern."""
    if depth >= _MAX_DEPTH:
        return text
    return scrub(scrub_statement(text, depth + 1))


def _scrub_literal(text: str, depth: int) -> str:
    """A literal that is not a secret by position: its content scrubbed by pattern and,
    since it may be code, by :func:`scrub_statement`; ``text`` itself when nothing
    changed, so the statement keeps its exact spelling."""
    m = _DOLLAR.match(text)
    if m is not None:
        tag = m.group(0)
        closed = len(text) >= 2 * len(tag) and text.endswith(tag)
        body = text[len(tag) : len(text) - len(tag) if closed else len(text)]
        clean = _scrub_code(body, depth)
        return text if clean == body else tag + clean + (tag if closed else "")
    prefix = _PREFIX.match(text)
    assert prefix is not None
    start = prefix.end()
    closed = len(text) > start and text.endswith("'")
    body = text[start : len(text) - 1 if closed else len(text)]
    plain = body.replace("''", "'")
    if (prefix.group(1) or "").lower() == "e":
        plain = plain.replace("\\'", "'")
    clean = _scrub_code(plain, depth)
    if clean == plain:
        return text
    return text[:start] + clean.replace("'", "''") + ("'" if closed else "")


def _comment_end(sql: str, i: int) -> int:
    """End of the (nestable) block comment starting at ``i``."""
    depth, j, n = 0, i, len(sql)
    while j < n:
        if sql.startswith("/*", j):
            depth += 1
            j += 2
        elif sql.startswith("*/", j):
            depth -= 1
            j += 2
            if depth == 0:
                return j
        else:
            j += 1
    return n


def _quoted_end(sql: str, i: int) -> int:
    """End of the quoted identifier starting at ``i`` (``""`` is a quote inside)."""
    j, n = i + 1, len(sql)
    while j < n:
        if sql[j] == '"':
            if j + 1 < n and sql[j + 1] == '"':
                j += 2
                continue
            return j + 1
        j += 1
    return n
