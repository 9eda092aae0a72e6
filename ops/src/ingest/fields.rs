//! What the JSON Lines and Parquet readers share: how rows name their
//! fields, and what a parsed row is. Apart from both, so neither reader
//! depends on the other.

/// How JSON lines name their fields and Parquet files their columns.
#[derive(Debug, Clone)]
pub struct JsonFields {
    pub vector: String,
    /// `None`: ids are row numbers.
    pub id: Option<String>,
}

impl Default for JsonFields {
    fn default() -> Self {
        JsonFields { vector: "vector".into(), id: Some("id".into()) }
    }
}

/// A row's vector, its own id if it has one, and its payload.
pub(super) type Parsed = (Vec<f32>, Option<u64>, Option<String>);
