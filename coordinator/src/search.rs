//! Scatter-gather searches: every shard searched (a filter checked once
//! here and sent along), the global top-k merged, and each shard's plan
//! reported.

use std::time::Duration;

use shoal_proto::{ErrorCode, NodeId, v1};

use crate::cluster::{Cluster, Until, bounded};
use crate::error::{Error, Result};
use crate::merge::merge_top_k;
use crate::validate;
use shoal_control::model::Collection;

/// A search as the coordinator runs it (both Search and SearchBatch).
#[derive(Debug, Clone, Default)]
pub struct SearchQuery {
    pub collection: String,
    pub queries: Vec<Vec<f32>>,
    pub k: u32,
    pub ef: u32,
    pub with_payload: bool,
    pub allow_partial: bool,
    pub timeout_ms: u32,
    /// Only points matching this (docs/filters.md).
    pub filter: Option<v1::Filter>,
    pub allow_unindexed: bool,
}

impl SearchQuery {
    /// A search of `queries` for `k` hits, with the defaults otherwise.
    pub fn new(collection: impl Into<String>, queries: Vec<Vec<f32>>, k: u32) -> Self {
        SearchQuery {
            collection: collection.into(),
            queries,
            k,
            ef: 0,
            with_payload: false,
            allow_partial: false,
            timeout_ms: 0,
            filter: None,
            allow_unindexed: false,
        }
    }
}

#[derive(Debug, Clone)]
pub struct SearchOutcome {
    pub results: Vec<Vec<v1::Hit>>,
    pub shards_total: u32,
    pub shards_answered: u32,
    pub partial: bool,
    /// Per query, how each shard that answered found its hits.
    pub explain: Vec<Vec<v1::ShardExplain>>,
}

impl Cluster {
    /// Scatter-gather search for one or more query vectors.
    pub async fn search_many(&self, q: SearchQuery, caller: Option<Duration>) -> Result<SearchOutcome> {
        let c = self.collection(&q.collection)?;
        let limits = &self.opts.limits;
        if q.queries.is_empty() || q.queries.len() > limits.max_queries {
            return Err(Error::Invalid(format!("a search takes 1 to {} query vectors, got {}", limits.max_queries, q.queries.len())));
        }
        for (i, v) in q.queries.iter().enumerate() {
            vector_check(v, &c, i, q.queries.len())?;
        }
        let ef = validate::search_params(q.k, q.ef, limits)?;
        validate::hits(q.queries.len(), q.k, limits)?;
        if let Some(f) = &q.filter {
            crate::filtered::check_filter(&c, f, q.allow_unindexed)?;
        }
        let own = if q.timeout_ms == 0 { self.opts.search_timeout } else { Duration::from_millis(u64::from(q.timeout_ms)) };
        let timeout = bounded(own, caller);
        let n = q.queries.len();
        let queries: Vec<v1::Vector> = q.queries.into_iter().map(|values| v1::Vector { values }).collect();
        let (k, with_payload, allow_unindexed) = (q.k, q.with_payload, q.allow_unindexed);
        let filter = q.filter;
        let until = if q.allow_partial { Until::All } else { Until::FirstFailure };
        let g = self
            .scatter_until(&c, timeout, until, |client, shard, timeout| {
                let (queries, filter) = (queries.clone(), filter.clone());
                let req = v1::SearchShardRequest { shard, queries, k, ef, with_payload, filter, allow_unindexed };
                async move { client.search_shard(req, timeout).await }
            })
            .await;
        let total = c.shard_count();
        let answered = g.answers.len() as u32;
        if let Some(err) = search_failure(&g.failures, total, q.allow_partial) {
            return Err(err);
        }
        let mut per_query: Vec<Vec<Vec<v1::Hit>>> = vec![Vec::with_capacity(answered as usize); n];
        let mut explain: Vec<Vec<v1::ShardExplain>> = vec![Vec::with_capacity(answered as usize); n];
        for ((shard, resp), (_, node)) in g.answers.into_iter().zip(g.by) {
            for (qi, r) in resp.results.into_iter().enumerate().take(n) {
                per_query[qi].push(r.hits);
                explain[qi].push(v1::ShardExplain { shard, node: node.to_string(), explain: r.explain });
            }
        }
        let results = tracing::info_span!("merge", queries = n, k)
            .in_scope(|| per_query.into_iter().map(|lists| merge_top_k(lists, k as usize)).collect());
        Ok(SearchOutcome { results, shards_total: total, shards_answered: answered, partial: answered < total, explain })
    }
}

/// The error a search ends with, if it must end with one. A caller's
/// mistake on any shard (a bad request, an answer over a limit) is the
/// caller's to fix and is never hidden behind partial results; shards that
/// could not answer fail the search unless partial results are allowed.
pub(crate) fn search_failure(failures: &[(u32, NodeId, Error)], total: u32, allow_partial: bool) -> Option<Error> {
    let caller_error = |e: &Error| matches!(e.code(), ErrorCode::InvalidArgument | ErrorCode::ResourceExhausted | ErrorCode::NotFound);
    if let Some((i, node, e)) = failures.iter().find(|f| caller_error(&f.2)) {
        return Some(e.clone().context(format!("shard {i} on node {node}")));
    }
    // A shard whose every copy is damaged leads: a retry cannot help it
    // (an operator must recover it), where one that was unreachable may
    // answer the next time.
    let (i, node, e) = failures.iter().find(|f| f.2.code() == ErrorCode::DataLoss).or(failures.first())?;
    if allow_partial {
        return None;
    }
    Some(Error::ShardsUnanswered {
        failed: failures.len(),
        total,
        shard: *i,
        node: node.clone(),
        first: Box::new(e.clone()),
        all_late: failures.iter().all(|f| f.2.code() == ErrorCode::DeadlineExceeded),
    })
}

fn vector_check(v: &[f32], c: &Collection, i: usize, n: usize) -> Result<()> {
    if n == 1 { validate::vector(v, &c.spec, "query") } else { validate::vector(v, &c.spec, format_args!("query {i}")) }
}

#[cfg(test)]
mod tests {
    use shoal_proto::ShoalError;

    use super::*;

    fn node(s: &str) -> NodeId {
        NodeId::parse(s).unwrap()
    }

    #[test]
    fn a_caller_error_on_one_shard_is_never_hidden_or_made_retryable() {
        let too_big = Error::Remote(ShoalError::exhausted("the answer outgrew the message limit"));
        let gone = Error::Remote(ShoalError::unavailable("connection lost", Duration::from_millis(300)));
        let failures = vec![(1, node("b"), gone.clone()), (2, node("c"), too_big)];
        for allow_partial in [false, true] {
            let e = search_failure(&failures, 3, allow_partial).unwrap();
            assert_eq!(e.code(), ErrorCode::ResourceExhausted, "{e:?}");
            assert_eq!(e.retry_after(), None);
            assert!(e.to_string().contains("shard 2 on node c"), "{e}");
        }
        let e = search_failure(&[(1, node("b"), gone.clone())], 3, false).unwrap();
        assert_eq!((e.code(), e.retry_after()), (ErrorCode::Unavailable, Some(Duration::from_millis(300))));
        assert_eq!(
            e.to_string(),
            "1 of 3 shards did not answer (first: shard 1 on node b: connection lost); set allow_partial to get what the others found"
        );
        assert!(search_failure(&[(1, node("b"), gone)], 3, true).is_none());
        let late = Error::Remote(ShoalError::deadline("no answer within 2s"));
        assert_eq!(search_failure(&[(0, node("a"), late)], 3, false).unwrap().code(), ErrorCode::DeadlineExceeded);
        assert!(search_failure(&[], 3, false).is_none());
    }

    /// A shard every replica of which lost its data leads the search's
    /// error, with no retry hint.
    #[test]
    fn a_lost_shard_leads_a_search_error() {
        let lost = Error::Remote(ShoalError::new(ErrorCode::DataLoss, "shard docs/1 on a is damaged"));
        let gone = Error::Remote(ShoalError::unavailable("connection lost", Duration::from_millis(300)));
        let failures = vec![(0, node("b"), gone), (1, node("a"), lost)];
        let e = search_failure(&failures, 3, false).unwrap();
        assert_eq!((e.code(), e.retry_after()), (ErrorCode::DataLoss, None), "{e}");
        assert!(e.to_string().contains("shard 1 on node a"), "{e}");
        assert!(search_failure(&failures, 3, true).is_none(), "partial results leave the lost shard out");
    }
}
