//! kafka2postgres's bulk path, compiled: a batch of new rows of one table to the COPY
//! text of the rows and of their versions, in one call, without the GIL.
//!
//! The rules (which value is sent how, what makes a batch go the guarded way) are in
//! `copy` and nowhere else; services/kafka2postgres/copying.py decides when the bulk
//! path is taken and runs the statements. `copy` is plain Rust with `cargo test` unit
//! tests (tests/unit/test_native_crate.py runs them); this file is the Python module.

// PyO3 0.22's #[pyfunction] expansion trips this lint on newer clippy (its own code).
#![allow(clippy::useless_conversion)]

mod copy;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::copy::{encode, KeyKind, Kind, Table};

/// `copy_rows`' answer: the rows' COPY text, the versions' COPY text, the key arrays.
type Copied<'py> = (
    Bound<'py, PyBytes>,
    Option<Bound<'py, PyBytes>>,
    Vec<Bound<'py, PyBytes>>,
);

/// The rows of `rows` (each a `bytes` JSON object, in a list) as COPY text, for a table
/// of `columns` (`(name, kind)`, kinds as shared/contract/pgtypes.py names them) whose
/// key is at `key_at`, typed `key_types` (`pg_type.typname`). Returns `(rows' COPY
/// text, versions' COPY text or None, key arrays)`: the versions' text (the lines of
/// `_walcast_target.rows`: `tbl, key, version, deleted, unfilled, hash, xid`) when every
/// key's text could be computed here, else one JSON array per key column of the rows'
/// key values. ValueError names the first value that is not plain: take the guarded
/// path.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn copy_rows<'py>(
    py: Python<'py>,
    rows: &Bound<'py, PyList>,
    columns: Vec<(String, String)>,
    key_at: Vec<usize>,
    key_types: Vec<String>,
    tbl: i64,
    versions: Vec<i64>,
    hashes: Vec<Option<i64>>,
    xids: Vec<i64>,
) -> PyResult<Copied<'py>> {
    let n = rows.len();
    if versions.len() != n || hashes.len() != n || xids.len() != n {
        return Err(PyValueError::new_err(
            "rows, versions, hashes and xids differ in length",
        ));
    }
    let columns: Vec<(String, Kind)> = columns
        .into_iter()
        .map(|(name, kind)| match Kind::of(&kind) {
            Some(k) => Ok((name, k)),
            None => Err(PyValueError::new_err(format!(
                "column {name:?}: kind {kind:?} has no bulk path"
            ))),
        })
        .collect::<PyResult<_>>()?;
    if key_at.len() != key_types.len() || key_at.iter().any(|&k| k >= columns.len()) {
        return Err(PyValueError::new_err(
            "key_at and key_types do not name the key's columns",
        ));
    }
    let key_kinds: Option<Vec<KeyKind>> = key_types.iter().map(|t| KeyKind::of(t)).collect();
    let held: Vec<Bound<'py, PyBytes>> = rows
        .iter()
        .map(|r| r.downcast_into::<PyBytes>().map_err(PyErr::from))
        .collect::<PyResult<_>>()?;
    let slices: Vec<&[u8]> = held.iter().map(|b| b.as_bytes()).collect();
    let table = Table {
        columns: &columns,
        key_at: &key_at,
        key_kinds: key_kinds.as_deref(),
        tbl,
    };
    let encoded = py
        .allow_threads(|| encode(&table, &slices, &versions, &hashes, &xids))
        .map_err(|e| PyValueError::new_err(e.0))?;
    Ok((
        PyBytes::new_bound(py, &encoded.rows),
        encoded.versions.map(|v| PyBytes::new_bound(py, &v)),
        encoded
            .keys
            .iter()
            .map(|k| PyBytes::new_bound(py, k))
            .collect(),
    ))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(copy_rows, m)?)?;
    Ok(())
}
