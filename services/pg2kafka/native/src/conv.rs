//! The conversion kinds of the type table (`shared/contract/pgtypes.py` names a kind per
//! type; this module implements them): a column's spec parsed into a `Conv`, and one
//! Postgres text value converted by it into JSON.
//!
//! Contract: a spec is a kind letter (`KINDS` in pgtypes.py), or for an array `a` + the
//! element delimiter + the element's spec (`a,i`); anything else is refused with the
//! reason. `convert` appends one JSON value to `out`, byte-for-byte what `orjson.dumps`
//! writes for the value Python would make of the text; on Err (the value does not
//! convert) `out` may hold a partial value, which the caller truncates.

use crate::array::array;
use crate::bytea::bytea;
use crate::json::{write_f64, write_int, write_str};
use crate::temporal::{common_era, expanded_year, timestamp};

/// How one column's text output becomes a JSON value (the kinds of the type table).
#[derive(Clone, Debug)]
pub(crate) enum Conv {
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

/// A whole spec (`"a,i"`) as its `Conv`; Err for an unknown kind or trailing characters.
pub(crate) fn conv_of(spec: &str) -> Result<Conv, String> {
    let (conv, used) = parse_spec(spec.as_bytes())?;
    if used != spec.len() {
        return Err(format!("trailing characters in converter spec {spec:?}"));
    }
    Ok(conv)
}

/// One value, appended to `out`; on Err, `out` may hold a partial value (the caller
/// truncates it).
pub(crate) fn convert(out: &mut Vec<u8>, conv: &Conv, v: &str) -> Result<(), String> {
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

// Expected values: tests/unit/pg2kafka/test_types.py's (orjson.dumps of the value the
// Python side expects) and test_native.py's, as the extension returns them.
#[cfg(test)]
mod tests {
    use super::*;

    fn spec(s: &str) -> String {
        format!("{:?}", conv_of(s).unwrap())
    }

    fn json(spec: &str, v: &str) -> Result<String, String> {
        let mut out = Vec::new();
        convert(&mut out, &conv_of(spec).unwrap(), v)?;
        Ok(String::from_utf8(out).unwrap())
    }

    #[test]
    fn each_kind_letter_is_its_conv() {
        let kinds = [
            ("s", "Text"),
            ("i", "Int"),
            ("f", "Float"),
            ("b", "Bool"),
            ("j", "Json"),
            ("x", "Bytea"),
            ("d", "Date"),
            ("t", "Timestamp"),
            ("z", "Timestamptz"),
        ];
        for (letter, conv) in kinds {
            assert_eq!(spec(letter), conv);
        }
    }

    #[test]
    fn an_array_spec_is_a_delimiter_and_an_element_spec() {
        assert_eq!(spec("a,i"), "Array(44, Int)");
        assert_eq!(spec("a;z"), "Array(59, Timestamptz)");
        assert_eq!(spec("a;a,i"), "Array(59, Array(44, Int))");
    }

    #[test]
    fn bad_specs_are_refused_with_the_reason() {
        let refused = [
            ("", "empty converter spec"),
            ("q", "unknown converter kind 'q'"),
            ("a,q", "unknown converter kind 'q'"),
            ("a", "array spec needs a delimiter and an element spec"),
            ("a,", "array spec needs a delimiter and an element spec"),
            ("a,a", "array spec needs a delimiter and an element spec"),
            ("ss", r#"trailing characters in converter spec "ss""#),
            ("a,ix", r#"trailing characters in converter spec "a,ix""#),
        ];
        for (s, reason) in refused {
            assert_eq!(conv_of(s).unwrap_err(), reason, "{s:?}");
        }
    }

    #[test]
    fn the_builtin_conversions() {
        let cases = [
            ("b", "t", "true"),
            ("b", "f", "false"),
            ("b", "true", "false"), // only Postgres' own `t` is true
            ("i", "-9223372036854775808", "-9223372036854775808"),
            ("i", "007", "7"),
            // numeric: the exact text
            (
                "s",
                "12345678901234567890.000000001",
                r#""12345678901234567890.000000001""#,
            ),
            ("s", "NaN", r#""NaN""#),
            ("s", r#"we"ird\"#, r#""we\"ird\\""#),
            (
                "s",
                "tab\there\u{1}é\u{2028}",
                "\"tab\\there\\u0001é\u{2028}\"",
            ),
            ("f", "1.5", "1.5"),
            ("f", "1.5e-07", "1.5e-7"),
            ("f", "1e+16", "1e+16"),
            ("f", "0.1", "0.1"),
            ("f", "-0", "-0.0"),
            ("x", r"\x00ff", r#""AP8=""#),
            ("d", "2024-02-29", r#""2024-02-29""#),
            ("d", "0044-03-15 BC", r#""-0043-03-15""#),
            ("d", "0001-01-01 BC", r#""0000-01-01""#),
            ("d", "12345-01-01", r#""+12345-01-01""#),
            ("d", "-infinity", r#""-infinity""#),
            (
                "t",
                "2024-02-29 13:14:15.123456",
                r#""2024-02-29T13:14:15.123456""#,
            ),
            ("t", "0044-03-15 12:00:00 BC", r#""-0043-03-15T12:00:00""#),
            (
                "t",
                "12345-06-07 01:02:03.5",
                r#""+12345-06-07T01:02:03.5""#,
            ),
            ("t", "infinity", r#""infinity""#),
            (
                "z",
                "2024-02-29 13:14:15.5+00",
                r#""2024-02-29T13:14:15.5+00:00""#,
            ),
            (
                "z",
                "2024-02-29 13:14:15+05:30",
                r#""2024-02-29T13:14:15+05:30""#,
            ),
            (
                "z",
                "0044-03-15 12:00:00+00 BC",
                r#""-0043-03-15T12:00:00+00:00""#,
            ),
            ("z", "-infinity", r#""-infinity""#),
            ("a,i", "{1,2,NULL}", "[1,2,null]"),
            ("a;s", "{a;b}", r#"["a","b"]"#),
        ];
        for (s, v, expected) in cases {
            assert_eq!(json(s, v).unwrap(), expected, "{s} {v:?}");
        }
    }

    #[test]
    fn doubles_json_has_no_number_for_stay_strings() {
        for v in ["NaN", "Infinity", "-Infinity", "1e309", "abc"] {
            assert_eq!(json("f", v).unwrap(), format!("{v:?}"));
        }
    }

    #[test]
    fn json_is_embedded_exactly_with_line_breaks_as_spaces() {
        let exact =
            r#"{"price": 12345678901234567.89, "id": 123456789012345678901234567890, "x": 1e309}"#;
        assert_eq!(json("j", exact).unwrap(), exact);
        assert_eq!(
            json("j", "{\n  \"a\": [1,\r\n 2]\n}").unwrap(),
            "{   \"a\": [1,   2] }"
        );
    }

    #[test]
    fn values_that_do_not_convert_say_why() {
        assert_eq!(json("i", "1.5"), Err(r#"not an integer: "1.5""#.into()));
        assert_eq!(json("x", r"\xzz"), Err("non-hex digit 'z' in bytea".into()));
        assert_eq!(json("d", "garbage"), Err(r#"no year in "garbage""#.into()));
        assert_eq!(json("t", "soon"), Err(r#"no year in "soon""#.into()));
        assert_eq!(
            json("a,i", "1,2"),
            Err(r#"malformed array literal: "1,2""#.into())
        );
    }
}
