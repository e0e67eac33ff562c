//! The request log: how many requests each (user, verb, resource, subresource, code) made,
//! so tests and benchmarks can count exactly what a client did.

use std::{collections::BTreeMap, sync::Mutex};

use serde::Serialize;

/// What a request was.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct RequestKey {
    pub user: String,
    /// get, list, watch, create, update, patch, delete, deletecollection, or the HTTP method
    /// in lower case for non-resource paths.
    pub verb: String,
    /// The API group ("" for the core group and non-resource requests).
    pub group: String,
    /// The resource (plural), or the path for non-resource requests.
    pub resource: String,
    pub subresource: String,
    pub code: u16,
}

/// One row of the log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RequestCount {
    #[serde(flatten)]
    pub key: RequestKey,
    pub count: u64,
}

/// Counters of requests.
#[derive(Default)]
pub struct RequestLog {
    counts: Mutex<BTreeMap<RequestKey, u64>>,
}

impl RequestLog {
    pub fn record(&self, key: RequestKey) {
        *self
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key)
            .or_default() += 1;
    }

    /// Every counter.
    pub fn snapshot(&self) -> Vec<RequestCount> {
        self.counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(key, count)| RequestCount {
                key: key.clone(),
                count: *count,
            })
            .collect()
    }

    /// The sum of counters whose key passes `filter`.
    pub fn count(&self, filter: impl Fn(&RequestKey) -> bool) -> u64 {
        self.counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(k, _)| filter(k))
            .map(|(_, c)| *c)
            .sum()
    }

    pub fn reset(&self) {
        self.counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}
