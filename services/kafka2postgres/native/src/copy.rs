//! Event rows to the text of a `COPY ... FROM STDIN` (text format), and the keys' text as
//! `_walcast_target.rows` stores it.
//!
//! Contract (services/kafka2postgres/copying.py holds the rules' Python side and says
//! when the bulk path is taken):
//! - a row is the JSON object a change event's `new` carries; a column it lacks is NULL;
//! - a value is sent as the text the column's type input reads: a string unescaped, a
//!   number as written, a boolean `t` / `f`, JSON's null as NULL; a json / jsonb column
//!   takes the value's exact JSON text; bytea its base64 decoded (sent as hex); a date or
//!   time its string, unless the year is in ISO's expanded form (`+12345`, `-0043`,
//!   `0000`: the guarded path's `time_text` converts those);
//! - anything else — a nested value in a scalar column, a string where a number of a
//!   date is expected, invalid base64, a row that is not an object of plain keys — is a
//!   [`NotPlain`], and nothing of the batch is used (the caller takes the guarded path,
//!   which reads every value itself);
//! - a key's text is exactly Postgres' output of `ROW(k1, k2)::text` for the key's
//!   typed values, computed here only for the kinds whose event text is the type's own
//!   output ([`KeyKind`]); otherwise the server computes it.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

use base64::Engine as _;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

/// How a column's values are read out of the row (shared/contract/pgtypes.py's kinds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Text,
    Number,
    Boolean,
    Json,
    Bytea,
    Time,
}

impl Kind {
    /// `s i f b j x d t z`; None for anything else (arrays never reach here).
    pub fn of(kind: &str) -> Option<Kind> {
        Some(match kind {
            "s" => Kind::Text,
            "i" | "f" => Kind::Number,
            "b" => Kind::Boolean,
            "j" => Kind::Json,
            "x" => Kind::Bytea,
            "d" | "t" | "z" => Kind::Time,
            _ => return None,
        })
    }
}

/// A key column whose text in `ROW(...)::text` can be computed from the event: an
/// integer (its JSON number) or a type whose output is the event's string itself (text,
/// varchar, a lower-case uuid).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    Integer,
    Text,
    Uuid,
}

impl KeyKind {
    /// For a column of Postgres type `typname`; None when only the server knows its text.
    pub fn of(typname: &str) -> Option<KeyKind> {
        Some(match typname {
            "int2" | "int4" | "int8" => KeyKind::Integer,
            "text" | "varchar" => KeyKind::Text,
            "uuid" => KeyKind::Uuid,
            _ => return None,
        })
    }
}

/// Why a batch cannot go the bulk way.
#[derive(Debug, PartialEq, Eq)]
pub struct NotPlain(pub String);

impl From<serde_json::Error> for NotPlain {
    fn from(e: serde_json::Error) -> NotPlain {
        NotPlain(format!(
            "a row that is not a JSON object of plain names: {e}"
        ))
    }
}

/// A row's members in their order, names borrowed (a name with an escape is refused:
/// no column name the bulk path serves needs one).
pub struct Fields<'a>(pub Vec<(&'a str, &'a RawValue)>);

impl<'a> Fields<'a> {
    pub fn parse(row: &'a [u8]) -> Result<Fields<'a>, NotPlain> {
        Ok(serde_json::from_slice(row)?)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Fields<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Fields<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<Fields<'de>, M::Error> {
                let mut out = Vec::with_capacity(m.size_hint().unwrap_or(8));
                while let Some(name) = m.next_key::<&'de str>()? {
                    out.push((name, m.next_value::<&'de RawValue>()?));
                }
                Ok(Fields(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// `s` escaped for COPY's text format.
pub fn escape(out: &mut Vec<u8>, s: &[u8]) {
    let mut start = 0;
    for (i, &b) in s.iter().enumerate() {
        let short: &[u8] = match b {
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0b => b"\\v",
            0x0c => b"\\f",
            _ => continue,
        };
        out.extend_from_slice(&s[start..i]);
        out.extend_from_slice(short);
        start = i + 1;
    }
    out.extend_from_slice(&s[start..]);
}

/// A JSON string's value (borrowed when it has no escape).
fn string(raw: &str) -> Result<Cow<'_, str>, NotPlain> {
    match serde_json::from_str::<&str>(raw) {
        Ok(s) => Ok(Cow::Borrowed(s)),
        Err(_) => Ok(Cow::Owned(serde_json::from_str::<String>(raw)?)),
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// One field of a COPY line: the value `raw` (None: the row lacks the column) as `kind`
/// reads it.
pub fn field(out: &mut Vec<u8>, kind: Kind, raw: Option<&RawValue>) -> Result<(), NotPlain> {
    let text = match raw {
        None => "null",
        Some(r) => r.get(),
    };
    if text == "null" {
        out.extend_from_slice(b"\\N");
        return Ok(());
    }
    if kind == Kind::Json {
        escape(out, text.as_bytes());
        return Ok(());
    }
    let first = text.as_bytes()[0];
    match first {
        b'"' => {
            let s = string(text)?;
            match kind {
                Kind::Bytea => {
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(s.as_bytes())
                        .map_err(|e| NotPlain(format!("a bytea value that is not base64: {e}")))?;
                    out.extend_from_slice(b"\\\\x");
                    for b in bytes {
                        out.push(HEX[(b >> 4) as usize]);
                        out.push(HEX[(b & 0xf) as usize]);
                    }
                }
                Kind::Time => {
                    if s.starts_with('+') || s.starts_with('-') || s.starts_with("0000") {
                        return Err(NotPlain(format!(
                            "a date or time with an expanded year: {s}"
                        )));
                    }
                    escape(out, s.as_bytes());
                }
                _ => escape(out, s.as_bytes()),
            }
        }
        b'[' | b'{' => return Err(NotPlain("a nested value in a scalar column".into())),
        _ if kind == Kind::Bytea || kind == Kind::Time => {
            return Err(NotPlain(format!("{text} where a string is expected")));
        }
        b't' => out.push(b't'),
        b'f' => out.push(b'f'),
        _ => out.extend_from_slice(text.as_bytes()), // a number: digits, sign, dot, exponent
    }
    Ok(())
}

/// Postgres' `record_out` for one field: quoted when empty or holding `"`, `\`, `(`,
/// `)`, `,` or white space; inside quotes `"` and `\` doubled.
fn record_field(out: &mut Vec<u8>, s: &[u8]) {
    let quote = s.is_empty()
        || s.iter().any(|&b| {
            matches!(
                b,
                b'"' | b'\\' | b'(' | b')' | b',' | b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c
            )
        });
    if !quote {
        out.extend_from_slice(s);
        return;
    }
    out.push(b'"');
    for &b in s {
        if b == b'"' || b == b'\\' {
            out.push(b);
        }
        out.push(b);
    }
    out.push(b'"');
}

/// The key's text, `(v1,v2)`, from its raw JSON values; Err when a value is not what its
/// kind's text is made from (the server then computes it).
pub fn key_text(
    out: &mut Vec<u8>,
    values: &[(KeyKind, Option<&RawValue>)],
) -> Result<(), NotPlain> {
    out.push(b'(');
    for (i, (kind, raw)) in values.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let text = raw.map(|r| r.get()).unwrap_or("null");
        if text == "null" {
            continue; // NULL: nothing between the commas
        }
        match kind {
            KeyKind::Integer => {
                let digits = text.strip_prefix('-').unwrap_or(text);
                let canonical = !digits.is_empty()
                    && digits.bytes().all(|b| b.is_ascii_digit())
                    && (digits == "0" || !digits.starts_with('0'));
                if !canonical || text == "-0" {
                    return Err(NotPlain(format!("an integer key written {text}")));
                }
                out.extend_from_slice(text.as_bytes());
            }
            KeyKind::Text | KeyKind::Uuid => {
                if !text.starts_with('"') {
                    return Err(NotPlain(format!("a text key written {text}")));
                }
                let s = string(text)?;
                if *kind == KeyKind::Uuid && !canonical_uuid(s.as_bytes()) {
                    return Err(NotPlain(format!("a uuid key written {s}")));
                }
                if !s.is_ascii() {
                    // record_out quotes by the server's isspace(), which some platforms'
                    // UTF-8 locales answer yes for bytes of non-ASCII characters (0x85,
                    // 0xA0): only the server knows its text
                    return Err(NotPlain("a text key with a non-ASCII character".into()));
                }
                record_field(out, s.as_bytes());
            }
        }
    }
    out.push(b')');
    Ok(())
}

/// A uuid as Postgres prints it: 8-4-4-4-12 lower-case hex digits.
fn canonical_uuid(s: &[u8]) -> bool {
    s.len() == 36
        && s.iter().enumerate().all(|(i, &b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => matches!(b, b'0'..=b'9' | b'a'..=b'f'),
        })
}

/// One table's batch of new rows, encoded (see [`encode`]).
pub struct Encoded {
    /// The COPY text of the rows, one line each.
    pub rows: Vec<u8>,
    /// The COPY text of their `_walcast_target.rows` lines (`tbl, key, version,
    /// deleted, unfilled, hash, xid`) when every key's text was computed here.
    pub versions: Option<Vec<u8>>,
    /// Otherwise, per key column, a JSON array of the rows' values (the server computes
    /// the text from them).
    pub keys: Vec<Vec<u8>>,
}

/// What [`encode`] is told of the table.
pub struct Table<'a> {
    pub columns: &'a [(String, Kind)],
    /// The key's columns: their position in `columns`, and their [`KeyKind`] when every
    /// key column has one.
    pub key_at: &'a [usize],
    pub key_kinds: Option<&'a [KeyKind]>,
    pub tbl: i64,
}

/// Each row of `rows` (with its version, hash and xid) as COPY text; Err for the first
/// value that is not plain (see the module). The versions' lines when every key's text
/// could be computed here, else the key arrays.
pub fn encode(
    table: &Table,
    rows: &[&[u8]],
    versions: &[i64],
    hashes: &[Option<i64>],
    xids: &[i64],
) -> Result<Encoded, NotPlain> {
    match encode_as(table, table.key_kinds, rows, versions, hashes, xids) {
        Err(Refusal::KeyText) => {
            encode_as(table, None, rows, versions, hashes, xids).map_err(|r| match r {
                Refusal::Value(e) => e,
                Refusal::KeyText => unreachable!("no key text is computed without key kinds"),
            })
        }
        Err(Refusal::Value(e)) => Err(e),
        Ok(e) => Ok(e),
    }
}

enum Refusal {
    Value(NotPlain),
    KeyText, // a key whose text only the server knows: its arrays instead
}

impl From<NotPlain> for Refusal {
    fn from(e: NotPlain) -> Refusal {
        Refusal::Value(e)
    }
}

fn encode_as(
    table: &Table,
    key_kinds: Option<&[KeyKind]>,
    rows: &[&[u8]],
    versions: &[i64],
    hashes: &[Option<i64>],
    xids: &[i64],
) -> Result<Encoded, Refusal> {
    // a member's column by its name; a name twice in a row: the last one, as the
    // guarded path's json_to_record reads it
    let index: HashMap<&str, usize> = table
        .columns
        .iter()
        .enumerate()
        .map(|(c, (name, _))| (name.as_str(), c))
        .collect();
    let mut out = Vec::with_capacity(rows.iter().map(|r| r.len()).sum::<usize>() + rows.len());
    let mut vout = key_kinds.map(|_| Vec::with_capacity(rows.len() * 48));
    let mut keys: Vec<Vec<u8>> = if key_kinds.is_some() {
        Vec::new()
    } else {
        table.key_at.iter().map(|_| vec![b'[']).collect()
    };
    let mut slots: Vec<Option<&RawValue>> = vec![None; table.columns.len()];
    let mut key_line = Vec::with_capacity(64);
    for (i, row) in rows.iter().enumerate() {
        let fields = Fields::parse(row)?;
        slots.iter_mut().for_each(|s| *s = None);
        for (name, raw) in fields.0 {
            if let Some(&c) = index.get(name) {
                slots[c] = Some(raw);
            }
        }
        for (c, (_, kind)) in table.columns.iter().enumerate() {
            if c > 0 {
                out.push(b'\t');
            }
            field(&mut out, *kind, slots[c])?;
        }
        out.push(b'\n');
        match (&mut vout, key_kinds) {
            (Some(v), Some(kinds)) => {
                key_line.clear();
                let typed: Vec<_> = kinds
                    .iter()
                    .copied()
                    .zip(table.key_at.iter().map(|&c| slots[c]))
                    .collect();
                key_text(&mut key_line, &typed).map_err(|_| Refusal::KeyText)?;
                v.extend_from_slice(table.tbl.to_string().as_bytes());
                v.push(b'\t');
                escape(v, &key_line);
                v.extend_from_slice(format!("\t{}\tf\t\\N\t", versions[i]).as_bytes());
                match hashes[i] {
                    Some(h) => v.extend_from_slice(h.to_string().as_bytes()),
                    None => v.extend_from_slice(b"\\N"),
                }
                v.extend_from_slice(format!("\t{}\n", xids[i]).as_bytes());
            }
            _ => {
                for (slot, &c) in table.key_at.iter().enumerate() {
                    let k = &mut keys[slot];
                    if i > 0 {
                        k.push(b',');
                    }
                    k.extend_from_slice(slots[c].map(|r| r.get()).unwrap_or("null").as_bytes());
                }
            }
        }
    }
    for k in keys.iter_mut() {
        k.push(b']');
    }
    Ok(Encoded {
        rows: out,
        versions: vout,
        keys,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(kind: Kind, json: &str) -> Result<String, NotPlain> {
        let raw: &RawValue = serde_json::from_str(json).unwrap();
        let mut out = Vec::new();
        field(&mut out, kind, Some(raw))?;
        Ok(String::from_utf8(out).unwrap())
    }

    #[test]
    fn scalars_as_their_type_input_reads_them() {
        assert_eq!(one(Kind::Number, "42").unwrap(), "42");
        assert_eq!(one(Kind::Number, "-1.5e+300").unwrap(), "-1.5e+300");
        assert_eq!(one(Kind::Number, "\"NaN\"").unwrap(), "NaN");
        assert_eq!(one(Kind::Boolean, "true").unwrap(), "t");
        assert_eq!(one(Kind::Boolean, "false").unwrap(), "f");
        assert_eq!(one(Kind::Text, "null").unwrap(), "\\N");
        assert_eq!(
            one(Kind::Text, "\"a\\tb\\\\c\\nd\\u00e9\"").unwrap(),
            "a\\tb\\\\c\\ndé"
        );
        assert_eq!(one(Kind::Text, "\"\\\\N\"").unwrap(), "\\\\N"); // the text \N, not NULL
    }

    #[test]
    fn json_keeps_its_exact_text() {
        assert_eq!(
            one(Kind::Json, "{\"a\": [1, 2.50]}").unwrap(),
            "{\"a\": [1, 2.50]}"
        );
        assert_eq!(one(Kind::Json, "\"x\\ty\"").unwrap(), "\"x\\\\ty\"");
        assert_eq!(one(Kind::Json, "null").unwrap(), "\\N");
    }

    #[test]
    fn bytea_from_base64_to_hex() {
        assert_eq!(one(Kind::Bytea, "\"AP8=\"").unwrap(), "\\\\x00ff");
        assert_eq!(one(Kind::Bytea, "\"\"").unwrap(), "\\\\x");
        assert!(one(Kind::Bytea, "\"not base64!\"").is_err());
        assert!(one(Kind::Bytea, "12").is_err());
    }

    #[test]
    fn expanded_years_and_nested_values_are_not_plain() {
        assert_eq!(
            one(Kind::Time, "\"2026-11-29T10:00:00+00:00\"").unwrap(),
            "2026-11-29T10:00:00+00:00"
        );
        assert_eq!(one(Kind::Time, "\"infinity\"").unwrap(), "infinity");
        for y in [
            "\"-0043-03-15\"",
            "\"+12345-01-01\"",
            "\"0000-01-01\"",
            "\"-infinity\"",
        ] {
            assert!(one(Kind::Time, y).is_err(), "{y}");
        }
        assert!(one(Kind::Text, "[1]").is_err());
        assert!(one(Kind::Number, "{}").is_err());
        assert!(one(Kind::Time, "1").is_err());
    }

    fn key(values: &[(KeyKind, &str)]) -> Result<String, NotPlain> {
        let raws: Vec<Box<RawValue>> = values
            .iter()
            .map(|(_, j)| RawValue::from_string(j.to_string()).unwrap())
            .collect();
        let typed: Vec<_> = values
            .iter()
            .zip(&raws)
            .map(|((k, _), r)| (*k, Some(&**r)))
            .collect();
        let mut out = Vec::new();
        key_text(&mut out, &typed)?;
        Ok(String::from_utf8(out).unwrap())
    }

    #[test]
    fn key_text_as_record_out_prints_it() {
        assert_eq!(key(&[(KeyKind::Integer, "42")]).unwrap(), "(42)");
        assert_eq!(
            key(&[(KeyKind::Integer, "-7"), (KeyKind::Text, "\"ab\"")]).unwrap(),
            "(-7,ab)"
        );
        assert_eq!(key(&[(KeyKind::Text, "\"\"")]).unwrap(), "(\"\")");
        assert_eq!(key(&[(KeyKind::Text, "\"a b\"")]).unwrap(), "(\"a b\")");
        assert_eq!(
            key(&[(KeyKind::Text, "\"a\\\"b\\\\c\"")]).unwrap(),
            "(\"a\"\"b\\\\c\")"
        );
        assert_eq!(key(&[(KeyKind::Text, "\"(x,y)\"")]).unwrap(), "(\"(x,y)\")");
        assert_eq!(key(&[(KeyKind::Text, "null")]).unwrap(), "()");
        assert!(key(&[(KeyKind::Integer, "1.0")]).is_err());
        assert!(key(&[(KeyKind::Integer, "1e3")]).is_err());
        assert!(key(&[(KeyKind::Integer, "\"7\"")]).is_err());
        assert!(key(&[(KeyKind::Uuid, "\"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11\"")]).is_err());
        assert!(key(&[(KeyKind::Uuid, "\"a0eebc999c0b-4ef8-bb6d-6bb9-bd380a11\"")]).is_err());
        assert!(key(&[(KeyKind::Text, "\"caf\\u00e9\"")]).is_err()); // the server's to print
        assert_eq!(
            key(&[(KeyKind::Uuid, "\"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11\"")]).unwrap(),
            "(a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11)"
        );
    }

    #[test]
    fn a_batch_with_and_without_key_texts() {
        let columns = vec![
            ("id".to_string(), Kind::Number),
            ("v".to_string(), Kind::Text),
        ];
        let rows: Vec<&[u8]> = vec![b"{\"v\":\"a\\tb\",\"id\":1}", b"{\"id\":2}"];
        let kinds = [KeyKind::Integer];
        let t = Table {
            columns: &columns,
            key_at: &[0],
            key_kinds: Some(&kinds),
            tbl: 9,
        };
        let e = encode(&t, &rows, &[100, 200], &[Some(5), None], &[0, 7]).unwrap();
        assert_eq!(e.rows, b"1\ta\\tb\n2\t\\N\n");
        assert_eq!(
            e.versions.unwrap(),
            b"9\t(1)\t100\tf\t\\N\t5\t0\n9\t(2)\t200\tf\t\\N\t\\N\t7\n"
        );
        let t = Table {
            columns: &columns,
            key_at: &[0],
            key_kinds: None,
            tbl: 9,
        };
        let e = encode(&t, &rows, &[100, 200], &[Some(5), None], &[0, 7]).unwrap();
        assert!(e.versions.is_none());
        assert_eq!(e.keys, vec![b"[1,2]".to_vec()]);
        assert!(encode(&t, &[b"[1]"], &[1], &[None], &[0]).is_err());
        assert!(encode(&t, &[b"{\"i\\u0064\":1}"], &[1], &[None], &[0]).is_err());
    }

    #[test]
    fn a_name_twice_takes_the_last_and_a_key_only_the_server_prints_goes_as_arrays() {
        let columns = vec![
            ("k".to_string(), Kind::Text),
            ("v".to_string(), Kind::Number),
        ];
        let kinds = [KeyKind::Text];
        let t = Table {
            columns: &columns,
            key_at: &[0],
            key_kinds: Some(&kinds),
            tbl: 1,
        };
        let rows: Vec<&[u8]> = vec![
            b"{\"k\":\"a\",\"v\":1,\"v\":2,\"x\":[3]}",
            b"{\"k\":\"caf\\u00e9\",\"v\":3}",
        ];
        let e = encode(&t, &rows, &[10, 11], &[None, None], &[0, 0]).unwrap();
        assert_eq!(e.rows, "a\t2\ncafé\t3\n".as_bytes());
        assert!(e.versions.is_none()); // the second key is the server's to print
        assert_eq!(e.keys, vec!["[\"a\",\"caf\\u00e9\"]".as_bytes().to_vec()]);
    }
}
