//! bytea: Postgres' hex output (`bytea_output=hex`, which the replication connection
//! pins) to a JSON string of the bytes in standard base64 (with padding), as Python's
//! `base64.b64encode` writes it.
//!
//! Contract: `\x` + an even number of hex digits (either case) is decoded; text without
//! the `\x` prefix (the escape format, not expected) is encoded as its own bytes; odd or
//! non-hex digits are an Err and nothing is appended.

use base64::Engine as _;

/// `v` (`\x00ff`) appended to `out` as a JSON string of its base64 (`"AP8="`).
pub(crate) fn bytea(out: &mut Vec<u8>, v: &str) -> Result<(), String> {
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

// Expected values are base64.b64encode(bytes.fromhex(...)) in Python.
#[cfg(test)]
mod tests {
    use super::*;

    fn b64(v: &str) -> Result<String, String> {
        let mut out = Vec::new();
        bytea(&mut out, v)?;
        Ok(String::from_utf8(out).unwrap())
    }

    #[test]
    fn hex_output_becomes_padded_base64() {
        assert_eq!(b64(r"\x").unwrap(), r#""""#);
        assert_eq!(b64(r"\x00ff").unwrap(), r#""AP8=""#);
        assert_eq!(b64(r"\x000102").unwrap(), r#""AAEC""#);
        assert_eq!(
            b64(r"\x48656c6c6f2c20776f726c6421").unwrap(),
            r#""SGVsbG8sIHdvcmxkIQ==""#
        );
    }

    #[test]
    fn hex_digits_of_either_case() {
        assert_eq!(b64(r"\xDEADbeef").unwrap(), r#""3q2+7w==""#);
    }

    #[test]
    fn text_without_the_hex_prefix_is_encoded_as_its_bytes() {
        assert_eq!(b64("abc é").unwrap(), r#""YWJjIMOp""#);
    }

    #[test]
    fn odd_or_non_hex_digits_are_refused_and_nothing_is_written() {
        let mut out = Vec::new();
        assert_eq!(
            bytea(&mut out, r"\x0"),
            Err("odd number of hex digits in bytea".into())
        );
        assert_eq!(
            bytea(&mut out, r"\xzz"),
            Err("non-hex digit 'z' in bytea".into())
        );
        assert_eq!(
            bytea(&mut out, r"\x0g"),
            Err("non-hex digit 'g' in bytea".into())
        );
        assert!(out.is_empty());
    }
}
