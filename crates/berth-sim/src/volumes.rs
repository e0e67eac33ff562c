//! Storage, as a cluster's provisioner, binder and resizer handle it: a new claim gets a
//! volume and is Bound at once (dynamic provisioning), and a bound claim whose request grew
//! is resized.

use std::{sync::Arc, time::Duration};

use serde_json::{Value, json};

use crate::{
    meta::now_rfc3339,
    sim::{Sim, WriteContext},
    store::ChangeKind,
};

/// Binds new claims and resizes grown ones; runs until aborted.
pub async fn run(sim: Arc<Sim>) {
    let mut changes = sim.store.subscribe_to("/persistentvolumeclaims");
    loop {
        match changes.recv().await {
            Ok(change) if &*change.storage == "/persistentvolumeclaims" => match change.kind {
                ChangeKind::Added => bind_claim(&sim, &change.object),
                ChangeKind::Modified => expand_claim(&sim, &change.object),
                // The claim's files go with it (the volume's reclaim policy is Delete).
                ChangeKind::Deleted => sim.config.runtime.forget_claim(
                    change.object["metadata"]["uid"]
                        .as_str()
                        .unwrap_or_default(),
                ),
            },
            Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Volume expansion, as the external resizer and the kubelet do it: a bound claim whose
/// request grew past its capacity gets a `Resizing` condition at once, and the new capacity
/// (on the claim and its volume) a moment later.
fn expand_claim(sim: &Arc<Sim>, claim: &Value) {
    let storage = |v: &Value| v.as_str().and_then(crate::quantity::units);
    let requested = claim["spec"]["resources"]["requests"]["storage"].clone();
    let (Some(want), Some(have)) = (
        storage(&requested),
        storage(&claim["status"]["capacity"]["storage"]),
    ) else {
        return;
    };
    let resizing = claim["status"]["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["type"] == "Resizing"));
    if want <= have || resizing {
        return;
    }
    let (ns, name) = (
        claim["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        claim["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    );
    let volume = claim["spec"]["volumeName"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    sim.store
        .modify("/persistentvolumeclaims", &ns, &name, |c| {
            c["status"]["conditions"] = json!([{
                "type": "Resizing", "status": "True",
                "lastTransitionTime": now_rfc3339(),
                "message": format!("External resizer is resizing volume {volume}")
            }]);
            true
        });
    let sim = sim.clone();
    // As long as a container takes to start: the resize is visible, and quick on fast timings.
    let delay = sim
        .config
        .timings
        .container_start
        .max(Duration::from_millis(100));
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        sim.store.modify("/persistentvolumes", "", &volume, |pv| {
            pv["spec"]["capacity"]["storage"] = requested.clone();
            true
        });
        sim.store
            .modify("/persistentvolumeclaims", &ns, &name, |c| {
                c["status"]["capacity"]["storage"] = requested.clone();
                if let Some(status) = c["status"].as_object_mut() {
                    status.remove("conditions");
                }
                true
            });
    });
}

/// Dynamic provisioning: a new claim gets a volume and is Bound.
fn bind_claim(sim: &Sim, claim: &Value) {
    let (ns, name) = (
        claim["metadata"]["namespace"].as_str().unwrap_or_default(),
        claim["metadata"]["name"].as_str().unwrap_or_default(),
    );
    let uid = claim["metadata"]["uid"].as_str().unwrap_or_default();
    let volume = format!("pvc-{uid}");
    let size = claim["spec"]["resources"]["requests"]["storage"].clone();
    let modes = claim["spec"]["accessModes"].clone();
    if let Some(pvs) = sim.resource_type("", "v1", "persistentvolumes") {
        let pv = json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": volume},
            "spec": {
                "capacity": {"storage": size}, "accessModes": modes,
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": claim["spec"]["storageClassName"].as_str().unwrap_or("standard"),
                "claimRef": {"kind": "PersistentVolumeClaim", "namespace": ns, "name": name, "uid": uid, "apiVersion": "v1"},
                "hostPath": {"path": format!("/var/lib/berth-sim/{volume}")}
            }
        });
        let _ = sim.create(
            &pvs,
            "",
            pv,
            &WriteContext::system("persistentvolume-binder-controller"),
        );
    }
    sim.store.modify("/persistentvolumeclaims", ns, name, |c| {
        c["spec"]["volumeName"] = json!(volume);
        if c["spec"]["storageClassName"].is_null() {
            c["spec"]["storageClassName"] = json!("standard");
        }
        c["status"] =
            json!({"phase": "Bound", "accessModes": modes, "capacity": {"storage": size}});
        true
    });
}
