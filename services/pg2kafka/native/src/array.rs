//! Array literals: Postgres' array text output (`{1,NULL,"a b",{2,3}}`) to nested JSON
//! arrays, each element converted by the element's kind (`conv::convert`).
//!
//! Contract: quoted elements lose their quotes and backslash escapes; unquoted elements
//! lose the whitespace Postgres' own parser trims; an unquoted `NULL` is null (a quoted
//! one is the text); sub-arrays nest; a leading dimension decoration (`[0:2]=`) is
//! skipped; text after the closing brace is ignored. A literal that is not an array, is
//! unterminated, nests deeper than `MAX_ARRAY_DEPTH` or has an element that does not
//! convert is an Err (the whole value), with `out` holding a partial value the caller
//! truncates.

use crate::conv::{convert, Conv};

/// An array literal (`{1,NULL,"a b",{2,3}}`) as nested JSON arrays: quoting, backslash
/// escapes, NULL and nesting; a leading dimension decoration (`[0:2]={...}`) is skipped.
pub(crate) fn array(
    out: &mut Vec<u8>,
    literal: &str,
    delim: u8,
    elem: &Conv,
) -> Result<(), String> {
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

// Expected values are what the extension returns for the same literals (the Python
// tests tests/unit/pg2kafka/test_types.py and test_native.py expect the same).
#[cfg(test)]
mod tests {
    use super::*;

    fn conv(delim: u8, elem: Conv, lit: &str) -> Result<String, String> {
        let mut out = Vec::new();
        array(&mut out, lit, delim, &elem)?;
        Ok(String::from_utf8(out).unwrap())
    }

    fn ints(lit: &str) -> Result<String, String> {
        conv(b',', Conv::Int, lit)
    }

    fn texts(lit: &str) -> Result<String, String> {
        conv(b',', Conv::Text, lit)
    }

    #[test]
    fn elements_convert_by_kind_and_unquoted_null_is_null() {
        assert_eq!(ints("{1,2,NULL}").unwrap(), "[1,2,null]");
        assert_eq!(ints("{-007}").unwrap(), "[-7]");
        assert_eq!(
            conv(b',', Conv::Bool, "{t,f,NULL}").unwrap(),
            "[true,false,null]"
        );
        assert_eq!(
            conv(b',', Conv::Float, r#"{1.5,NaN,-Infinity,1e20,"2"}"#).unwrap(),
            r#"[1.5,"NaN","-Infinity",1e+20,2.0]"#
        );
    }

    #[test]
    fn quoted_elements_lose_quotes_and_backslash_escapes() {
        assert_eq!(
            texts(r#"{"a b","c\"d",NULL,"NULL"}"#).unwrap(),
            r#"["a b","c\"d",null,"NULL"]"#
        );
        assert_eq!(
            texts(r#"{""," a ",abc,"\\"}"#).unwrap(),
            r#"[""," a ","abc","\\"]"#
        );
        assert_eq!(texts(r#"{"é😀","\n"}"#).unwrap(), r#"["é😀","n"]"#);
        assert_eq!(texts(r#"{" NULL"}"#).unwrap(), r#"[" NULL"]"#);
        // bytea elements are quoted with their backslash escaped
        assert_eq!(
            conv(b',', Conv::Bytea, r#"{"\\x00ff",NULL}"#).unwrap(),
            r#"["AP8=",null]"#
        );
        // json elements are embedded as their text
        assert_eq!(
            conv(b',', Conv::Json, r#"{"{\"a\": 1}","[1, 2.5]",null}"#).unwrap(),
            r#"[{"a": 1},[1, 2.5],null]"#
        );
    }

    #[test]
    fn unquoted_elements_lose_only_the_whitespace_postgres_trims() {
        assert_eq!(texts("{ x ,\ty\n}").unwrap(), r#"["x","y"]"#);
        assert_eq!(texts("{\u{b}x\u{c}}").unwrap(), r#"["x"]"#);
        assert_eq!(texts("{ NULL }").unwrap(), "[null]");
        assert_eq!(texts("{a b}").unwrap(), r#"["a b"]"#);
        // a no-break space is not whitespace to Postgres' array parser
        assert_eq!(texts("{\u{a0}x}").unwrap(), "[\"\u{a0}x\"]");
    }

    #[test]
    fn sub_arrays_nest_and_empty_arrays_are_empty() {
        assert_eq!(ints("{}").unwrap(), "[]");
        assert_eq!(ints("{{},{}}").unwrap(), "[[],[]]");
        assert_eq!(ints("{{1,2},{3,4}}").unwrap(), "[[1,2],[3,4]]");
        assert_eq!(ints("{{1,NULL},{NULL,4}}").unwrap(), "[[1,null],[null,4]]");
        assert_eq!(
            ints(&format!("{}1{}", "{".repeat(6), "}".repeat(6))).unwrap(),
            "[[[[[[1]]]]]]"
        );
    }

    #[test]
    fn the_delimiter_is_the_types() {
        assert_eq!(
            conv(b';', Conv::Float, "{1.5;NaN;2e20}").unwrap(),
            r#"[1.5,"NaN",2e+20]"#
        );
        assert_eq!(conv(b';', Conv::Text, "{a,b;c}").unwrap(), r#"["a,b","c"]"#);
    }

    #[test]
    fn elements_of_dates_and_timestamps() {
        assert_eq!(
            conv(
                b',',
                Conv::Timestamptz,
                r#"{"2024-02-29 13:14:15+00","0044-03-15 12:00:00-05 BC",infinity}"#
            )
            .unwrap(),
            r#"["2024-02-29T13:14:15+00:00","-0043-03-15T12:00:00-05:00","infinity"]"#
        );
        assert_eq!(
            conv(
                b',',
                Conv::Date,
                r#"{2024-02-29,"0044-03-15 BC",12345-01-01}"#
            )
            .unwrap(),
            r#"["2024-02-29","-0043-03-15","+12345-01-01"]"#
        );
    }

    #[test]
    fn dimension_decorations_are_skipped_and_trailing_text_ignored() {
        assert_eq!(ints("[0:1]={7,8}").unwrap(), "[7,8]");
        assert_eq!(ints("[0:1][1:2]={{1,2},{3,4}}").unwrap(), "[[1,2],[3,4]]");
        assert_eq!(ints("{1}x").unwrap(), "[1]");
    }

    #[test]
    fn what_is_not_an_array_literal_is_refused() {
        assert_eq!(ints("1,2"), Err(r#"malformed array literal: "1,2""#.into()));
        assert_eq!(ints(""), Err(r#"malformed array literal: """#.into()));
        assert_eq!(
            ints("[0:1]"),
            Err(r#"malformed array literal: "[0:1]""#.into())
        );
        assert_eq!(
            ints("{1,2"),
            Err(r#"unterminated array literal: "{1,2""#.into())
        );
        // a backslash at the very end
        assert_eq!(
            texts(r#"{"a\"#),
            Err(r#"unterminated array literal: "{\"a\\""#.into())
        );
        // an element that does not convert: the whole value
        assert_eq!(ints("{1,x}"), Err(r#"not an integer: "x""#.into()));
    }

    #[test]
    fn nesting_deeper_than_postgres_writes_is_refused_not_a_crash() {
        let deep = "{".repeat(MAX_ARRAY_DEPTH);
        assert_eq!(
            ints(&format!("{deep}{}", "}".repeat(MAX_ARRAY_DEPTH))).unwrap(),
            format!("{}{}", "[".repeat(64), "]".repeat(64))
        );
        assert_eq!(
            ints(&deep),
            Err(format!("unterminated array literal: {deep:?}"))
        );
        assert_eq!(
            ints(&"{".repeat(1_000_000)),
            Err("array literal nested deeper than 64 levels".into())
        );
    }
}
