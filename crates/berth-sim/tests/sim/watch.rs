//! Watches: event sequences, resumption from a revision, selector transitions, bookmarks,
//! timeouts, 410 Gone, and kube-runtime's watcher and reflector converging through dropped
//! streams and forced relists.

use std::time::Duration;

use berth_sim::SimConfig;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams},
    runtime::{WatchStreamExt, reflector, watcher},
};
use serde_json::json;

use crate::support::{cluster, cluster_with, eventually};

async fn make(api: &Api<ConfigMap>, name: &str, labels: serde_json::Value) -> ConfigMap {
    api.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap(),
    )
    .await
    .unwrap()
}

/// Reads events until `n` arrived or the stream ends.
async fn take<S>(stream: S, n: usize) -> Vec<String>
where
    S: futures::Stream<Item = Result<WatchEvent<ConfigMap>, kube::Error>>,
{
    let events: Vec<_> = tokio::time::timeout(
        Duration::from_secs(10),
        stream.take(n).try_collect::<Vec<_>>(),
    )
    .await
    .expect("events arrive")
    .unwrap();
    events
        .iter()
        .map(|e| match e {
            WatchEvent::Added(o) => format!("ADDED {}", o.name_any()),
            WatchEvent::Modified(o) => format!("MODIFIED {}", o.name_any()),
            WatchEvent::Deleted(o) => format!("DELETED {}", o.name_any()),
            WatchEvent::Bookmark(b) => format!("BOOKMARK {}", b.metadata.resource_version),
            WatchEvent::Error(s) => format!("ERROR {} {}", s.code, s.reason),
        })
        .collect()
}

#[tokio::test]
async fn watch_from_a_revision_sees_every_change_in_order() {
    let sim = cluster().await;
    let cms: Api<ConfigMap> = Api::namespaced(sim.client().await.unwrap(), "default");
    let start = make(&cms, "before", json!({}))
        .await
        .resource_version()
        .unwrap();
    make(&cms, "a", json!({})).await;
    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "v"}})),
    )
    .await
    .unwrap();
    cms.delete("a", &DeleteParams::default()).await.unwrap();
    make(&cms, "b", json!({})).await;
    let stream = cms.watch(&WatchParams::default(), &start).await.unwrap();
    assert_eq!(
        take(stream, 4).await,
        ["ADDED a", "MODIFIED a", "DELETED a", "ADDED b"]
    );

    // Without a revision, a watch starts with the current state.
    let stream = cms.watch(&WatchParams::default(), "0").await.unwrap();
    let mut seen = take(stream, 2).await;
    seen.sort();
    assert_eq!(seen, ["ADDED b", "ADDED before"]);
}

#[tokio::test]
async fn leaving_and_entering_a_selector_are_deleted_and_added() {
    let sim = cluster().await;
    let cms: Api<ConfigMap> = Api::namespaced(sim.client().await.unwrap(), "default");
    let start = make(&cms, "c", json!({"team": "a"}))
        .await
        .resource_version()
        .unwrap();
    cms.patch(
        "c",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"team": "b"}}})),
    )
    .await
    .unwrap();
    cms.patch(
        "c",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}})),
    )
    .await
    .unwrap();
    cms.patch(
        "c",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"x": "1"}})),
    )
    .await
    .unwrap();
    let stream = cms
        .watch(&WatchParams::default().labels("team=a"), &start)
        .await
        .unwrap();
    assert_eq!(
        take(stream, 3).await,
        ["DELETED c", "ADDED c", "MODIFIED c"]
    );
}

#[tokio::test]
async fn bookmarks_timeouts_and_gone() {
    let sim = cluster_with(SimConfig {
        bookmark_interval: Duration::from_millis(100),
        history_limit: 5,
        ..SimConfig::api_only()
    })
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(sim.client().await.unwrap(), "default");
    let first = make(&cms, "first", json!({}))
        .await
        .resource_version()
        .unwrap();

    let stream = cms.watch(&WatchParams::default(), &first).await.unwrap();
    let events = take(stream, 1).await;
    assert!(events[0].starts_with("BOOKMARK "), "{events:?}");

    // timeoutSeconds ends the stream.
    let stream = cms
        .watch(
            &WatchParams::default().disable_bookmarks().timeout(1),
            &sim.revision().to_string(),
        )
        .await
        .unwrap();
    let all: Vec<_> = tokio::time::timeout(Duration::from_secs(10), stream.collect::<Vec<_>>())
        .await
        .expect("the watch ends by itself");
    assert!(all.is_empty());

    for i in 0..10 {
        make(&cms, &format!("n{i}"), json!({})).await;
    }
    let stream = cms.watch(&WatchParams::default(), &first).await.unwrap();
    assert_eq!(take(stream, 1).await, ["ERROR 410 Expired"]);
}

/// A bookmark names a revision the watch has passed on, never one past changes still queued
/// for it: a client resumes from its last bookmark, and anything between would be lost. (The
/// sim's bookmarks named the store's newest revision: at 10 000 workspaces an operator whose
/// pod watch lagged and was closed resumed past pod updates and left workspaces Starting.)
#[tokio::test]
async fn no_event_arrives_after_a_bookmark_past_it() {
    let sim = cluster_with(SimConfig {
        bookmark_interval: Duration::from_millis(5),
        ..SimConfig::api_only()
    })
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(sim.client().await.unwrap(), "default");
    let from = sim.revision().to_string();
    let stream = cms.watch(&WatchParams::default(), &from).await.unwrap();
    // More than the connection buffers while nobody reads: the watch falls behind, and its
    // bookmarks come due while changes wait for it.
    let n = 1500;
    let data = "x".repeat(8 * 1024);
    for i in 0..n {
        cms.create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": format!("b{i}")}, "data": {"k": data}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut stream = Box::pin(stream);
    let (mut added, mut bookmarks, mut bookmark) = (0, 0, 0u64);
    while added < n {
        let event = tokio::time::timeout(Duration::from_secs(20), stream.next())
            .await
            .expect("the watch goes on")
            .expect("the watch is open")
            .unwrap();
        match event {
            WatchEvent::Bookmark(b) => {
                bookmarks += 1;
                bookmark = b.metadata.resource_version.parse().unwrap();
            }
            WatchEvent::Added(cm) => {
                let revision: u64 = cm.resource_version().unwrap().parse().unwrap();
                assert!(
                    revision > bookmark,
                    "{} at revision {revision} came after a bookmark at {bookmark}",
                    cm.name_any()
                );
                added += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(bookmarks > 0, "bookmarks were sent meanwhile");
}

#[tokio::test]
async fn reflector_converges_through_closed_streams_and_forced_relists() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for i in 0..3 {
        make(&cms, &format!("c{i}"), json!({})).await;
    }
    let (reader, writer) = reflector::store::<ConfigMap>();
    let stream =
        reflector(writer, watcher(cms.clone(), watcher::Config::default())).applied_objects();
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while stream.next().await.is_some() {}
    });
    let names = |reader: &reflector::Store<ConfigMap>| {
        let mut names: Vec<String> = reader.state().iter().map(|c| c.name_any()).collect();
        names.sort();
        names
    };
    let want = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // kube-root-ca.crt is created with every namespace.
    eventually(Duration::from_secs(10), "the initial list", || async {
        (names(&reader) == want(&["c0", "c1", "c2", "kube-root-ca.crt"])).then_some(())
    })
    .await;

    // The server closes every stream; the watcher resumes from its revision without a relist.
    let lists_before = sim.count_requests(|k| k.verb == "list" && k.resource == "configmaps");
    sim.close_watches();
    make(&cms, "c3", json!({})).await;
    cms.delete("c0", &DeleteParams::default()).await.unwrap();
    eventually(
        Duration::from_secs(10),
        "changes made while the stream was down",
        || async {
            (names(&reader) == want(&["c1", "c2", "c3", "kube-root-ca.crt"])).then_some(())
        },
    )
    .await;
    assert_eq!(
        sim.count_requests(|k| k.verb == "list" && k.resource == "configmaps"),
        lists_before,
        "resumed, not relisted"
    );
    assert!(sim.count_requests(|k| k.verb == "watch" && k.resource == "configmaps") >= 2);

    // A forced 410 Gone makes the watcher relist, and it converges again.
    sim.expire_next_watch();
    sim.close_watches();
    cms.delete("c1", &DeleteParams::default()).await.unwrap();
    make(&cms, "c4", json!({})).await;
    eventually(
        Duration::from_secs(20),
        "convergence after a relist",
        || async {
            (names(&reader) == want(&["c2", "c3", "c4", "kube-root-ca.crt"])).then_some(())
        },
    )
    .await;
    assert!(
        sim.count_requests(|k| k.verb == "list" && k.resource == "configmaps") > lists_before,
        "relisted after 410"
    );
    task.abort();
}

fn api_error(error: kube::Error) -> kube::core::Status {
    match error {
        kube::Error::Api(status) => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// A client ahead of the store (a resourceVersion from a newer server, or made up) gets what
/// the real API server answers once its watch cache waited 3 s for that version: 504
/// `Too large resource version`; an Exact list is answered at once. A version reached within
/// the wait is served.
#[tokio::test]
async fn a_resource_version_ahead_of_the_store_is_a_504_after_the_wait() {
    let sim = cluster().await;
    // kube retries a 504 by itself for minutes: this client shows the answer as it is.
    let mut config = kube::Config::from_custom_kubeconfig(sim.kubeconfig(), &Default::default())
        .await
        .unwrap();
    config.default_retry = false;
    let cms: Api<ConfigMap> = Api::namespaced(kube::Client::try_from(config).unwrap(), "default");
    let now: u64 = make(&cms, "here", json!({}))
        .await
        .resource_version()
        .unwrap()
        .parse()
        .unwrap();
    let ahead = (now + 1000).to_string();

    let started = std::time::Instant::now();
    let error = api_error(
        cms.list(&kube::api::ListParams::default().at(&ahead))
            .await
            .unwrap_err(),
    );
    assert!(started.elapsed() >= Duration::from_secs(3), "it waited");
    assert_eq!((error.code, error.reason.as_str()), (504, "Timeout"));
    assert!(
        error.message.starts_with(&format!(
            "Timeout: Too large resource version: {ahead}, current: "
        )),
        "{}",
        error.message
    );

    let started = std::time::Instant::now();
    let exact = kube::api::ListParams::default()
        .at(&ahead)
        .matching(kube::api::VersionMatch::Exact);
    let error = api_error(cms.list(&exact).await.unwrap_err());
    assert_eq!(error.code, 504);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "Exact does not wait"
    );

    let error = match cms.watch(&WatchParams::default(), &ahead).await {
        Err(e) => api_error(e),
        Ok(_) => panic!("a watch from a future version was opened"),
    };
    assert_eq!(error.code, 504);

    // One revision ahead, and a write comes within the wait: served.
    let next = (now + 1).to_string();
    let writer = cms.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        make(&writer, "soon", json!({})).await;
    });
    let list = cms
        .list(&kube::api::ListParams::default().at(&next))
        .await
        .unwrap();
    assert!(list.items.iter().any(|c| c.name_any() == "soon"));
}

/// `compact: now` in `kube-system/berth-sim-faults` forgets the history, so a watch from an
/// older version gets 410 Gone, as after an etcd compaction.
#[tokio::test]
async fn the_faults_config_map_compacts_the_history_on_demand() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let old = make(&cms, "old", json!({}))
        .await
        .resource_version()
        .unwrap();
    make(&cms, "newer", json!({})).await;
    let faults: Api<ConfigMap> = Api::namespaced(client, "kube-system");
    faults
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "berth-sim-faults"}, "data": {"compact": "now"}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    eventually(
        Duration::from_secs(5),
        "the history to be compacted",
        || {
            let cms = cms.clone();
            let old = old.clone();
            async move {
                let stream = cms.watch(&WatchParams::default(), &old).await.ok()?;
                let events = take(stream, 1).await;
                (events == ["ERROR 410 Expired"]).then_some(())
            }
        },
    )
    .await;
}
