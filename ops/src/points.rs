//! `shoalctl search`, `count`, `scroll`, `delete` and `index`: points and
//! their payload indexes through the public API, filters written as JSON
//! (docs/filters.md).

use std::io::Write;

use anyhow::Context;
use shoal_proto::v1;

use crate::ctl;

/// What `shoalctl` does with points.
#[derive(clap::Args, Debug)]
pub struct SearchArgs {
    pub collection: String,
    /// The query vector as a JSON array of numbers.
    #[arg(long, conflicts_with = "like")]
    pub vector: Option<String>,
    /// Search near the point with this id (its stored vector).
    #[arg(long)]
    pub like: Option<u64>,
    #[arg(long, default_value_t = 10)]
    pub k: u32,
    /// Candidate list per shard (0: the default for k).
    #[arg(long, default_value_t = 0)]
    pub ef: u32,
    /// Only points matching this filter: JSON text, or @FILE.
    #[arg(long)]
    pub filter: Option<String>,
    /// Read fields without a ready index from every payload (slow).
    #[arg(long)]
    pub allow_unindexed: bool,
    /// Print the hits' payloads.
    #[arg(long)]
    pub payload: bool,
    /// Print each shard's plan (always in the JSON answer).
    #[arg(long)]
    pub explain: bool,
}

#[derive(clap::Args, Debug)]
pub struct CountArgs {
    pub collection: String,
    /// JSON text, or @FILE (none: every point).
    #[arg(long)]
    pub filter: Option<String>,
    #[arg(long)]
    pub allow_unindexed: bool,
}

#[derive(clap::Args, Debug)]
pub struct ScrollArgs {
    pub collection: String,
    /// JSON text, or @FILE (none: every point).
    #[arg(long)]
    pub filter: Option<String>,
    #[arg(long)]
    pub allow_unindexed: bool,
    /// Points after this id.
    #[arg(long)]
    pub after: Option<u64>,
    /// Points per page.
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
    /// Every page, not just the first: an export, one JSON object a line.
    #[arg(long)]
    pub all: bool,
    #[arg(long)]
    pub with_vector: bool,
}

#[derive(clap::Args, Debug)]
pub struct DeleteArgs {
    pub collection: String,
    /// Ids to delete, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub ids: Vec<u64>,
    /// Also every point matching this filter: JSON text, or @FILE.
    #[arg(long)]
    pub filter: Option<String>,
    #[arg(long)]
    pub allow_unindexed: bool,
}

/// Payload indexes of a collection.
#[derive(clap::Subcommand, Debug)]
pub enum IndexCommand {
    /// Index a payload field (built online on shards that hold points).
    Create {
        collection: String,
        /// A top-level key of the JSON payloads, or a dotted path.
        field: String,
        /// keyword, integer, float, bool or datetime.
        #[arg(value_parser = ["keyword", "integer", "float", "bool", "datetime"])]
        r#type: String,
        /// Return once every copy has declared it, not once it is built.
        #[arg(long)]
        no_wait: bool,
    },
    /// Drop a payload index.
    Drop { collection: String, field: String },
    /// Every shard's indexes and how far their builds are.
    List { collection: String },
}

/// A filter given as JSON text or @FILE, checked here so that a typo is
/// named before anything is sent.
pub fn read_filter(arg: &str) -> anyhow::Result<v1::Filter> {
    let text = match arg.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path).with_context(|| format!("reading the filter from {path}"))?,
        None => arg.to_owned(),
    };
    let f = shoal_filter::parse_json(&text)?;
    Ok(shoal_filter::wire::to_proto(&f))
}

fn filter_of(arg: Option<&str>) -> anyhow::Result<Option<v1::Filter>> {
    arg.map(read_filter).transpose()
}

/// A field type by its name.
pub fn field_type(name: &str) -> anyhow::Result<v1::FieldType> {
    let t = shoal_filter::FieldType::parse(name)
        .with_context(|| format!("field type {name:?} is not one of keyword, integer, float, bool, datetime"))?;
    Ok(shoal_filter::wire::field_type_to_proto(t))
}

/// `--index field:type` of `collections create`.
pub fn parse_index(s: &str) -> anyhow::Result<v1::FieldIndex> {
    let (field, t) = s.rsplit_once(':').with_context(|| format!("--index {s:?}: give field:type, such as tags:keyword"))?;
    Ok(v1::FieldIndex { field: field.to_owned(), r#type: field_type(t)? as i32 })
}

fn payload_text(p: &Option<v1::Payload>) -> String {
    match p.as_ref().and_then(|p| p.kind.as_ref()) {
        Some(v1::payload::Kind::Json(j)) => j.clone(),
        Some(v1::payload::Kind::Binary(b)) => format!("<{} bytes>", b.len()),
        None => String::new(),
    }
}

pub async fn search(endpoint: &str, a: SearchArgs) -> anyhow::Result<()> {
    let mut client = ctl::connect(endpoint).await?;
    let vector = match (&a.vector, a.like) {
        (Some(v), _) => serde_json::from_str::<Vec<f32>>(v).context("--vector: a JSON array of numbers")?,
        (None, Some(id)) => {
            let got = client.get(v1::GetRequest { collection: a.collection.clone(), ids: vec![id], with_vector: true }).await?.into_inner();
            got.points.into_iter().next().with_context(|| format!("--like {id}: no such point"))?.vector
        }
        (None, None) => anyhow::bail!("give --vector [..] or --like ID"),
    };
    let req = v1::SearchRequest {
        collection: a.collection,
        vector,
        k: a.k,
        ef: a.ef,
        with_payload: a.payload,
        filter: filter_of(a.filter.as_deref())?,
        allow_unindexed: a.allow_unindexed,
        ..Default::default()
    };
    let r = client.search(req).await?.into_inner();
    for (i, h) in r.hits.iter().enumerate() {
        let payload = if a.payload { format!("  {}", payload_text(&h.payload)) } else { String::new() };
        println!("{:>3}. id {:<12} distance {:.4}{payload}", i + 1, h.id, h.distance);
    }
    if r.hits.is_empty() {
        println!("no hits");
    }
    if a.explain {
        for s in &r.explain {
            let e = s.explain.clone().unwrap_or_default();
            let approx = if e.matches_exact { "" } else { "~" };
            println!(
                "  shard {:<3} node {:<10} plan {:<15} matches {approx}{:<9} compared {}",
                s.shard, s.node, e.plan, e.matches, e.compared
            );
        }
    }
    if r.partial {
        println!("partial: {} of {} shards answered", r.shards_answered, r.shards_total);
    }
    Ok(())
}

pub async fn count(endpoint: &str, a: CountArgs) -> anyhow::Result<()> {
    let mut client = ctl::connect(endpoint).await?;
    let req = v1::CountRequest {
        collection: a.collection,
        filter: filter_of(a.filter.as_deref())?,
        allow_unindexed: a.allow_unindexed,
        ..Default::default()
    };
    println!("{}", client.count(req).await?.into_inner().count);
    Ok(())
}

pub async fn scroll(endpoint: &str, a: ScrollArgs) -> anyhow::Result<()> {
    let mut client = ctl::connect(endpoint).await?;
    let filter = filter_of(a.filter.as_deref())?;
    let mut after = a.after;
    let out = std::io::stdout();
    let mut out = out.lock();
    loop {
        let req = v1::ScrollRequest {
            collection: a.collection.clone(),
            filter: filter.clone(),
            allow_unindexed: a.allow_unindexed,
            after,
            limit: a.limit,
            with_vector: a.with_vector,
            ..Default::default()
        };
        let page = client.scroll(req).await?.into_inner();
        for p in &page.points {
            let payload: serde_json::Value = match p.payload.as_ref().and_then(|p| p.kind.as_ref()) {
                Some(v1::payload::Kind::Json(j)) => serde_json::from_str(j).unwrap_or(serde_json::Value::String(j.clone())),
                Some(v1::payload::Kind::Binary(b)) => serde_json::json!({"binary_bytes": b.len()}),
                None => serde_json::Value::Null,
            };
            let mut line = serde_json::json!({"id": p.id, "payload": payload});
            if a.with_vector {
                line["vector"] = serde_json::json!(p.vector);
            }
            writeln!(out, "{line}")?;
        }
        match page.next_after {
            Some(next) if a.all => after = Some(next),
            Some(next) => {
                eprintln!("more after {next}: pass --after {next}, or --all for every page");
                return Ok(());
            }
            None => return Ok(()),
        }
    }
}

pub async fn delete(endpoint: &str, a: DeleteArgs) -> anyhow::Result<()> {
    anyhow::ensure!(!a.ids.is_empty() || a.filter.is_some(), "give --ids, --filter or both");
    let mut client = ctl::connect(endpoint).await?;
    let req = v1::DeleteRequest {
        collection: a.collection,
        ids: a.ids,
        filter: filter_of(a.filter.as_deref())?,
        allow_unindexed: a.allow_unindexed,
    };
    let w = client.delete(req).await?.into_inner();
    println!("deleted {} (missing {})", w.deleted, w.missing);
    Ok(())
}

pub async fn index(endpoint: &str, c: IndexCommand) -> anyhow::Result<()> {
    let mut client = ctl::connect(endpoint).await?;
    let info = match c {
        IndexCommand::Create { collection, field, r#type, no_wait } => {
            let index = Some(v1::FieldIndex { field, r#type: field_type(&r#type)? as i32 });
            client.create_field_index(v1::CreateFieldIndexRequest { collection, index, wait: !no_wait }).await?.into_inner()
        }
        IndexCommand::Drop { collection, field } => {
            client.drop_field_index(v1::DropFieldIndexRequest { collection, field }).await?.into_inner()
        }
        IndexCommand::List { collection } => {
            client.describe_collection(v1::DescribeCollectionRequest { name: collection }).await?.into_inner()
        }
    };
    print_indexes(&info);
    Ok(())
}

/// A collection's payload indexes and each shard's copy of them.
pub fn print_indexes(c: &v1::CollectionInfo) {
    let name = |t: i32| v1::FieldType::try_from(t).map_or("?".to_owned(), |t| t.as_str_name().to_ascii_lowercase());
    if c.field_indexes.is_empty() {
        println!("collection {}: no payload indexes", c.name);
        return;
    }
    let list: Vec<String> = c.field_indexes.iter().map(|f| format!("{} ({})", f.field, name(f.r#type))).collect();
    println!("collection {}: payload indexes {}", c.name, list.join(", "));
    for s in &c.shards {
        let states: Vec<String> = s
            .field_indexes
            .iter()
            .map(|f| {
                let state = if f.ready {
                    format!("ready, {} points", f.points)
                } else {
                    format!("building {}%", f.indexed_below * 100 / f.of.max(1))
                };
                let other = if f.other_type > 0 { format!(", {} of another type", f.other_type) } else { String::new() };
                format!("{} {state}{other}", f.field)
            })
            .collect();
        println!("  shard {:<3} node {:<10} {}", s.shard, s.node, if s.available { states.join("; ") } else { "DOWN".into() });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_and_indexes_read_from_the_command_line() {
        let f = read_filter(r#"{"must": [{"key": "tags", "match": "rust"}]}"#).unwrap();
        assert_eq!(f.must.len(), 1);
        let e = read_filter(r#"{"must": [{"key": "tags", "matches": "rust"}]}"#).unwrap_err().to_string();
        assert!(e.contains("filter must[0]: unknown operator"), "{e}");
        assert!(read_filter("@/nonexistent/filter.json").unwrap_err().to_string().contains("reading the filter"));
        assert_eq!(
            parse_index("meta.lang:keyword").unwrap(),
            v1::FieldIndex { field: "meta.lang".into(), r#type: v1::FieldType::Keyword as i32 }
        );
        assert!(parse_index("tags").is_err() && parse_index("tags:text").is_err());
    }
}
