//! The row hash (`shared/contract/rowhash.py` defines it and is the reference; the test
//! tests/unit/pg2kafka/test_row_hash.py holds this one to it): the sum, modulo 2^32, of
//! one 32-bit hash per non-NULL column — Postgres's `hashtext` (Bob Jenkins' lookup3 over
//! little-endian words) of `<len>:<name>` followed by the column's text.
//!
//! `RowHasher` is the Python class: built once per relation with the stream's column
//! names (before any transform: the hash describes the source row), `hash` runs per row
//! and gives None when a value is not text (an unchanged TOAST value the stream left out).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

fn mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    *a = a.wrapping_sub(*c) ^ c.rotate_left(4);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a) ^ a.rotate_left(6);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b) ^ b.rotate_left(8);
    *b = b.wrapping_add(*a);
    *a = a.wrapping_sub(*c) ^ c.rotate_left(16);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a) ^ a.rotate_left(19);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b) ^ b.rotate_left(4);
    *b = b.wrapping_add(*a);
}

fn finish(mut a: u32, mut b: u32, mut c: u32) -> u32 {
    c = (c ^ b).wrapping_sub(b.rotate_left(14));
    a = (a ^ c).wrapping_sub(c.rotate_left(11));
    b = (b ^ a).wrapping_sub(a.rotate_left(25));
    c = (c ^ b).wrapping_sub(b.rotate_left(16));
    a = (a ^ c).wrapping_sub(c.rotate_left(4));
    b = (b ^ a).wrapping_sub(a.rotate_left(14));
    c = (c ^ b).wrapping_sub(b.rotate_left(24));
    c
}

/// Up to four bytes as a little-endian word (missing high bytes are zero).
fn word(bytes: &[u8]) -> u32 {
    bytes
        .iter()
        .take(4)
        .enumerate()
        .fold(0u32, |w, (i, &x)| w | (u32::from(x) << (8 * i)))
}

/// Postgres's `hashtext` of the concatenation of `parts`, unsigned.
pub(crate) fn text_hash(parts: &[&[u8]]) -> u32 {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    // The key's length enters the state as Postgres's 32-bit length does.
    let init = 0x9e37_79b9u32
        .wrapping_add(total as u32)
        .wrapping_add(3_923_095);
    let (mut a, mut b, mut c) = (init, init, init);
    let mut block = [0u8; 12];
    let mut filled = 0usize;
    for part in parts {
        for &byte in *part {
            block[filled] = byte;
            filled += 1;
            if filled == 12 {
                a = a.wrapping_add(word(&block[0..4]));
                b = b.wrapping_add(word(&block[4..8]));
                c = c.wrapping_add(word(&block[8..12]));
                mix(&mut a, &mut b, &mut c);
                filled = 0;
            }
        }
    }
    // The last 0..11 bytes: a takes 0-3, b 4-7, c 8-10 one byte up (its lowest byte is
    // the length's in the algorithm's design).
    let tail = &block[..filled];
    a = a.wrapping_add(word(tail.get(0..).unwrap_or(&[])));
    b = b.wrapping_add(word(tail.get(4..).unwrap_or(&[])));
    c = c.wrapping_add(word(tail.get(8..).unwrap_or(&[])) << 8);
    finish(a, b, c)
}

/// `<len>:<bytes>`.
fn netstring(data: &[u8]) -> Vec<u8> {
    let mut out = data.len().to_string().into_bytes();
    out.push(b':');
    out.extend_from_slice(data);
    out
}

/// One relation's columns for the row hash: each name's netstring, computed once.
#[pyclass(frozen, module = "services.pg2kafka._native")]
pub(crate) struct RowHasher {
    prefixes: Vec<Vec<u8>>,
}

impl RowHasher {
    pub(crate) fn of(names: &[String]) -> Self {
        RowHasher {
            prefixes: names.iter().map(|n| netstring(n.as_bytes())).collect(),
        }
    }

    /// The row hash of one row's texts (None: NULL, contributes nothing).
    #[cfg(test)]
    pub(crate) fn hash_texts(&self, values: &[Option<&str>]) -> u32 {
        self.prefixes
            .iter()
            .zip(values)
            .filter_map(|(p, v)| v.map(|v| text_hash(&[p, v.as_bytes()])))
            .fold(0u32, u32::wrapping_add)
    }
}

#[pymethods]
impl RowHasher {
    #[new]
    fn new(names: Vec<String>) -> Self {
        RowHasher::of(&names)
    }

    /// The row's hash; None when a value is neither str nor None (an unchanged TOAST
    /// value: the row's text is not all here). ValueError for a row of another width.
    fn hash(&self, values: &Bound<'_, PyTuple>) -> PyResult<Option<u32>> {
        if values.len() != self.prefixes.len() {
            return Err(PyValueError::new_err(format!(
                "{} values for {} columns",
                values.len(),
                self.prefixes.len()
            )));
        }
        let mut sum = 0u32;
        for (i, prefix) in self.prefixes.iter().enumerate() {
            let v = values.get_item(i)?;
            if v.is_none() {
                continue;
            }
            let Ok(s) = v.downcast::<PyString>() else {
                return Ok(None);
            };
            sum = sum.wrapping_add(text_hash(&[prefix, s.to_str()?.as_bytes()]));
        }
        Ok(Some(sum))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values_of_postgres_hashtext() {
        // SELECT hashtext(x)::bigint & 4294967295 on a little-endian server (PostgreSQL 15)
        assert_eq!(text_hash(&[b""]), 2_817_148_525);
        assert_eq!(text_hash(&[b"abc"]), 3_509_578_647);
        assert_eq!(
            text_hash(&[b"0123456789abcdefghijklmnopqrstuvwxyz"]),
            3_361_583_595
        );
        assert_eq!(text_hash(&[b"2:id", b"1"]), 1_832_766_311);
        assert_eq!(text_hash(&[b""]), text_hash(&[]));
        assert_eq!(text_hash(&[b"ab", b"c"]), text_hash(&[b"abc"]));
        assert_eq!(
            text_hash(&[b"0123456789ab", b"cdefghijklmnopqrstuvwxyz"]),
            text_hash(&[b"0123456789abcdefghijklmnopqrstuvwxyz"])
        );
    }

    #[test]
    fn null_columns_add_nothing_and_order_of_names_does_not_matter() {
        let h = RowHasher::of(&["id".to_string(), "b".to_string()]);
        let swapped = RowHasher::of(&["b".to_string(), "id".to_string()]);
        assert_eq!(
            h.hash_texts(&[Some("1"), Some("x")]),
            swapped.hash_texts(&[Some("x"), Some("1")])
        );
        assert_eq!(
            h.hash_texts(&[Some("1"), None]),
            text_hash(&[b"2:id", b"1"])
        );
        assert_eq!(h.hash_texts(&[None, None]), 0);
        assert_ne!(
            h.hash_texts(&[Some("1"), None]),
            h.hash_texts(&[Some("1"), Some("")])
        );
    }
}
