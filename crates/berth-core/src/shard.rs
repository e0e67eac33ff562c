//! Which operator replica reconciles a workspace: its namespace's bucket (of [`BUCKETS`]),
//! written as the `berth.dev/shard` label on the workspace and on what Berth makes for it, and
//! which buckets each of N shards owns (`bench/sharding.md`).
//!
//! The label is the bucket, not the shard: changing the number of shards changes only which
//! buckets each operator selects, never a label, so it moves no object and costs no write.

use berth_api::labels::SHARD;

/// How many buckets namespaces hash into; the most shards an installation can have.
pub const BUCKETS: u32 = 256;

/// FNV-1a, 64 bits: stable across versions and machines (a bucket is written on objects).
fn fnv1a64(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The bucket of a namespace: every workspace in it, and everything Berth makes for them.
pub fn bucket(namespace: &str) -> u32 {
    (fnv1a64(namespace) % u64::from(BUCKETS)) as u32
}

/// The value of the `berth.dev/shard` label in `namespace`.
pub fn label_value(namespace: &str) -> String {
    bucket(namespace).to_string()
}

/// Whether an object in `namespace` with `labels` carries the bucket label it should (a
/// workspace made before sharding, or one whose author set the label, does not).
pub fn labelled(namespace: &str, labels: &std::collections::BTreeMap<String, String>) -> bool {
    labels
        .get(SHARD)
        .is_some_and(|v| *v == label_value(namespace))
}

/// The selector of objects no shard selects: without the label, or with a value that is no
/// bucket (`notin` selects objects without the key too). What the sharder labels.
pub fn unlabelled_selector() -> String {
    let buckets: Vec<String> = (0..BUCKETS).map(|b| b.to_string()).collect();
    format!("{SHARD} notin ({})", buckets.join(","))
}

/// One of `count` shards: the buckets `b` with `b mod count == index`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shard {
    index: u32,
    count: u32,
}

impl Shard {
    /// Every namespace: one operator reconciles all (no sharding).
    pub const ALL: Shard = Shard { index: 0, count: 1 };

    /// Shard `index` of `count`; None unless `index < count <= BUCKETS`.
    pub fn new(index: u32, count: u32) -> Option<Shard> {
        (index < count && count <= BUCKETS).then_some(Shard { index, count })
    }

    pub fn index(self) -> u32 {
        self.index
    }

    pub fn count(self) -> u32 {
        self.count
    }

    /// Whether this shard reconciles the workspaces of `namespace`.
    pub fn owns(self, namespace: &str) -> bool {
        bucket(namespace) % self.count == self.index
    }

    /// The label selector of this shard's objects (`berth.dev/shard in (...)`, its buckets);
    /// None for [`Shard::ALL`], which selects everything, labelled or not.
    pub fn selector(self) -> Option<String> {
        if self.count == 1 {
            return None;
        }
        let buckets: Vec<String> = (self.index..BUCKETS)
            .step_by(self.count as usize)
            .map(|b| b.to_string())
            .collect();
        Some(format!("{SHARD} in ({})", buckets.join(",")))
    }

    /// Whether this shard's operator also labels the workspaces no shard selects yet (the
    /// sharder): the first shard's, so exactly one operator does. Unsharded, nobody needs a
    /// workspace's label and none is written (a label written while the operator adds its
    /// finalizer made that write meet a cache one change behind, and fail).
    pub fn labels_the_unlabelled(self) -> bool {
        self.index == 0 && self.count > 1
    }

    /// `<index>-of-<count>`: the shard in Lease names, logs and metrics.
    pub fn name(self) -> String {
        format!("{}-of-{}", self.index, self.count)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// The buckets are written on objects: they must never change between versions.
    #[test]
    fn a_namespace_always_has_the_same_bucket() {
        for (namespace, bucket_of) in [("default", 254), ("team-a", 214), ("kube-system", 94)] {
            assert_eq!(bucket(namespace), bucket_of, "{namespace}");
            assert_eq!(label_value(namespace), bucket_of.to_string());
        }
    }

    #[test]
    fn shards_partition_the_namespaces() {
        for count in [1, 2, 3, 7, BUCKETS] {
            for n in 0..500 {
                let namespace = format!("team-{n}");
                let owners = (0..count)
                    .filter(|&i| Shard::new(i, count).unwrap().owns(&namespace))
                    .count();
                assert_eq!(owners, 1, "{namespace} of {count} shards");
            }
        }
    }

    #[test]
    fn a_shard_selects_its_buckets_and_the_only_shard_everything() {
        assert_eq!(Shard::ALL.selector(), None);
        assert!(!Shard::ALL.labels_the_unlabelled(), "nothing to label for");
        assert!(Shard::ALL.owns("anything"));
        let second = Shard::new(1, 3).unwrap();
        let selector = second.selector().unwrap();
        assert!(
            selector.starts_with("berth.dev/shard in (1,4,7,"),
            "{selector}"
        );
        assert!(selector.ends_with(",253)"), "{selector}");
        assert_eq!(selector.matches(',').count(), 85 - 1, "85 buckets");
        assert_eq!(second.name(), "1-of-3");
        assert!(!second.labels_the_unlabelled());
        assert!(Shard::new(0, 3).unwrap().labels_the_unlabelled());
        assert_eq!(Shard::new(3, 3), None);
        assert_eq!(Shard::new(0, BUCKETS + 1), None);
        let unlabelled = unlabelled_selector();
        assert!(
            unlabelled.starts_with("berth.dev/shard notin (0,1,2,")
                && unlabelled.ends_with(",255)"),
            "{unlabelled}"
        );
    }

    #[test]
    fn only_the_namespace_bucket_is_a_label() {
        let with = |v: &str| BTreeMap::from([(SHARD.to_owned(), v.to_owned())]);
        assert!(labelled("default", &with("254")));
        assert!(!labelled("default", &with("3")), "set by hand, wrongly");
        assert!(
            !labelled("default", &BTreeMap::new()),
            "made before sharding"
        );
    }
}
