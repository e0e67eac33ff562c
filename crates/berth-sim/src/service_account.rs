//! The ServiceAccount admission plugin: a pod runs as a service account that exists and,
//! unless the pod or its account opts out (`automountServiceAccountToken: false`), gets the
//! `kube-api-access-*` projected volume (a token bound to the pod, the cluster CA and its
//! namespace) mounted where in-cluster clients look for it, in every container.

use serde_json::{Value, json};

use crate::{
    error::{ApiError, ApiResult},
    store::Store,
};

/// Where in-cluster clients read the token, `ca.crt` and `namespace`.
pub const MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The token's lifetime the real admission asks for (an hour and a little, so a kubelet's
/// rotation is seen).
const TOKEN_SECONDS: i64 = 3607;

/// Checks the pod's service account and mounts its token volume, as the real plugin does.
pub fn admit(store: &Store, namespace: &str, name: &str, pod: &mut Value) -> ApiResult<()> {
    let account = pod["spec"]["serviceAccountName"]
        .as_str()
        .filter(|s| !s.is_empty())
        .unwrap_or("default")
        .to_owned();
    let Some(stored) = store.get("/serviceaccounts", namespace, &account) else {
        return Err(ApiError::Forbidden {
            message: format!(
                "pods \"{name}\" is forbidden: error looking up service account {namespace}/{account}: serviceaccount \"{account}\" not found"
            ),
            kind: "pods".to_owned(),
            name: Some(name.to_owned()),
            group: String::new(),
        });
    };
    let automount = pod["spec"]["automountServiceAccountToken"]
        .as_bool()
        .or_else(|| stored["automountServiceAccountToken"].as_bool())
        .unwrap_or(true);
    if !automount {
        return Ok(());
    }
    let mounted_already = |container: &Value| {
        container["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| m["mountPath"] == MOUNT_PATH)
    };
    let volume = format!("kube-api-access-{}", crate::meta::random_suffix());
    let mut any = false;
    for list in ["initContainers", "containers"] {
        for container in pod["spec"][list].as_array_mut().into_iter().flatten() {
            if mounted_already(container) {
                continue;
            }
            let mount = json!({"name": volume, "readOnly": true, "mountPath": MOUNT_PATH});
            match container["volumeMounts"].as_array_mut() {
                Some(mounts) => mounts.push(mount),
                None => container["volumeMounts"] = json!([mount]),
            }
            any = true;
        }
    }
    if any {
        let projected = json!({
            "name": volume,
            "projected": {
                "defaultMode": 420,
                "sources": [
                    {"serviceAccountToken": {"expirationSeconds": TOKEN_SECONDS, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
                ]
            }
        });
        match pod["spec"]["volumes"].as_array_mut() {
            Some(volumes) => volumes.push(projected),
            None => pod["spec"]["volumes"] = json!([projected]),
        }
    }
    Ok(())
}
