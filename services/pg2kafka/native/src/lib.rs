//! pg2kafka's per-event path, compiled: a pgoutput TupleData to Python values, and a row
//! of Postgres text values to the JSON of a change event's row and key.
//!
//! The conversion rules of the type table (`shared/contract/pgtypes.py` names a kind per
//! type; `conv` implements the kinds) live here and only here. Python keeps the
//! orchestration: which relation, which kinds, the envelope, Kafka. Output is
//! byte-for-byte what `orjson.dumps` writes for the same values (strings escaped as it
//! escapes them, floats in its notation), so a key computed here and one computed from a
//! parsed dict by orjson are the same Kafka key.
//!
//! A value that does not convert (a malformed array literal, say) is never dropped and
//! never stops the stream: it travels as its text, and the caller is told which column
//! and why (to count and log it).
//!
//! The modules, by job (each states its contract; all but `row` are plain Rust with
//! `cargo test` unit tests, run by tests/unit/test_native_crate.py):
//! - `tuple`: pgoutput's TupleData, column by column;
//! - `conv`: the kinds: a spec parsed, one value converted;
//! - `json`: strings, integers and doubles written as orjson writes them;
//! - `temporal`: dates and timestamps to ISO-8601 (expanded years, `+hh:mm`);
//! - `array`: array literals to nested JSON arrays;
//! - `bytea`: bytea's hex output to base64;
//! - `row`: the `RowEncoder` class (a row's and its key's JSON in one call);
//! - `rowhash`: the `RowHasher` class (the row hash `verify` compares by).
//!
//! This file is the Python module: its wiring and the exported functions' glue.

// PyO3 0.22's #[pyfunction] expansion trips this lint on newer clippy (its own code).
#![allow(clippy::useless_conversion)]

mod array;
mod bytea;
mod conv;
mod json;
mod row;
mod rowhash;
mod temporal;
mod tuple;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString, PyTuple};

use crate::conv::{conv_of, convert};
use crate::row::RowEncoder;
use crate::rowhash::RowHasher;
use crate::tuple::{read_tuple, Column, Malformed};

impl From<Malformed> for PyErr {
    fn from(m: Malformed) -> PyErr {
        PyValueError::new_err(m.0)
    }
}

/// One value converted by `spec`, as JSON bytes; ValueError when it does not convert.
#[pyfunction]
fn convert_value<'py>(py: Python<'py>, spec: &str, value: &str) -> PyResult<Bound<'py, PyBytes>> {
    let conv = conv_of(spec).map_err(PyValueError::new_err)?;
    let mut out = Vec::with_capacity(value.len() + 2);
    convert(&mut out, &conv, value).map_err(PyValueError::new_err)?;
    Ok(PyBytes::new_bound(py, &out))
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
    let (values, pos) = read_tuple(buf, pos, |column| -> PyResult<PyObject> {
        Ok(match column {
            Column::Text(s) => PyString::new_bound(py, s).into_any().unbind(),
            Column::NotUtf8(raw) => undecodable.call1((PyBytes::new_bound(py, raw),))?.unbind(),
            Column::Null => py.None(),
            Column::UnchangedToast => toast.clone().unbind(),
        })
    })?;
    Ok((PyTuple::new_bound(py, values), pos))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RowEncoder>()?;
    m.add_class::<RowHasher>()?;
    m.add_function(wrap_pyfunction!(decode_tuple, m)?)?;
    m.add_function(wrap_pyfunction!(convert_value, m)?)?;
    Ok(())
}
