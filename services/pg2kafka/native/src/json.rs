//! JSON output as orjson writes it: strings, integers and doubles appended to a byte
//! buffer.
//!
//! Contract: the bytes are exactly what `orjson.dumps` writes for the same Python value
//! (a `str`, an `int`, a finite `float`), so JSON written here and JSON orjson writes from
//! a parsed dict are the same bytes (the Kafka key depends on it). The writers only
//! append; a writer that refuses its input (`write_int`) may leave a partial value, which
//! the caller truncates.

const HEX: &[u8; 16] = b"0123456789abcdef";

/// A JSON string as orjson writes it: `"` and `\` escaped, control characters as `\b \t
/// \n \f \r` or `\u00xx`, everything else (non-ASCII included) as is.
pub(crate) fn write_str(out: &mut Vec<u8>, s: &str) {
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
pub(crate) fn write_int(out: &mut Vec<u8>, v: &str) -> Result<(), String> {
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
pub(crate) fn write_f64(out: &mut Vec<u8>, f: f64) {
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

// Expected bytes are orjson.dumps of the same Python value (orjson 3.x).
#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> String {
        let mut out = b"prefix:".to_vec(); // writers append, never clear
        write_str(&mut out, v);
        String::from_utf8(out).unwrap()["prefix:".len()..].to_string()
    }

    fn int(v: &str) -> Result<String, String> {
        let mut out = Vec::new();
        write_int(&mut out, v)?;
        Ok(String::from_utf8(out).unwrap())
    }

    fn f(v: f64) -> String {
        let mut out = Vec::new();
        write_f64(&mut out, v);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn strings_escape_quote_backslash_and_named_controls() {
        assert_eq!(s(""), r#""""#);
        assert_eq!(s("plain"), r#""plain""#);
        assert_eq!(s(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(s("\n\r\t\u{8}\u{c}"), r#""\n\r\t\b\f""#);
    }

    #[test]
    fn other_control_characters_are_u00xx_in_lowercase_hex() {
        assert_eq!(s("\u{0}\u{1}\u{1f}"), r#""\u0000\u0001\u001f""#);
        assert_eq!(s("x\u{b}y"), r#""x\u000by""#);
    }

    #[test]
    fn delete_slash_and_non_ascii_stay_as_they_are() {
        assert_eq!(s("\u{7f}/"), "\"\u{7f}/\"");
        assert_eq!(s("é\u{2028}😀"), "\"é\u{2028}😀\"");
        assert_eq!(s("é\"\n"), "\"é\\\"\\n\"");
    }

    #[test]
    fn integers_are_written_canonically() {
        assert_eq!(int("0").unwrap(), "0");
        assert_eq!(int("007").unwrap(), "7");
        assert_eq!(int("-0").unwrap(), "0");
        assert_eq!(int("-000").unwrap(), "0");
        assert_eq!(int("-012").unwrap(), "-12");
        assert_eq!(int("-9223372036854775808").unwrap(), "-9223372036854775808");
        // No range: a JSON number of any length (as Python's int).
        assert_eq!(
            int("123456789012345678901234567890").unwrap(),
            "123456789012345678901234567890"
        );
    }

    #[test]
    fn what_is_not_an_integer_is_refused() {
        for v in ["", "-", "+1", " 1", "1 ", "1.5", "1e3", "--1"] {
            assert_eq!(int(v), Err(format!("not an integer: {v:?}")), "{v:?}");
        }
    }

    #[test]
    fn shortest_digits_and_the_exponent_of_the_first() {
        assert_eq!(shortest_digits(123.45), (false, b"12345".to_vec(), 2));
        assert_eq!(shortest_digits(100.0), (false, b"1".to_vec(), 2));
        assert_eq!(shortest_digits(0.0), (false, b"0".to_vec(), 0));
        assert_eq!(shortest_digits(-0.0), (true, b"0".to_vec(), 0));
        assert_eq!(shortest_digits(1e16), (false, b"1".to_vec(), 16));
        assert_eq!(shortest_digits(-1.5e-7), (true, b"15".to_vec(), -7));
        assert_eq!(shortest_digits(0.001), (false, b"1".to_vec(), -3));
    }

    #[test]
    fn doubles_are_plain_decimals_for_exponents_minus_5_to_15() {
        assert_eq!(f(0.0), "0.0");
        assert_eq!(f(-0.0), "-0.0");
        assert_eq!(f(1.0), "1.0");
        assert_eq!(f(100.0), "100.0");
        assert_eq!(f(0.1), "0.1");
        assert_eq!(f(12.5), "12.5");
        assert_eq!(f(-4.35), "-4.35");
        assert_eq!(f(123456789.123), "123456789.123");
        assert_eq!(f(0.1 + 0.2), "0.30000000000000004");
        assert_eq!(f(1e15), "1000000000000000.0");
        assert_eq!(f(9007199254740992.0), "9007199254740992.0");
        assert_eq!(f(9999999999999998.0), "9999999999999998.0");
        assert_eq!(f(1e-5), "0.00001");
        assert_eq!(f(1.2345e-5), "0.000012345");
    }

    #[test]
    fn doubles_outside_are_exponential_with_a_signed_exponent() {
        assert_eq!(f(1e16), "1e+16");
        assert_eq!(f(1.5e16), "1.5e+16");
        assert_eq!(f(-1e21), "-1e+21");
        assert_eq!(f(1e100), "1e+100");
        assert_eq!(f(9.99e-6), "9.99e-6");
        assert_eq!(f(1e-300), "1e-300");
        assert_eq!(f(5e-324), "5e-324");
        assert_eq!(f(f64::MAX), "1.7976931348623157e+308");
    }
}
