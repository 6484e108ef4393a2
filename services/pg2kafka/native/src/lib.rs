//! pg2kafka's per-event path, compiled: a pgoutput TupleData to Python values, and a row
//! of Postgres text values to the JSON of a change event's row and key.
//!
//! The conversion rules of the type table (`shared/contract/pgtypes.py` names a kind per
//! type; this file implements the kinds) live here and only here. Python keeps the
//! orchestration: which relation, which kinds, the envelope, Kafka. Output is
//! byte-for-byte what `orjson.dumps` writes for the same values (strings escaped as it
//! escapes them, floats in its notation), so a key computed here and one computed from a
//! parsed dict by orjson are the same Kafka key.
//!
//! (A little over 600 lines with its unit tests: the kinds of the type table share the
//! writers below, and splitting them would spread one conversion table over files.)
//!
//! A value that does not convert (a malformed array literal, say) is never dropped and
//! never stops the stream: it travels as its text, and the caller is told which column
//! and why (to count and log it).

// PyO3 0.22's #[pyfunction] expansion trips this lint on newer clippy (its own code).
#![allow(clippy::useless_conversion)]

use base64::Engine as _;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

/// How one column's text output becomes a JSON value (the kinds of the type table).
#[derive(Clone, Debug)]
enum Conv {
    /// `s`: the text itself, as a JSON string.
    Text,
    /// `i`: an integer, as a JSON number.
    Int,
    /// `f`: a double; NaN and the infinities stay strings (JSON has no such numbers).
    Float,
    /// `b`: `t` is true, anything else false.
    Bool,
    /// `j`: json / jsonb text embedded as is (line breaks become spaces).
    Json,
    /// `x`: bytea's hex output as base64.
    Bytea,
    /// `d`: a date, ISO-8601 with expanded years.
    Date,
    /// `t`: a timestamp without time zone, `T`-separated.
    Timestamp,
    /// `z`: a timestamp with time zone, `T`-separated, offset as `+hh:mm`.
    Timestamptz,
    /// `a<delimiter><element spec>`: an array literal, element by element.
    Array(u8, Box<Conv>),
}

fn parse_spec(spec: &[u8]) -> Result<(Conv, usize), String> {
    let conv = match spec.first() {
        None => return Err("empty converter spec".into()),
        Some(b'a') => {
            if spec.len() < 3 {
                return Err("array spec needs a delimiter and an element spec".into());
            }
            let (elem, used) = parse_spec(&spec[2..])?;
            return Ok((Conv::Array(spec[1], Box::new(elem)), used + 2));
        }
        Some(b's') => Conv::Text,
        Some(b'i') => Conv::Int,
        Some(b'f') => Conv::Float,
        Some(b'b') => Conv::Bool,
        Some(b'j') => Conv::Json,
        Some(b'x') => Conv::Bytea,
        Some(b'd') => Conv::Date,
        Some(b't') => Conv::Timestamp,
        Some(b'z') => Conv::Timestamptz,
        Some(c) => return Err(format!("unknown converter kind {:?}", *c as char)),
    };
    Ok((conv, 1))
}

fn conv_of(spec: &str) -> PyResult<Conv> {
    let (conv, used) = parse_spec(spec.as_bytes()).map_err(PyValueError::new_err)?;
    if used != spec.len() {
        return Err(PyValueError::new_err(format!(
            "trailing characters in converter spec {spec:?}"
        )));
    }
    Ok(conv)
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// A JSON string as orjson writes it: `"` and `\` escaped, control characters as `\b \t
/// \n \f \r` or `\u00xx`, everything else (non-ASCII included) as is.
fn write_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => {
                out.extend_from_slice(&bytes[start..i]);
                out.extend_from_slice(b"\\u00");
                out.push(HEX[(b >> 4) as usize]);
                out.push(HEX[(b & 0xf) as usize]);
                start = i + 1;
                continue;
            }
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        out.extend_from_slice(short);
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// An integer's text as orjson writes the number: Postgres writes integers canonically,
/// but `-0` or leading zeros would still read as the same number (Python's int() did).
fn write_int(out: &mut Vec<u8>, v: &str) -> Result<(), String> {
    let (neg, digits) = match v.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, v),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("not an integer: {v:?}"));
    }
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        out.push(b'0');
        return Ok(());
    }
    if neg {
        out.push(b'-');
    }
    out.extend_from_slice(digits.as_bytes());
    Ok(())
}

/// The shortest digits that read back as `f` (ties to even, as Python's repr and orjson
/// choose them) and the decimal exponent of the first: 123.45 is ("12345", 2).
fn shortest_digits(f: f64) -> (bool, Vec<u8>, i32) {
    let mut buf = ryu::Buffer::new();
    let text = buf.format_finite(f); // "1e16", "1.5e-7", "0.0001", "123.45"
    let (neg, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exp) = match text.find(['e', 'E']) {
        Some(i) => (&text[..i], text[i + 1..].parse::<i32>().unwrap_or(0)),
        None => (text, 0),
    };
    let (int_part, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all: Vec<u8> = int_part.bytes().chain(frac.bytes()).collect();
    let lead = all.iter().take_while(|b| **b == b'0').count();
    if lead == all.len() {
        return (neg, vec![b'0'], 0);
    }
    let mut digits = all[lead..].to_vec();
    while digits.len() > 1 && digits.last() == Some(&b'0') {
        digits.pop();
    }
    let x = exp + int_part.len() as i32 - 1 - lead as i32;
    (neg, digits, x)
}

/// A finite double in orjson's notation: the shortest digits; plain decimals for decimal
/// exponents -5..=15 (`100.0`, `0.00001`), otherwise `d.ddde±x` (`1e+16`, `1.5e-7`).
fn write_f64(out: &mut Vec<u8>, f: f64) {
    let (neg, digits, x) = shortest_digits(f);
    let n = digits.len() as i32;
    if neg {
        out.push(b'-');
    }
    if (-5..16).contains(&x) {
        if x >= 0 {
            let int_len = x + 1;
            if n <= int_len {
                out.extend_from_slice(&digits);
                out.resize(out.len() + (int_len - n) as usize, b'0');
                out.extend_from_slice(b".0");
            } else {
                out.extend_from_slice(&digits[..int_len as usize]);
                out.push(b'.');
                out.extend_from_slice(&digits[int_len as usize..]);
            }
        } else {
            out.extend_from_slice(b"0.");
            out.resize(out.len() + (-x - 1) as usize, b'0');
            out.extend_from_slice(&digits);
        }
    } else {
        out.push(digits[0]);
        if n > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits[1..]);
        }
        out.push(b'e');
        out.push(if x < 0 { b'-' } else { b'+' });
        out.extend_from_slice(x.unsigned_abs().to_string().as_bytes());
    }
}

/// A year of four digits, not BC: the text needs no rewriting (the common case).
fn common_era(v: &str) -> bool {
    v.len() >= 5 && v.as_bytes()[4] == b'-' && !v.ends_with('C')
}

/// Postgres writes `0044-03-15 BC` and `12345-01-01`; ISO-8601's expanded form, with
/// astronomical years, is `-0043-03-15` and `+12345-01-01` (what Spark and Java's ISO
/// parsers read). `infinity` / `-infinity` stay as they are.
fn expanded_year(v: &str) -> Result<String, String> {
    if v == "infinity" || v == "-infinity" {
        return Ok(v.to_string());
    }
    let (v, bc) = match v.strip_suffix(" BC") {
        Some(rest) => (rest, true),
        None => (v, false),
    };
    let dash = v.find('-').ok_or_else(|| format!("no year in {v:?}"))?;
    let mut year: i64 = v[..dash]
        .parse()
        .map_err(|_| format!("bad year in {v:?}"))?;
    if bc {
        year = 1 - year;
    }
    let head = if (0..=9999).contains(&year) {
        format!("{year:04}")
    } else {
        format!("{year:+05}")
    };
    Ok(head + &v[dash..])
}

fn timestamp(v: &str, with_zone: bool) -> Result<String, String> {
    let mut s = if common_era(v) {
        v.to_string()
    } else {
        let s = expanded_year(v)?;
        if s == "infinity" || s == "-infinity" {
            return Ok(s);
        }
        s
    };
    s = s.replacen(' ', "T", 1);
    if with_zone {
        // "+00" / "-05" / "+05:30": ISO-8601 wants hh:mm.
        let sign = match (s.rfind('+'), s.rfind('-')) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        if let Some(at) = sign {
            if at > 10 && s.len() - at - 1 == 2 {
                s.push_str(":00");
            }
        }
    }
    Ok(s)
}

fn bytea(out: &mut Vec<u8>, v: &str) -> Result<(), String> {
    let raw: Vec<u8> = match v.strip_prefix("\\x") {
        Some(hex) => {
            let h = hex.as_bytes();
            if h.len() % 2 != 0 {
                return Err("odd number of hex digits in bytea".into());
            }
            let nibble = |c: u8| -> Result<u8, String> {
                match c {
                    b'0'..=b'9' => Ok(c - b'0'),
                    b'a'..=b'f' => Ok(c - b'a' + 10),
                    b'A'..=b'F' => Ok(c - b'A' + 10),
                    _ => Err(format!("non-hex digit {:?} in bytea", c as char)),
                }
            };
            h.chunks(2)
                .map(|p| Ok(nibble(p[0])? << 4 | nibble(p[1])?))
                .collect::<Result<_, String>>()?
        }
        None => v.as_bytes().to_vec(), // the escape format: not expected (bytea_output=hex)
    };
    out.push(b'"');
    out.extend_from_slice(
        base64::engine::general_purpose::STANDARD
            .encode(raw)
            .as_bytes(),
    );
    out.push(b'"');
    Ok(())
}

/// One value, appended to `out`; on Err, `out` may hold a partial value (the caller
/// truncates it).
fn convert(out: &mut Vec<u8>, conv: &Conv, v: &str) -> Result<(), String> {
    match conv {
        Conv::Text => write_str(out, v),
        Conv::Int => write_int(out, v)?,
        Conv::Float => match v.parse::<f64>() {
            Ok(f) if f.is_finite() => write_f64(out, f),
            _ => write_str(out, v), // NaN / Infinity: JSON has no such numbers
        },
        Conv::Bool => out.extend_from_slice(if v == "t" { b"true" } else { b"false" }),
        Conv::Json => {
            // Embedded unparsed (exact: a parse would round big numbers). Line breaks can
            // only be whitespace between tokens: spaces keep an event on one line.
            out.extend(
                v.bytes()
                    .map(|b| if b == b'\n' || b == b'\r' { b' ' } else { b }),
            );
        }
        Conv::Bytea => bytea(out, v)?,
        Conv::Date => {
            if common_era(v) {
                write_str(out, v)
            } else {
                write_str(out, &expanded_year(v)?)
            }
        }
        Conv::Timestamp => write_str(out, &timestamp(v, false)?),
        Conv::Timestamptz => write_str(out, &timestamp(v, true)?),
        Conv::Array(delim, elem) => array(out, v, *delim, elem)?,
    }
    Ok(())
}

/// An array literal (`{1,NULL,"a b",{2,3}}`) as nested JSON arrays: quoting, backslash
/// escapes, NULL and nesting; a leading dimension decoration (`[0:2]={...}`) is skipped.
fn array(out: &mut Vec<u8>, literal: &str, delim: u8, elem: &Conv) -> Result<(), String> {
    let lit = if literal.starts_with('[') {
        match literal.find('=') {
            Some(i) => &literal[i + 1..],
            None => literal,
        }
    } else {
        literal
    };
    let mut pos = 0;
    array_level(out, lit, &mut pos, delim, elem, 0)
}

/// Postgres arrays have at most 6 dimensions; deeper nesting is not an array Postgres
/// wrote, and must not run the parser's recursion out of stack.
const MAX_ARRAY_DEPTH: usize = 64;

/// What Postgres' array parser takes for whitespace around an unquoted element.
fn array_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0b' | '\x0c')
}

fn array_level(
    out: &mut Vec<u8>,
    lit: &str,
    pos: &mut usize,
    delim: u8,
    elem: &Conv,
    depth: usize,
) -> Result<(), String> {
    if depth >= MAX_ARRAY_DEPTH {
        return Err(format!(
            "array literal nested deeper than {MAX_ARRAY_DEPTH} levels"
        ));
    }
    let b = lit.as_bytes();
    let n = b.len();
    if *pos >= n || b[*pos] != b'{' {
        return Err(format!("malformed array literal: {lit:?}"));
    }
    *pos += 1;
    out.push(b'[');
    if *pos < n && b[*pos] == b'}' {
        *pos += 1;
        out.push(b']');
        return Ok(());
    }
    let mut first = true;
    while *pos < n {
        if !first {
            out.push(b',');
        }
        first = false;
        let ch = b[*pos];
        if ch == b'{' {
            array_level(out, lit, pos, delim, elem, depth + 1)?;
        } else if ch == b'"' {
            *pos += 1;
            let mut buf: Vec<u8> = Vec::new();
            while *pos < n && b[*pos] != b'"' {
                if b[*pos] == b'\\' {
                    *pos += 1;
                    if *pos >= n {
                        return Err(format!("unterminated array literal: {lit:?}"));
                    }
                }
                buf.push(b[*pos]);
                *pos += 1;
            }
            *pos += 1; // the closing quote
                       // Only ASCII backslashes were taken out of valid UTF-8: still valid.
            let text = String::from_utf8(buf).map_err(|e| e.to_string())?;
            convert(out, elem, &text)?;
        } else {
            let start = *pos;
            while *pos < n && b[*pos] != delim && b[*pos] != b'}' {
                *pos += 1;
            }
            let word = lit[start..*pos].trim_matches(array_space);
            if word == "NULL" {
                out.extend_from_slice(b"null");
            } else {
                convert(out, elem, word)?;
            }
        }
        if *pos >= n {
            break;
        }
        if b[*pos] == delim {
            *pos += 1;
        } else if b[*pos] == b'}' {
            *pos += 1;
            out.push(b']');
            return Ok(());
        }
    }
    Err(format!("unterminated array literal: {lit:?}"))
}

/// One value converted by `spec`, as JSON bytes; ValueError when it does not convert.
#[pyfunction]
fn convert_value<'py>(py: Python<'py>, spec: &str, value: &str) -> PyResult<Bound<'py, PyBytes>> {
    let conv = conv_of(spec)?;
    let mut out = Vec::with_capacity(value.len() + 2);
    convert(&mut out, &conv, value).map_err(PyValueError::new_err)?;
    Ok(PyBytes::new_bound(py, &out))
}

/// The columns of one relation and how each converts: turns rows of text values into the
/// JSON of the event's row and key. Built once per relation (and again when a Relation or
/// Type message changes it); `encode` runs per row.
#[pyclass(frozen, module = "services.pg2kafka._native")]
struct RowEncoder {
    /// Per column: `"name":`, escaped once.
    fields: Vec<Vec<u8>>,
    names: Vec<Py<PyString>>,
    convs: Vec<Conv>,
    key_columns: Vec<usize>,
}

#[pymethods]
impl RowEncoder {
    #[new]
    fn new(
        py: Python<'_>,
        names: Vec<String>,
        specs: Vec<String>,
        key: Vec<bool>,
    ) -> PyResult<Self> {
        if names.len() != specs.len() || names.len() != key.len() {
            return Err(PyValueError::new_err(
                "names, specs and key differ in length",
            ));
        }
        let mut fields = Vec::with_capacity(names.len());
        for name in &names {
            let mut f = Vec::with_capacity(name.len() + 3);
            write_str(&mut f, name);
            f.push(b':');
            fields.push(f);
        }
        Ok(RowEncoder {
            fields,
            names: names
                .iter()
                .map(|n| PyString::new_bound(py, n).unbind())
                .collect(),
            convs: specs.iter().map(|s| conv_of(s)).collect::<PyResult<_>>()?,
            key_columns: key
                .iter()
                .enumerate()
                .filter(|(_, k)| **k)
                .map(|(i, _)| i)
                .collect(),
        })
    }

    /// One row: a tuple of str (the text output), None (SQL NULL) or anything else (the
    /// unchanged-TOAST marker: the column is left out of the row and named in `toast`).
    /// Returns (row JSON, key JSON — None when the relation has no key columns; a key
    /// column left out is null —, the unchanged-TOAST column names or None, the
    /// `(column, reason)` of values kept as text or None).
    #[allow(clippy::type_complexity)]
    fn encode<'py>(
        &self,
        py: Python<'py>,
        values: &Bound<'py, PyTuple>,
    ) -> PyResult<(
        Bound<'py, PyBytes>,
        Option<Bound<'py, PyBytes>>,
        Option<Bound<'py, PyList>>,
        Option<Bound<'py, PyList>>,
    )> {
        let ncols = self.convs.len();
        if values.len() != ncols {
            return Err(PyValueError::new_err(format!(
                "{} values for {} columns",
                values.len(),
                ncols
            )));
        }
        let mut out: Vec<u8> = Vec::with_capacity(64 + 24 * ncols);
        let mut spans: Vec<Option<(usize, usize)>> = vec![None; ncols];
        let mut toast: Option<Bound<'py, PyList>> = None;
        let mut kept: Option<Bound<'py, PyList>> = None;
        out.push(b'{');
        let mut first = true;
        for (i, value) in values.iter().enumerate() {
            let py_str = if value.is_none() {
                None
            } else if let Ok(py_str) = value.downcast::<PyString>() {
                Some(py_str.clone())
            } else {
                toast
                    .get_or_insert_with(|| PyList::empty_bound(py))
                    .append(self.names[i].bind(py))?;
                continue;
            };
            if !first {
                out.push(b',');
            }
            first = false;
            out.extend_from_slice(&self.fields[i]);
            let start = out.len();
            match &py_str {
                None => out.extend_from_slice(b"null"),
                Some(py_str) => {
                    let v = py_str.to_str()?;
                    if let Err(reason) = convert(&mut out, &self.convs[i], v) {
                        // Bad input never stops the stream and never vanishes: the value
                        // travels as the server's text; the caller counts and logs it.
                        out.truncate(start);
                        write_str(&mut out, v);
                        kept.get_or_insert_with(|| PyList::empty_bound(py))
                            .append((self.names[i].bind(py), reason))?;
                    }
                }
            }
            spans[i] = Some((start, out.len()));
        }
        out.push(b'}');
        let key = if self.key_columns.is_empty() {
            None
        } else {
            let mut k: Vec<u8> = Vec::with_capacity(32);
            k.push(b'{');
            for (n, &i) in self.key_columns.iter().enumerate() {
                if n > 0 {
                    k.push(b',');
                }
                k.extend_from_slice(&self.fields[i]);
                match spans[i] {
                    Some((a, b)) => k.extend_from_slice(&out[a..b]),
                    None => k.extend_from_slice(b"null"),
                }
            }
            k.push(b'}');
            Some(PyBytes::new_bound(py, &k))
        };
        Ok((PyBytes::new_bound(py, &out), key, toast, kept))
    }
}

/// A pgoutput TupleData at `pos` of `buf`: (values, the position after it). Values are
/// str for text, None for NULL, `toast` for an unchanged TOASTed value; text that is not
/// UTF-8 is handed to `undecodable(raw bytes)`, whose str is the value. ValueError for a
/// message that does not follow the protocol.
#[pyfunction]
fn decode_tuple<'py>(
    py: Python<'py>,
    buf: &[u8],
    pos: usize,
    toast: &Bound<'py, PyAny>,
    undecodable: &Bound<'py, PyAny>,
) -> PyResult<(Bound<'py, PyTuple>, usize)> {
    let end = buf.len();
    let mut pos = pos;
    let truncated = |what: &str| PyValueError::new_err(format!("truncated message: {what}"));
    if pos > end || end - pos < 2 {
        return Err(truncated("tuple without column count"));
    }
    let ncols = i16::from_be_bytes([buf[pos], buf[pos + 1]]);
    pos += 2;
    let mut values: Vec<PyObject> = Vec::with_capacity(ncols.max(0) as usize);
    for _ in 0..ncols {
        if pos >= end {
            return Err(truncated("missing column"));
        }
        let kind = buf[pos];
        pos += 1;
        match kind {
            b't' => {
                if pos + 4 > end {
                    return Err(truncated("missing length"));
                }
                let n = i32::from_be_bytes([buf[pos], buf[pos + 1], buf[pos + 2], buf[pos + 3]]);
                pos += 4;
                if n < 0 || pos + n as usize > end {
                    return Err(truncated(&format!("value of {n} bytes")));
                }
                let raw = &buf[pos..pos + n as usize];
                pos += n as usize;
                values.push(match std::str::from_utf8(raw) {
                    Ok(s) => PyString::new_bound(py, s).into_any().unbind(),
                    Err(_) => undecodable.call1((PyBytes::new_bound(py, raw),))?.unbind(),
                });
            }
            b'n' => values.push(py.None()),
            b'u' => values.push(toast.clone().unbind()),
            // 'b' (binary) only appears with the binary option, which is never requested.
            other => {
                return Err(PyValueError::new_err(format!(
                    "unsupported tuple column kind {:?}",
                    other as char
                )))
            }
        }
    }
    Ok((PyTuple::new_bound(py, values), pos))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RowEncoder>()?;
    m.add_function(wrap_pyfunction!(decode_tuple, m)?)?;
    m.add_function(wrap_pyfunction!(convert_value, m)?)?;
    Ok(())
}
