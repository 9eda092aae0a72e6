//! The rows of the files an ingest job loads, in order, each checked where
//! it is read: an error names the file, the row and the column, and comes
//! before the batch holding that row is sent.
//!
//! Formats, by extension: `.fvecs` (TEXMEX), `.npy` (2-d float32), JSON
//! Lines (`.jsonl`, `.ndjson`: one object per line with a vector field, an
//! optional id field, and every other field as the point's payload) and
//! Parquet (`.parquet`: the same with columns, `parquet.rs`). Rows are
//! numbered from 0 across all the files, in the order given; a row's id is
//! its number plus `--id-start` unless the row carries its own.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

pub use super::fields::JsonFields;
use super::fields::Parsed;
use super::parquet::ParquetRows;
use crate::vectors::fvecs::VecFile;
use crate::vectors::npy::NpyMatrix;

/// One row, ready to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub id: u64,
    pub vector: Vec<f32>,
    /// A JSON object, if the row has fields besides its id and vector.
    pub payload: Option<String>,
}

/// What the rows must be, checked on every one.
#[derive(Debug, Clone, Copy)]
pub struct Checks {
    pub dim: usize,
    /// Cosine: a zero vector has no direction and is refused.
    pub nonzero: bool,
}

enum Opened {
    Fvecs(VecFile),
    Npy(NpyMatrix),
    Jsonl(std::io::Lines<BufReader<File>>),
    Parquet(Box<ParquetRows>),
}

/// An input file, opened and measured.
pub struct Input {
    pub path: PathBuf,
    opened: Opened,
    /// Dimension, if the format says it before any row is read (JSON
    /// lines: from the first line).
    pub dim: Option<usize>,
    pub rows: usize,
}

impl Input {
    pub fn open(path: &Path, fields: &JsonFields) -> Result<Input> {
        let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).unwrap_or_default();
        let (opened, dim, rows) = match ext.as_str() {
            "fvecs" => {
                let f = VecFile::open(path)?;
                let (dim, rows) = (f.dim(), f.len());
                (Opened::Fvecs(f), Some(dim), rows)
            }
            "npy" => {
                let m = NpyMatrix::open(path)?;
                let (dim, rows) = (m.dim(), m.len());
                (Opened::Npy(m), Some(dim), rows)
            }
            "jsonl" | "ndjson" => {
                let (rows, dim) = count_lines(path, fields)?;
                let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
                (Opened::Jsonl(BufReader::new(file).lines()), dim, rows)
            }
            "parquet" => {
                let (p, dim, rows) = ParquetRows::open(path, fields)?;
                (Opened::Parquet(Box::new(p)), dim, rows)
            }
            _ => bail!("{}: unknown format; the extension must be .fvecs, .npy, .jsonl, .ndjson or .parquet", path.display()),
        };
        Ok(Input { path: path.to_owned(), opened, dim, rows })
    }

    /// Row `i` of this file (rows are read in order, from 0), numbered
    /// `number` across all the files.
    fn row(&mut self, i: usize, number: u64, id_start: u64, fields: &JsonFields, checks: Checks) -> Result<Row> {
        let at = |column: &str| format!("{} row {i} column {column}", self.path.display());
        let (vector, id, payload) = match &mut self.opened {
            Opened::Fvecs(f) => (f.f32_row(i)?, None, None),
            Opened::Npy(m) => (m.row(i), None, None),
            Opened::Jsonl(lines) => {
                let line = lines
                    .next()
                    .with_context(|| format!("{} row {i}: the file ended early (changed while read?)", self.path.display()))?
                    .with_context(|| format!("{} row {i}: reading", self.path.display()))?;
                let (vector, id, payload) = parse_line(&line, fields).map_err(|(column, e)| anyhow::anyhow!("{}: {e}", at(&column)))?;
                (vector, id, payload)
            }
            Opened::Parquet(p) => p.next_row(&self.path, i)?.map_err(|(column, e)| anyhow::anyhow!("{}: {e}", at(&column)))?,
        };
        if vector.len() != checks.dim {
            bail!("{}: {} components, the collection's dimension is {}", at("vector"), vector.len(), checks.dim);
        }
        if let Some(c) = vector.iter().position(|x| !x.is_finite()) {
            bail!("{}: {} is not a finite number", at(&format!("vector[{c}]")), vector[c]);
        }
        if checks.nonzero && vector.iter().all(|x| *x == 0.0) {
            bail!("{}: a zero vector has no direction under the cosine metric", at("vector"));
        }
        let id = match id {
            Some(id) => id,
            None => {
                id_start.checked_add(number).with_context(|| format!("{}: --id-start {id_start} + row {number} overflows", at("id")))?
            }
        };
        Ok(Row { id, vector, payload })
    }
}

/// Lines of a JSON Lines file (blank lines are refused where they are
/// met) and the dimension of its first line's vector.
fn count_lines(path: &Path, fields: &JsonFields) -> Result<(usize, Option<usize>)> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut rows = 0;
    let mut dim = None;
    for line in BufReader::new(file).lines() {
        let line = line.with_context(|| format!("{} row {rows}: reading", path.display()))?;
        if dim.is_none() {
            let (v, _, _) =
                parse_line(&line, fields).map_err(|(column, e)| anyhow::anyhow!("{} row 0 column {column}: {e}", path.display()))?;
            dim = Some(v.len());
        }
        rows += 1;
    }
    Ok((rows, dim))
}

/// One JSON line: its vector, its id if the line has one, and the other
/// fields as a payload. An error names the column it is about.
fn parse_line(line: &str, fields: &JsonFields) -> Result<Parsed, (String, String)> {
    let whole = |e: String| ("(line)".to_owned(), e);
    let value: serde_json::Value = serde_json::from_str(line).map_err(|e| whole(format!("not JSON: {e}")))?;
    let serde_json::Value::Object(mut obj) = value else { return Err(whole("not a JSON object".into())) };
    let raw = obj.remove(&fields.vector).ok_or_else(|| (fields.vector.clone(), "missing".to_owned()))?;
    let serde_json::Value::Array(items) = raw else { return Err((fields.vector.clone(), "not an array of numbers".into())) };
    let mut vector = Vec::with_capacity(items.len());
    for (c, x) in items.iter().enumerate() {
        let x = x.as_f64().ok_or_else(|| (format!("{}[{c}]", fields.vector), format!("{x} is not a number")))?;
        vector.push(x as f32);
    }
    let id = match &fields.id {
        Some(name) => match obj.remove(name) {
            None => None,
            Some(v) => Some(v.as_u64().ok_or_else(|| (name.clone(), format!("{v} is not an id (a whole number from 0 to 2^64-1)")))?),
        },
        None => None,
    };
    let payload = (!obj.is_empty()).then(|| serde_json::Value::Object(obj).to_string());
    Ok((vector, id, payload))
}

/// Every row of the files in order, with its number across them.
pub struct Rows {
    inputs: Vec<Input>,
    file: usize,
    in_file: usize,
    number: u64,
    id_start: u64,
    fields: JsonFields,
    checks: Checks,
}

impl Rows {
    pub fn new(inputs: Vec<Input>, id_start: u64, fields: JsonFields, checks: Checks) -> Result<Rows> {
        for i in &inputs {
            if let Some(d) = i.dim
                && d != checks.dim
            {
                bail!("{}: vectors of dimension {d}, the collection's is {}", i.path.display(), checks.dim);
            }
        }
        Ok(Rows { inputs, file: 0, in_file: 0, number: 0, id_start, fields, checks })
    }

    pub fn total(&self) -> u64 {
        self.inputs.iter().map(|i| i.rows as u64).sum()
    }

    /// The next row and its number, `None` after the last.
    pub fn next_row(&mut self) -> Result<Option<(u64, Row)>> {
        while let Some(input) = self.inputs.get_mut(self.file) {
            if self.in_file < input.rows {
                let row = input.row(self.in_file, self.number, self.id_start, &self.fields, self.checks)?;
                let number = self.number;
                self.in_file += 1;
                self.number += 1;
                return Ok(Some((number, row)));
            }
            self.file += 1;
            self.in_file = 0;
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows_of(dir: &Path, files: &[(&str, &str)], checks: Checks) -> Result<Vec<Row>> {
        let mut inputs = Vec::new();
        for (name, text) in files {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            inputs.push(Input::open(&p, &JsonFields::default())?);
        }
        let mut rows = Rows::new(inputs, 100, JsonFields::default(), checks)?;
        let mut out = Vec::new();
        while let Some((_, r)) = rows.next_row()? {
            out.push(r);
        }
        Ok(out)
    }

    const D2: Checks = Checks { dim: 2, nonzero: true };

    #[test]
    fn json_lines_give_ids_vectors_and_payloads() {
        let dir = tempfile::tempdir().unwrap();
        let rows =
            rows_of(dir.path(), &[("a.jsonl", "{\"id\":7,\"vector\":[1,0],\"title\":\"x\"}\n{\"vector\":[0.5,0.5]}\n")], D2).unwrap();
        assert_eq!(rows[0], Row { id: 7, vector: vec![1.0, 0.0], payload: Some("{\"title\":\"x\"}".into()) });
        assert_eq!(rows[1], Row { id: 101, vector: vec![0.5, 0.5], payload: None }, "no id: the row number + id start");
    }

    #[test]
    fn bad_rows_are_named_by_file_row_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let err = |text: &str, checks: Checks| {
            rows_of(dir.path(), &[("b.jsonl", text)], checks)
                .map(|_| ())
                .unwrap_err()
                .to_string()
                .replace(&dir.path().display().to_string(), "")
        };
        assert_eq!(
            err("{\"vector\":[1,0]}\n{\"vector\":[1,0,0]}\n", D2),
            "/b.jsonl row 1 column vector: 3 components, the collection's dimension is 2"
        );
        assert_eq!(err("{\"vector\":[1,0]}\n{\"vector\":[1,\"x\"]}\n", D2), "/b.jsonl row 1 column vector[1]: \"x\" is not a number");
        assert_eq!(
            err("{\"vector\":[1,0]}\n{\"vector\":[0,0]}\n", D2),
            "/b.jsonl row 1 column vector: a zero vector has no direction under the cosine metric"
        );
        assert!(rows_of(dir.path(), &[("z.jsonl", "{\"vector\":[0,0]}\n")], Checks { dim: 2, nonzero: false }).is_ok());
        assert_eq!(
            err("{\"vector\":[1,0]}\n{\"id\":-1,\"vector\":[1,0]}\n", D2),
            "/b.jsonl row 1 column id: -1 is not an id (a whole number from 0 to 2^64-1)"
        );
        assert_eq!(err("{\"vector\":[1,0]}\n{\"vec\":[1,0]}\n", D2), "/b.jsonl row 1 column vector: missing");
        assert!(err("{\"vector\":[1,0]}\n{oops\n", D2).starts_with("/b.jsonl row 1 column (line): not JSON"));
        assert_eq!(err("{\"vector\":[1,0]}\n[1,2]\n", D2), "/b.jsonl row 1 column (line): not a JSON object");
    }

    #[test]
    fn binary_files_are_checked_too_and_files_of_another_dimension_refused() {
        let dir = tempfile::tempdir().unwrap();
        let npy = dir.path().join("v.npy");
        crate::vectors::npy::write(&npy, &[vec![1.0, 2.0], vec![f32::NAN, 1.0]]).unwrap();
        let inputs = vec![Input::open(&npy, &JsonFields::default()).unwrap()];
        let mut rows = Rows::new(inputs, 0, JsonFields::default(), D2).unwrap();
        assert_eq!(rows.next_row().unwrap().unwrap().1.id, 0);
        let e = rows.next_row().unwrap_err().to_string();
        assert!(e.ends_with("v.npy row 1 column vector[0]: NaN is not a finite number"), "{e}");

        let inputs = vec![Input::open(&npy, &JsonFields::default()).unwrap()];
        let e = Rows::new(inputs, 0, JsonFields::default(), Checks { dim: 3, nonzero: true }).err().unwrap().to_string();
        assert!(e.ends_with("v.npy: vectors of dimension 2, the collection's is 3"), "{e}");
        let e = Input::open(&dir.path().join("v.csv"), &JsonFields::default()).err().unwrap().to_string();
        assert!(e.contains("unknown format"), "{e}");
        let e = Input::open(&dir.path().join("missing.fvecs"), &JsonFields::default()).err().unwrap().to_string();
        assert!(e.contains("opening") && e.contains("missing.fvecs"), "{e}");
    }
}
