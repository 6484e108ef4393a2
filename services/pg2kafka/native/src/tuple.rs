//! pgoutput's TupleData (the columns of an Insert, Update or Delete message): read
//! column by column, each handed to the caller as a `Column`.
//!
//! Contract: at `pos`, an Int16 column count, then per column a kind byte: `t` + Int32
//! length + that many bytes of text, `n` (NULL) or `u` (an unchanged TOASTed value, not
//! sent). Returns what the caller made of each column, in order, and the position after
//! the tuple. A count, length or value that runs past the buffer, a position past it, a
//! negative length or another kind (`b`, binary, is never requested) is `Malformed`. The
//! caller's own error (`E`) stops the read and is returned as is.

/// One column of a TupleData.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Column<'a> {
    /// `t`, valid UTF-8 (the server's encoding is UTF-8).
    Text(&'a str),
    /// `t`, but not UTF-8: the raw bytes, for the caller's policy.
    NotUtf8(&'a [u8]),
    /// `n`: SQL NULL.
    Null,
    /// `u`: an unchanged TOASTed value (the message does not carry it).
    UnchangedToast,
}

/// A message that does not follow the protocol; the text says how.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Malformed(pub(crate) String);

/// The TupleData at `pos` of `buf`: `value(column)` per column, collected, and the
/// position after the tuple.
pub(crate) fn read_tuple<'a, T, E: From<Malformed>>(
    buf: &'a [u8],
    pos: usize,
    mut value: impl FnMut(Column<'a>) -> Result<T, E>,
) -> Result<(Vec<T>, usize), E> {
    let end = buf.len();
    let mut pos = pos;
    let truncated = |what: &str| Malformed(format!("truncated message: {what}"));
    if pos > end || end - pos < 2 {
        return Err(truncated("tuple without column count").into());
    }
    let ncols = i16::from_be_bytes([buf[pos], buf[pos + 1]]);
    pos += 2;
    let mut values: Vec<T> = Vec::with_capacity(ncols.max(0) as usize);
    for _ in 0..ncols {
        if pos >= end {
            return Err(truncated("missing column").into());
        }
        let kind = buf[pos];
        pos += 1;
        match kind {
            b't' => {
                if pos + 4 > end {
                    return Err(truncated("missing length").into());
                }
                let n = i32::from_be_bytes([buf[pos], buf[pos + 1], buf[pos + 2], buf[pos + 3]]);
                pos += 4;
                if n < 0 || pos + n as usize > end {
                    return Err(truncated(&format!("value of {n} bytes")).into());
                }
                let raw = &buf[pos..pos + n as usize];
                pos += n as usize;
                values.push(value(match std::str::from_utf8(raw) {
                    Ok(s) => Column::Text(s),
                    Err(_) => Column::NotUtf8(raw),
                })?);
            }
            b'n' => values.push(value(Column::Null)?),
            b'u' => values.push(value(Column::UnchangedToast)?),
            // 'b' (binary) only appears with the binary option, which is never requested.
            other => {
                return Err(
                    Malformed(format!("unsupported tuple column kind {:?}", other as char)).into(),
                )
            }
        }
    }
    Ok((values, pos))
}

// The byte layouts are the ones tests/unit/pg2kafka/test_native.py builds with
// struct.pack("!h") / ("!i"), and the messages the ones it expects.
#[cfg(test)]
mod tests {
    use super::*;

    fn tuple(cols: &[&[u8]]) -> Vec<u8> {
        let mut b = (cols.len() as i16).to_be_bytes().to_vec();
        for c in cols {
            b.extend_from_slice(c);
        }
        b
    }

    fn text(raw: &[u8]) -> Vec<u8> {
        let mut b = vec![b't'];
        b.extend_from_slice(&(raw.len() as i32).to_be_bytes());
        b.extend_from_slice(raw);
        b
    }

    fn read(buf: &[u8], pos: usize) -> Result<(Vec<Column<'_>>, usize), Malformed> {
        read_tuple(buf, pos, Ok::<_, Malformed>)
    }

    fn refused(buf: &[u8], pos: usize) -> String {
        read(buf, pos).unwrap_err().0
    }

    #[test]
    fn text_null_and_unchanged_toast_in_order() {
        let mut buf = b"xx".to_vec();
        buf.extend(tuple(&[&text("ü".as_bytes()), b"n", b"u", &text(b"")]));
        let (cols, end) = read(&buf, 2).unwrap();
        assert_eq!(
            cols,
            [
                Column::Text("ü"),
                Column::Null,
                Column::UnchangedToast,
                Column::Text("")
            ]
        );
        assert_eq!(end, buf.len());
    }

    #[test]
    fn the_position_after_the_tuple_leaves_what_follows() {
        let mut buf = tuple(&[&text(b"1")]);
        let after = buf.len();
        buf.extend_from_slice(b"Nmore");
        assert_eq!(read(&buf, 0).unwrap(), (vec![Column::Text("1")], after));
    }

    #[test]
    fn text_that_is_not_utf8_is_handed_over_raw() {
        let buf = tuple(&[&text(b"caf\xe9"), &text(b"ok")]);
        let (cols, _) = read(&buf, 0).unwrap();
        assert_eq!(cols, [Column::NotUtf8(b"caf\xe9"), Column::Text("ok")]);
    }

    #[test]
    fn no_columns_is_a_tuple() {
        assert_eq!(read(&tuple(&[]), 0).unwrap(), (vec![], 2));
        // a negative count reads as none, as the loop over 0..ncols does
        assert_eq!(read(&(-1i16).to_be_bytes(), 0).unwrap(), (vec![], 2));
    }

    #[test]
    fn what_is_not_the_protocol_is_malformed() {
        let one = 1i16.to_be_bytes();
        let with = |rest: &[u8]| [&one[..], rest].concat();
        assert_eq!(
            refused(b"\x00", 0),
            "truncated message: tuple without column count"
        );
        assert_eq!(refused(&one, 0), "truncated message: missing column");
        assert_eq!(
            refused(&with(b"t\x00\x00"), 0),
            "truncated message: missing length"
        );
        assert_eq!(
            refused(&with(b"t\x00\x00\x00\x05abc"), 0),
            "truncated message: value of 5 bytes"
        );
        assert_eq!(
            refused(&with(b"t\xff\xff\xff\xff"), 0),
            "truncated message: value of -1 bytes"
        );
        assert_eq!(refused(&with(b"b"), 0), "unsupported tuple column kind 'b'");
    }

    #[test]
    fn a_position_past_the_buffer_is_refused() {
        for pos in [3, 4, usize::MAX] {
            assert_eq!(
                refused(b"abc", pos),
                "truncated message: tuple without column count"
            );
        }
    }

    #[test]
    fn the_callers_error_stops_the_read() {
        #[derive(Debug, PartialEq)]
        enum Stop {
            Policy(String),
            Protocol(Malformed),
        }
        impl From<Malformed> for Stop {
            fn from(m: Malformed) -> Self {
                Stop::Protocol(m)
            }
        }
        let buf = tuple(&[&text(b"a"), &text(b"\xff"), b"q"]);
        let mut seen = 0;
        let stopped = read_tuple(&buf, 0, |c| {
            seen += 1;
            match c {
                Column::NotUtf8(raw) => Err(Stop::Policy(format!("{raw:?}"))),
                _ => Ok(()),
            }
        });
        assert_eq!(stopped, Err(Stop::Policy("[255]".into())));
        assert_eq!(seen, 2);
        let bad = tuple(&[&text(b"a"), b"q"]);
        assert_eq!(
            read_tuple(&bad, 0, |_| Ok::<_, Stop>(())),
            Err(Stop::Protocol(Malformed(
                "unsupported tuple column kind 'q'".into()
            )))
        );
    }
}
