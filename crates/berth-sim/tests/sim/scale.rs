//! Scale sanity (not a timing): 10,000 pods are created and listed, and five watchers that
//! started before receive every one of those events.

use std::collections::HashSet;

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, ResourceExt,
    api::{ListParams, PostParams, WatchEvent, WatchParams},
};

use crate::support::{cluster, pod};

const PODS: usize = 10_000;
const WATCHERS: usize = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_pods_listed_and_watched_by_five() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let start = sim.revision().to_string();

    let mut watchers = vec![];
    for _ in 0..WATCHERS {
        let events = pods
            .watch(&WatchParams::default().timeout(290), &start)
            .await
            .unwrap();
        watchers.push(tokio::spawn(async move {
            let mut seen = HashSet::new();
            let mut events = Box::pin(events);
            while seen.len() < PODS {
                match events.try_next().await {
                    Ok(Some(WatchEvent::Added(p))) => {
                        seen.insert(p.name_any());
                    }
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => break,
                }
            }
            seen.len()
        }));
    }

    stream::iter(0..PODS)
        .map(|i| {
            let pods = pods.clone();
            async move {
                pods.create(&PostParams::default(), &pod(&format!("p-{i:05}"), "scale"))
                    .await
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await
        .unwrap();

    let listed = pods.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), PODS);
    let paged = pods.list(&ListParams::default().limit(500)).await.unwrap();
    assert_eq!(paged.items.len(), 500);
    assert_eq!(
        paged.metadata.remaining_item_count,
        Some((PODS - 500) as i64)
    );

    for watcher in watchers {
        assert_eq!(watcher.await.unwrap(), PODS, "every watcher saw every pod");
    }
}
