//! The row hash (`shared/contract/rowhash.py` defines it and is the reference; the test
//! tests/unit/pg2kafka/test_row_hash.py holds this one to it): the first four bytes of the
//! MD5 of the non-NULL columns, in the order of their names' bytes, each written as
//! `<len>:<name><len>:<value>`.
//!
//! `RowHasher` is the Python class: built once per relation with the stream's column
//! names (before any transform: the hash describes the source row), `hash` runs per row
//! and gives None when a value is not text (an unchanged TOAST value the stream left out).

use md5::{Digest, Md5};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

/// `<len>:<bytes>`.
fn netstring(out: &mut Vec<u8>, data: &[u8]) {
    out.extend_from_slice(data.len().to_string().as_bytes());
    out.push(b':');
    out.extend_from_slice(data);
}

/// The hash of one row: `prefixes[k]` is the netstring of the k-th column's name in hash
/// order, `values[k]` its text (None: NULL, left out).
pub(crate) fn hash_sorted<'a>(parts: impl Iterator<Item = (&'a [u8], Option<&'a str>)>) -> u32 {
    let mut h = Md5::new();
    let mut buf: Vec<u8> = Vec::with_capacity(256);
    for (prefix, value) in parts {
        if let Some(v) = value {
            buf.extend_from_slice(prefix);
            netstring(&mut buf, v.as_bytes());
        }
    }
    h.update(&buf);
    let d = h.finalize();
    u32::from_be_bytes([d[0], d[1], d[2], d[3]])
}

/// One relation's columns for the row hash: the order of their names' bytes, and each
/// name's netstring, computed once.
#[pyclass(frozen, module = "services.pg2kafka._native")]
pub(crate) struct RowHasher {
    /// Column positions in hash order.
    order: Vec<usize>,
    /// Per position in `order`: the column name's netstring.
    prefixes: Vec<Vec<u8>>,
}

impl RowHasher {
    pub(crate) fn of(names: &[String]) -> Self {
        let mut order: Vec<usize> = (0..names.len()).collect();
        order.sort_by(|&a, &b| names[a].as_bytes().cmp(names[b].as_bytes()));
        let prefixes = order
            .iter()
            .map(|&i| {
                let mut p = Vec::with_capacity(names[i].len() + 4);
                netstring(&mut p, names[i].as_bytes());
                p
            })
            .collect();
        RowHasher { order, prefixes }
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
        if values.len() != self.order.len() {
            return Err(PyValueError::new_err(format!(
                "{} values for {} columns",
                values.len(),
                self.order.len()
            )));
        }
        let mut texts: Vec<Option<Bound<'_, PyString>>> = Vec::with_capacity(self.order.len());
        for &i in &self.order {
            let v = values.get_item(i)?;
            if v.is_none() {
                texts.push(None);
            } else if let Ok(s) = v.downcast_into::<PyString>() {
                texts.push(Some(s));
            } else {
                return Ok(None);
            }
        }
        let strs: Vec<Option<&str>> = texts
            .iter()
            .map(|t| t.as_ref().map(|s| s.to_str()).transpose())
            .collect::<PyResult<_>>()?;
        Ok(Some(hash_sorted(
            self.prefixes.iter().map(|p| p.as_slice()).zip(strs),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash_of(cols: &[(&str, Option<&str>)]) -> u32 {
        let names: Vec<String> = cols.iter().map(|(n, _)| n.to_string()).collect();
        let h = RowHasher::of(&names);
        let values: Vec<Option<&str>> = h.order.iter().map(|&i| cols[i].1).collect();
        hash_sorted(h.prefixes.iter().map(|p| p.as_slice()).zip(values))
    }

    #[test]
    fn empty_row_is_md5_of_nothing() {
        // md5("") = d41d8cd98f00b204e9800998ecf8427e
        assert_eq!(hash_of(&[]), 0xd41d8cd9);
        assert_eq!(hash_of(&[("a", None)]), 0xd41d8cd9);
    }

    #[test]
    fn names_order_not_positions() {
        let a = hash_of(&[("id", Some("1")), ("b", Some("x"))]);
        let b = hash_of(&[("b", Some("x")), ("id", Some("1"))]);
        assert_eq!(a, b);
    }

    #[test]
    fn input_is_netstrings_of_names_and_values() {
        // the input of a one-column row is "1:a1:1"
        let mut h = Md5::new();
        h.update(b"1:a1:1");
        let d = h.finalize();
        assert_eq!(hash_of(&[("a", Some("1"))]), u32::from_be_bytes([d[0], d[1], d[2], d[3]]));
    }

    #[test]
    fn null_and_empty_differ() {
        assert_ne!(hash_of(&[("a", None)]), hash_of(&[("a", Some(""))]));
    }
}
