//! Parquet input: a vector column (a fixed-size list or a list of float32
//! or float64), an optional id column (any integer type), and every other
//! column as the point's payload.
//!
//! Read through the `parquet` crate's Arrow reader, one record batch at a
//! time: a file of any size takes the memory of one batch, and the columns
//! are checked once, when the file is opened, so a file whose columns
//! cannot be loaded is refused before anything is sent.

// Arrow's `DataType` has some forty variants and gains more with its
// releases; each match here names the types it loads, and every other one,
// present or future, is refused the same way.
#![allow(clippy::wildcard_enum_match_arm)]

use std::fs::File;
use std::path::Path;

use anyhow::{Context, Result, bail};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};

use super::fields::{JsonFields, Parsed};

/// Rows per record batch read: a few MB of 384-d vectors.
const READ_ROWS: usize = 2048;

/// An open Parquet file, read in row order.
pub struct ParquetRows {
    reader: ParquetRecordBatchReader,
    batch: Option<RecordBatch>,
    /// The next row's index in `batch`.
    at: usize,
    vector: Column,
    id: Option<Column>,
    payload: Vec<Column>,
}

struct Column {
    name: String,
    index: usize,
}

impl ParquetRows {
    /// Opens the file and checks its columns; returns the rows and the
    /// vectors' dimension (from the schema of a fixed-size list, else
    /// from the first row) and the number of rows.
    pub fn open(path: &Path, fields: &JsonFields) -> Result<(ParquetRows, Option<usize>, usize)> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let builder =
            ParquetRecordBatchReaderBuilder::try_new(file).with_context(|| format!("{}: not a readable Parquet file", path.display()))?;
        let rows = usize::try_from(builder.metadata().file_metadata().num_rows())
            .with_context(|| format!("{}: a negative row count in the file's metadata", path.display()))?;
        let schema = builder.schema().clone();
        let column =
            |name: &str| schema.fields().iter().position(|f| f.name() == name).map(|index| Column { name: name.to_owned(), index });

        let Some(vector) = column(&fields.vector) else {
            let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            bail!(
                "{}: no column {:?} to take vectors from (columns: {}; --vector-field names it)",
                path.display(),
                fields.vector,
                names.join(", ")
            );
        };
        let mut dim = match schema.field(vector.index).data_type() {
            DataType::FixedSizeList(item, size) if is_float(item.data_type()) => Some(*size as usize),
            DataType::List(item) | DataType::LargeList(item) if is_float(item.data_type()) => None,
            other => bail!(
                "{} column {}: {other} cannot hold vectors (a fixed-size list or a list of float32 or float64 can)",
                path.display(),
                vector.name
            ),
        };
        let id = fields.id.as_deref().and_then(column);
        if let Some(id) = &id
            && !schema.field(id.index).data_type().is_integer()
        {
            bail!(
                "{} column {}: {} cannot hold ids (a column of whole numbers can; --id-field \"\" numbers the rows instead)",
                path.display(),
                id.name,
                schema.field(id.index).data_type()
            );
        }
        let mut payload = Vec::new();
        for (index, f) in schema.fields().iter().enumerate() {
            if index == vector.index || id.as_ref().is_some_and(|c| c.index == index) {
                continue;
            }
            if !is_scalar(f.data_type()) {
                bail!(
                    "{} column {}: {} cannot be carried as a payload (strings, numbers and booleans can); \
                     leave the column out of the file or write it as a string",
                    path.display(),
                    f.name(),
                    f.data_type()
                );
            }
            payload.push(Column { name: f.name().clone(), index });
        }
        let reader = builder.with_batch_size(READ_ROWS).build().with_context(|| format!("{}: reading", path.display()))?;
        let mut p = ParquetRows { reader, batch: None, at: 0, vector, id, payload };
        if dim.is_none() && rows > 0 {
            // A plain list says nothing of its length: the first row does.
            p.fill(path, 0)?;
            dim = p.batch.as_ref().and_then(|b| list_len(b.column(p.vector.index), 0));
        }
        Ok((p, dim, rows))
    }

    /// Reads the next record batch if the current one is used up.
    fn fill(&mut self, path: &Path, row: usize) -> Result<()> {
        while self.batch.as_ref().is_none_or(|b| self.at >= b.num_rows()) {
            let next = self
                .reader
                .next()
                .with_context(|| format!("{} row {row}: the file ended early (changed while read?)", path.display()))?
                .with_context(|| format!("{} row {row}: reading", path.display()))?;
            self.batch = Some(next);
            self.at = 0;
        }
        Ok(())
    }

    /// The next row (row `i` of the file). An error of the row's content
    /// names the column it is about.
    pub fn next_row(&mut self, path: &Path, i: usize) -> Result<Result<Parsed, (String, String)>> {
        self.fill(path, i)?;
        let Some(batch) = self.batch.as_ref() else { unreachable!("fill leaves a batch with a row") };
        let r = self.at;
        self.at += 1;
        Ok(self.parse(batch, r))
    }

    fn parse(&self, batch: &RecordBatch, r: usize) -> Result<Parsed, (String, String)> {
        let name = &self.vector.name;
        let vector =
            vector_at(batch.column(self.vector.index), r).map_err(|(c, e)| (c.map_or(name.clone(), |c| format!("{name}[{c}]")), e))?;
        let id = match &self.id {
            None => None,
            Some(c) => Some(id_at(batch.column(c.index), r).map_err(|e| (c.name.clone(), e))?),
        };
        let mut obj = serde_json::Map::new();
        for c in &self.payload {
            if let Some(v) = scalar_at(batch.column(c.index), r) {
                obj.insert(c.name.clone(), v);
            }
        }
        let payload = (!obj.is_empty()).then(|| serde_json::Value::Object(obj).to_string());
        Ok((vector, id, payload))
    }
}

fn is_float(t: &DataType) -> bool {
    matches!(t, DataType::Float32 | DataType::Float64)
}

fn is_scalar(t: &DataType) -> bool {
    t.is_integer() || is_float(t) || matches!(t, DataType::Boolean | DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

/// The values of row `r` of a list column, or `None` for a null row.
fn list_values(a: &ArrayRef, r: usize) -> Option<ArrayRef> {
    if a.is_null(r) {
        return None;
    }
    match a.data_type() {
        DataType::FixedSizeList(..) => Some(a.as_fixed_size_list().value(r)),
        DataType::List(_) => Some(a.as_list::<i32>().value(r)),
        DataType::LargeList(_) => Some(a.as_list::<i64>().value(r)),
        _ => None,
    }
}

fn list_len(a: &ArrayRef, r: usize) -> Option<usize> {
    list_values(a, r).map(|v| v.len())
}

/// Row `r`'s vector; an error says which component (`None`: the whole).
fn vector_at(a: &ArrayRef, r: usize) -> Result<Vec<f32>, (Option<usize>, String)> {
    let values = list_values(a, r).ok_or((None, "null: every row needs a vector".to_owned()))?;
    if let Some(c) = (0..values.len()).find(|&c| values.is_null(c)) {
        return Err((Some(c), "null is not a number".into()));
    }
    match values.data_type() {
        DataType::Float32 => Ok(values.as_primitive::<Float32Type>().values().to_vec()),
        DataType::Float64 => Ok(values.as_primitive::<Float64Type>().values().iter().map(|&x| x as f32).collect()),
        other => Err((None, format!("{other} components (float32 or float64 expected)"))),
    }
}

/// Row `r`'s id, from any integer column; negative ids are refused.
fn id_at(a: &ArrayRef, r: usize) -> Result<u64, String> {
    if a.is_null(r) {
        return Err("null is not an id (every row of an id column needs one)".into());
    }
    let signed = |v: i64| u64::try_from(v).map_err(|_| format!("{v} is not an id (a whole number from 0 to 2^64-1)"));
    match a.data_type() {
        DataType::UInt64 => Ok(a.as_primitive::<UInt64Type>().value(r)),
        DataType::UInt32 => Ok(a.as_primitive::<UInt32Type>().value(r).into()),
        DataType::UInt16 => Ok(a.as_primitive::<UInt16Type>().value(r).into()),
        DataType::UInt8 => Ok(a.as_primitive::<UInt8Type>().value(r).into()),
        DataType::Int64 => signed(a.as_primitive::<Int64Type>().value(r)),
        DataType::Int32 => signed(a.as_primitive::<Int32Type>().value(r).into()),
        DataType::Int16 => signed(a.as_primitive::<Int16Type>().value(r).into()),
        DataType::Int8 => signed(a.as_primitive::<Int8Type>().value(r).into()),
        other => Err(format!("{other} is not an integer type")),
    }
}

/// Row `r` of a payload column as JSON; `None` for a null (the field is
/// left out, as a JSON line would).
fn scalar_at(a: &ArrayRef, r: usize) -> Option<serde_json::Value> {
    use serde_json::Value;
    if a.is_null(r) {
        return None;
    }
    let float = |x: f64| serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number);
    Some(match a.data_type() {
        DataType::Boolean => Value::Bool(a.as_boolean().value(r)),
        DataType::Utf8 => Value::String(a.as_string::<i32>().value(r).to_owned()),
        DataType::LargeUtf8 => Value::String(a.as_string::<i64>().value(r).to_owned()),
        DataType::Utf8View => Value::String(a.as_string_view().value(r).to_owned()),
        DataType::Float32 => float(a.as_primitive::<Float32Type>().value(r).into()),
        DataType::Float64 => float(a.as_primitive::<Float64Type>().value(r)),
        DataType::UInt64 => a.as_primitive::<UInt64Type>().value(r).into(),
        DataType::UInt32 => a.as_primitive::<UInt32Type>().value(r).into(),
        DataType::UInt16 => a.as_primitive::<UInt16Type>().value(r).into(),
        DataType::UInt8 => a.as_primitive::<UInt8Type>().value(r).into(),
        DataType::Int64 => a.as_primitive::<Int64Type>().value(r).into(),
        DataType::Int32 => a.as_primitive::<Int32Type>().value(r).into(),
        DataType::Int16 => a.as_primitive::<Int16Type>().value(r).into(),
        DataType::Int8 => a.as_primitive::<Int8Type>().value(r).into(),
        // Refused when the file was opened (`is_scalar`).
        _ => Value::Null,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::builder::{FixedSizeListBuilder, Float32Builder, Float64Builder, ListBuilder};
    use arrow_array::{Date32Array, Int32Array, Int64Array, StringArray, UInt64Array};
    use parquet::arrow::ArrowWriter;

    use super::*;
    use crate::ingest::input::{Checks, Input, Row, Rows};

    fn write(path: &Path, columns: Vec<(&str, ArrayRef)>) {
        let batch = RecordBatch::try_from_iter(columns).unwrap();
        let mut w = ArrowWriter::try_new(File::create(path).unwrap(), batch.schema(), None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }

    fn fixed(rows: &[Option<&[Option<f32>]>], dim: i32) -> ArrayRef {
        let mut b = FixedSizeListBuilder::new(Float32Builder::new(), dim);
        for row in rows {
            match row {
                Some(values) => {
                    for v in *values {
                        b.values().append_option(*v);
                    }
                    b.append(true);
                }
                None => {
                    for _ in 0..dim {
                        b.values().append_null();
                    }
                    b.append(false);
                }
            }
        }
        Arc::new(b.finish())
    }

    fn read_all(path: &Path, fields: &JsonFields, dim: usize) -> Result<Vec<Row>> {
        let inputs = vec![Input::open(path, fields)?];
        let mut rows = Rows::new(inputs, 100, fields.clone(), Checks { dim, nonzero: true })?;
        let mut out = Vec::new();
        while let Some((_, r)) = rows.next_row()? {
            out.push(r);
        }
        Ok(out)
    }

    fn error(path: &Path, fields: &JsonFields, dim: usize) -> String {
        let e = read_all(path, fields, dim).map(|_| ()).unwrap_err().to_string();
        e.replace(&path.parent().unwrap().display().to_string(), "")
    }

    #[test]
    fn fixed_size_lists_ids_and_payload_columns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.parquet");
        let vectors = fixed(&[Some(&[Some(1.0), Some(0.0)]), Some(&[Some(0.5), Some(0.25)])], 2);
        write(
            &path,
            vec![
                ("id", Arc::new(UInt64Array::from(vec![7, u64::MAX])) as ArrayRef),
                ("vector", vectors),
                ("title", Arc::new(StringArray::from(vec![Some("numpy"), None]))),
                ("year", Arc::new(Int32Array::from(vec![2006, -3]))),
            ],
        );
        let input = Input::open(&path, &JsonFields::default()).unwrap();
        assert_eq!((input.dim, input.rows), (Some(2), 2));
        let rows = read_all(&path, &JsonFields::default(), 2).unwrap();
        assert_eq!(rows[0], Row { id: 7, vector: vec![1.0, 0.0], payload: Some(r#"{"title":"numpy","year":2006}"#.into()) });
        assert_eq!(rows[1], Row { id: u64::MAX, vector: vec![0.5, 0.25], payload: Some(r#"{"year":-3}"#.into()) }, "a null is left out");
        // Ids from row numbers: the id column is then a payload column.
        let numbered = JsonFields { id: None, ..JsonFields::default() };
        let rows = read_all(&path, &numbered, 2).unwrap();
        assert_eq!((rows[0].id, rows[1].id), (100, 101));
        assert!(rows[0].payload.as_deref().unwrap().contains(r#""id":7"#));
    }

    #[test]
    fn plain_lists_of_doubles_across_many_record_batches() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.parquet");
        let n = READ_ROWS * 2 + 5;
        let mut b = ListBuilder::new(Float64Builder::new());
        for i in 0..n {
            b.values().append_slice(&[i as f64 + 1.0, 0.5, -1.0]);
            b.append(true);
        }
        write(&path, vec![("emb", Arc::new(b.finish()) as ArrayRef)]);
        let fields = JsonFields { vector: "emb".into(), id: Some("id".into()) };
        let input = Input::open(&path, &fields).unwrap();
        assert_eq!((input.dim, input.rows), (Some(3), n), "a plain list's dimension comes from its first row");
        let rows = read_all(&path, &fields, 3).unwrap();
        assert_eq!(rows.len(), n);
        for (i, r) in rows.iter().enumerate() {
            assert_eq!((r.id, r.vector[0], r.payload.as_ref()), (100 + i as u64, i as f32 + 1.0, None), "row {i}");
        }
    }

    #[test]
    fn bad_rows_and_columns_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.parquet");
        let fields = JsonFields::default();
        let good: &[Option<f32>] = &[Some(1.0), Some(0.0)];

        write(&p, vec![("vector", fixed(&[Some(good), Some(&[Some(1.0), Some(f32::NAN)])], 2))]);
        assert_eq!(error(&p, &fields, 2), "/c.parquet row 1 column vector[1]: NaN is not a finite number");
        write(&p, vec![("vector", fixed(&[Some(good), Some(&[Some(1.0), None])], 2))]);
        assert_eq!(error(&p, &fields, 2), "/c.parquet row 1 column vector[1]: null is not a number");
        write(&p, vec![("vector", fixed(&[Some(good), None], 2))]);
        assert_eq!(error(&p, &fields, 2), "/c.parquet row 1 column vector: null: every row needs a vector");
        write(&p, vec![("vector", fixed(&[Some(good)], 2))]);
        assert_eq!(error(&p, &fields, 3), "/c.parquet: vectors of dimension 2, the collection's is 3");

        let mut b = ListBuilder::new(Float32Builder::new());
        b.values().append_slice(&[1.0, 0.0]);
        b.append(true);
        b.values().append_slice(&[1.0, 0.0, 0.0]);
        b.append(true);
        write(&p, vec![("vector", Arc::new(b.finish()) as ArrayRef)]);
        assert_eq!(error(&p, &fields, 2), "/c.parquet row 1 column vector: 3 components, the collection's dimension is 2");

        let two = fixed(&[Some(good), Some(good)], 2);
        write(&p, vec![("id", Arc::new(Int64Array::from(vec![1, -1])) as ArrayRef), ("vector", two.clone())]);
        assert_eq!(error(&p, &fields, 2), "/c.parquet row 1 column id: -1 is not an id (a whole number from 0 to 2^64-1)");
        write(&p, vec![("id", Arc::new(Int64Array::from(vec![Some(1), None])) as ArrayRef), ("vector", two.clone())]);
        assert_eq!(error(&p, &fields, 2), "/c.parquet row 1 column id: null is not an id (every row of an id column needs one)");

        // Columns that cannot be loaded are refused when the file is opened.
        write(&p, vec![("id", Arc::new(StringArray::from(vec!["a", "b"])) as ArrayRef), ("vector", two.clone())]);
        assert!(error(&p, &fields, 2).starts_with("/c.parquet column id: Utf8 cannot hold ids"));
        write(&p, vec![("vector", two.clone()), ("day", Arc::new(Date32Array::from(vec![1, 2])) as ArrayRef)]);
        assert!(error(&p, &fields, 2).starts_with("/c.parquet column day: Date32 cannot be carried as a payload"));
        write(&p, vec![("vector", Arc::new(StringArray::from(vec!["a", "b"])) as ArrayRef)]);
        assert!(error(&p, &fields, 2).starts_with("/c.parquet column vector: Utf8 cannot hold vectors"));
        write(&p, vec![("emb", two)]);
        assert!(error(&p, &fields, 2).starts_with("/c.parquet: no column \"vector\" to take vectors from (columns: emb;"));
        std::fs::write(&p, b"not parquet").unwrap();
        assert!(error(&p, &fields, 2).starts_with("/c.parquet: not a readable Parquet file"));
    }
}
