//! `RowEncoder`, the Python class: one relation's columns, and per row the JSON of the
//! event's row and key in one call (the one piece besides lib.rs that handles Python
//! objects; its tests are Python's, tests/unit/pg2kafka/test_native.py).
//!
//! Contract: values are str (the text output), None (NULL) or anything else (the
//! unchanged-TOAST marker, left out of the row). The key holds the key columns' JSON as
//! the row has it, in column order; a key column left out is null. A value that does not
//! convert travels as its text (a JSON string) and is named with the reason. The row and
//! key bytes are what `orjson.dumps` writes for the same dict.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

use crate::conv::{conv_of, convert, Conv};
use crate::json::write_str;

/// The columns of one relation and how each converts: turns rows of text values into the
/// JSON of the event's row and key. Built once per relation (and again when a Relation or
/// Type message changes it); `encode` runs per row.
#[pyclass(frozen, module = "services.pg2kafka._native")]
pub(crate) struct RowEncoder {
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
            convs: specs
                .iter()
                .map(|s| conv_of(s).map_err(PyValueError::new_err))
                .collect::<PyResult<_>>()?,
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
