//! Searches, counts and scrolls under a filter, on committed state.

use crate::error::{InvalidInput, Result};
use crate::filter::Filter;
use crate::session::{self, Found, Page, SearchParams};
use crate::stop::Stop;

use super::Index;

/// A filter, and whether fields without a ready index may be read from
/// every point's payload instead of being refused.
#[derive(Clone, Copy, Debug)]
pub struct Where<'a> {
    /// The filter.
    pub filter: &'a Filter,
    /// Accept a scan of the payloads for fields without a ready index.
    pub allow_unindexed: bool,
}

impl<'a> Where<'a> {
    /// `filter`, answered from indexes only.
    pub fn new(filter: &'a Filter) -> Self {
        Where { filter, allow_unindexed: false }
    }
}

/// Most points one scroll page returns.
pub const MAX_SCROLL_LIMIT: usize = 10_000;

impl Index {
    /// The `k` nearest live points that match `filter`, with what the
    /// shard did to find them. The filter is checked whole first: a bad
    /// one is an [`Error::Invalid`](crate::Error::Invalid) naming its place, and nothing is
    /// searched.
    pub fn search_where(&self, query: &[f32], params: SearchParams, filter: Where<'_>, stop: &Stop) -> Result<Found> {
        params.validate()?;
        let query = session::prepare_query(&self.params, query)?;
        let shared = self.resize.read();
        let mut s = self.take_session()?;
        let result = s.prepare(&self.store, filter.filter, filter.allow_unindexed).and_then(|node| {
            s.search_where(&self.store, &shared, &self.params, &query, params, self.opts.rescore, &node, &self.opts.planner, stop)
        });
        self.return_session_after(s, &result);
        result
    }

    /// How many live points match `filter`, exactly.
    pub fn count(&self, filter: Where<'_>) -> Result<u64> {
        let _shared = self.resize.read();
        let mut s = self.take_session()?;
        let result = s
            .prepare(&self.store, filter.filter, filter.allow_unindexed)
            .and_then(|node| s.count_where(&self.store, &node, &self.opts.planner));
        self.return_session_after(s, &result);
        result
    }

    /// Up to `limit` live points matching `filter` whose ids are above
    /// `after`, in ascending id order, with their payloads and, if asked,
    /// their vectors. Pass the page's `next_after` to get the next one;
    /// each page reads the latest commit.
    pub fn scroll(&self, filter: Where<'_>, after: Option<u64>, limit: usize, with_vector: bool) -> Result<Page> {
        if limit == 0 || limit > MAX_SCROLL_LIMIT {
            return Err(InvalidInput::BadLimit { limit, max: MAX_SCROLL_LIMIT }.into());
        }
        let shared = self.resize.read();
        let mut s = self.take_session()?;
        let result = s
            .prepare(&self.store, filter.filter, filter.allow_unindexed)
            .and_then(|node| s.scroll_where(&self.store, &shared, &self.params, &node, after, limit, with_vector, &self.opts.planner));
        self.return_session_after(s, &result);
        result
    }
}
