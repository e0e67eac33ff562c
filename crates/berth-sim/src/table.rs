//! `Table` responses for `kubectl get`: built-in columns for the common types, a CRD's
//! `additionalPrinterColumns`, and the default `Name`/`Created At` otherwise.

use jiff::Timestamp;
use jsonpath_rust::JsonPath;
use serde_json::{Value, json};

use crate::resources::{PrinterColumn, ResourceType};

fn column(
    name: &str,
    type_: &str,
    format: &str,
    description: &str,
    priority: i64,
) -> PrinterColumn {
    PrinterColumn {
        name: name.to_owned(),
        type_: type_.to_owned(),
        format: format.to_owned(),
        description: description.to_owned(),
        priority,
        json_path: None,
    }
}

/// How long ago, the way kubectl's Age column says it (`5s`, `3m20s`, `4h`, `2d`).
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".to_owned();
    }
    let seconds = seconds.max(0);
    let minutes = seconds / 60;
    let hours = minutes / 60;
    if seconds < 120 {
        format!("{seconds}s")
    } else if minutes < 10 {
        match seconds % 60 {
            0 => format!("{minutes}m"),
            s => format!("{minutes}m{s}s"),
        }
    } else if minutes < 180 {
        format!("{minutes}m")
    } else if hours < 8 {
        match minutes % 60 {
            0 => format!("{hours}h"),
            m => format!("{hours}h{m}m"),
        }
    } else if hours < 48 {
        format!("{hours}h")
    } else if hours < 24 * 8 {
        match hours % 24 {
            0 => format!("{}d", hours / 24),
            h => format!("{}d{h}h", hours / 24),
        }
    } else if hours < 24 * 365 * 2 {
        format!("{}d", hours / 24)
    } else if hours < 24 * 365 * 8 {
        match (hours / 24) % 365 {
            0 => format!("{}y", hours / 24 / 365),
            days => format!("{}y{days}d", hours / 24 / 365),
        }
    } else {
        format!("{}y", hours / 24 / 365)
    }
}

fn age(object: &Value, now: Timestamp) -> String {
    object["metadata"]["creationTimestamp"]
        .as_str()
        .and_then(|t| t.parse::<Timestamp>().ok())
        .map(|t| human_duration(now.duration_since(t).as_secs()))
        .unwrap_or_else(|| "<unknown>".to_owned())
}

fn age_column() -> PrinterColumn {
    column(
        "Age",
        "string",
        "",
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
        0,
    )
}

fn count(value: &Value) -> usize {
    value
        .as_object()
        .map(|m| m.len())
        .or_else(|| value.as_array().map(Vec::len))
        .unwrap_or(0)
}

fn columns(rt: &ResourceType) -> Vec<PrinterColumn> {
    let name = column(
        "Name",
        "string",
        "name",
        "Name must be unique within a namespace.",
        0,
    );
    if !rt.printer_columns.is_empty() {
        let mut all = vec![name];
        all.extend(rt.printer_columns.iter().cloned());
        return all;
    }
    match (rt.group.as_str(), rt.resource.as_str()) {
        ("", "pods") => vec![
            name,
            column(
                "Ready",
                "string",
                "",
                "The aggregate readiness state of this pod for accepting traffic.",
                0,
            ),
            column(
                "Status",
                "string",
                "",
                "The aggregate status of the containers in this pod.",
                0,
            ),
            column(
                "Restarts",
                "string",
                "",
                "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
                0,
            ),
            column(
                "Age",
                "string",
                "",
                "CreationTimestamp is a timestamp representing the server time when this object was created.",
                0,
            ),
            column(
                "IP",
                "string",
                "",
                "IP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated.",
                1,
            ),
            column(
                "Node",
                "string",
                "",
                "NodeName is a request to schedule this pod onto a specific node.",
                1,
            ),
            column(
                "Nominated Node",
                "string",
                "",
                "nominatedNodeName is set when this pod preempts other pods on the node.",
                1,
            ),
            column(
                "Readiness Gates",
                "string",
                "",
                "If specified, all readiness gates will be evaluated for pod readiness.",
                1,
            ),
        ],
        ("", "nodes") => vec![
            name,
            column("Status", "string", "", "The status of the node", 0),
            column("Roles", "string", "", "The roles of the node", 0),
            column(
                "Age",
                "string",
                "",
                "CreationTimestamp is a timestamp representing the server time when this object was created.",
                0,
            ),
            column(
                "Version",
                "string",
                "",
                "Kubelet Version reported by the node.",
                0,
            ),
            column(
                "Internal-IP",
                "string",
                "",
                "List of addresses reachable to the node.",
                1,
            ),
        ],
        ("apps", "deployments") => vec![
            name,
            column(
                "Ready",
                "string",
                "",
                "Number of the pod with ready state",
                0,
            ),
            column(
                "Up-to-date",
                "string",
                "",
                "Total number of non-terminated pods targeted by this deployment that have the desired template spec.",
                0,
            ),
            column(
                "Available",
                "string",
                "",
                "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment.",
                0,
            ),
            age_column(),
        ],
        ("", "componentstatuses") => vec![
            name,
            column(
                "Status",
                "string",
                "",
                "Status of the component conditions",
                0,
            ),
            column(
                "Message",
                "string",
                "",
                "Message of the component conditions",
                0,
            ),
            column(
                "Error",
                "string",
                "",
                "Error of the component conditions",
                0,
            ),
        ],
        ("apiregistration.k8s.io", "apiservices") => vec![
            name,
            column(
                "Service",
                "string",
                "",
                "The reference to the service that hosts this API endpoint.",
                0,
            ),
            column(
                "Available",
                "string",
                "",
                "Whether this service is available.",
                0,
            ),
            age_column(),
        ],
        ("certificates.k8s.io", "certificatesigningrequests") => vec![
            name,
            age_column(),
            column(
                "SignerName",
                "string",
                "",
                "signerName indicates the requested signer, and is a qualified name.",
                0,
            ),
            column("Requestor", "string", "", "Name of requestor", 0),
            column(
                "RequestedDuration",
                "string",
                "",
                "expirationSeconds is the requested duration of validity of the issued certificate.",
                0,
            ),
            column(
                "Condition",
                "string",
                "",
                "Condition indicates if the certificate has been approved or denied",
                0,
            ),
        ],
        ("batch", "jobs") => vec![
            name,
            column("Status", "string", "", "Status of the job.", 0),
            column(
                "Completions",
                "string",
                "",
                "The desired number of successfully finished pods the job should be run with.",
                0,
            ),
            column(
                "Duration",
                "string",
                "",
                "Time required to complete the job.",
                0,
            ),
            age_column(),
            column(
                "Containers",
                "string",
                "",
                "Names of each container in the template.",
                1,
            ),
            column(
                "Images",
                "string",
                "",
                "Images referenced by each container in the template.",
                1,
            ),
            column(
                "Selector",
                "string",
                "",
                "Selector that selects the pods of this job.",
                1,
            ),
        ],
        ("batch", "cronjobs") => vec![
            name,
            column(
                "Schedule",
                "string",
                "",
                "The schedule in Cron format, see https://en.wikipedia.org/wiki/Cron.",
                0,
            ),
            column(
                "Timezone",
                "string",
                "",
                "The time zone name for the given schedule, see https://en.wikipedia.org/wiki/List_of_tz_database_time_zones. If not specified, this will default to the time zone of the kube-controller-manager process. The set of valid time zone names and the time zone offset is loaded from the system-wide time zone database by the API server during CronJob validation and the controller manager during execution. If no system-wide time zone database can be found a bundled version of the database is used instead. If the time zone name becomes invalid during the lifetime of a CronJob or due to a change in host configuration, the controller will stop creating new new Jobs and will create a system event with the reason UnknownTimeZone. More information can be found in https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/#time-zones",
                0,
            ),
            column(
                "Suspend",
                "boolean",
                "",
                "This flag tells the controller to suspend subsequent executions, it does not apply to already started executions.  Defaults to false.",
                0,
            ),
            column(
                "Active",
                "integer",
                "",
                "A list of pointers to currently running jobs.",
                0,
            ),
            column(
                "Last Schedule",
                "string",
                "",
                "Information when was the last time the job was successfully scheduled.",
                0,
            ),
            age_column(),
            column(
                "Containers",
                "string",
                "",
                "Names of each container in the template.",
                1,
            ),
            column(
                "Images",
                "string",
                "",
                "Images referenced by each container in the template.",
                1,
            ),
            column(
                "Selector",
                "string",
                "",
                "Selector that selects the pods of this job.",
                1,
            ),
        ],
        ("apps", "replicasets") => vec![
            name,
            column("Desired", "integer", "", "Number of desired pods.", 0),
            column("Current", "integer", "", "Number of actual replicas.", 0),
            column(
                "Ready",
                "integer",
                "",
                "The number of pods targeted by this ReplicaSet with a Ready Condition.",
                0,
            ),
            age_column(),
        ],
        ("", "configmaps") => vec![
            name,
            column(
                "Data",
                "string",
                "",
                "Data contains the configuration data.",
                0,
            ),
            age_column(),
        ],
        ("", "secrets") => vec![
            name,
            column("Type", "string", "", "The type of secret", 0),
            column("Data", "string", "", "Data contains the secret data.", 0),
            age_column(),
        ],
        ("coordination.k8s.io", "leases") => vec![
            name,
            column(
                "Holder",
                "string",
                "",
                "holderIdentity contains the identity of the holder of a current lease. If Coordinated Leader Election is used, the holder identity must be equal to the elected LeaseCandidate.metadata.name field.",
                0,
            ),
            age_column(),
        ],
        ("", "persistentvolumeclaims") => vec![
            name,
            column(
                "Status",
                "string",
                "",
                "phase represents the current phase of PersistentVolumeClaim.",
                0,
            ),
            column(
                "Volume",
                "string",
                "",
                "volumeName is the binding reference to the PersistentVolume backing this claim.",
                0,
            ),
            column(
                "Capacity",
                "string",
                "",
                "capacity represents the actual resources of the underlying volume.",
                0,
            ),
            column(
                "Access Modes",
                "string",
                "",
                "accessModes contains the actual access modes the volume backing the PVC has. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#access-modes-1",
                0,
            ),
            column("StorageClass", "string", "", "StorageClass of the pvc", 0),
            column(
                "VolumeAttributesClass",
                "string",
                "",
                "VolumeAttributesClass of the pvc",
                0,
            ),
            age_column(),
            column(
                "VolumeMode",
                "string",
                "",
                "volumeMode defines what type of volume is required by the claim.",
                1,
            ),
        ],
        ("policy", "poddisruptionbudgets") => vec![
            name,
            column(
                "Min Available",
                "string",
                "",
                "The minimum number of pods that must be available.",
                0,
            ),
            column(
                "Max Unavailable",
                "string",
                "",
                "The maximum number of pods that may be unavailable.",
                0,
            ),
            column(
                "Allowed Disruptions",
                "integer",
                "",
                "Calculated number of pods that may be disrupted at this time.",
                0,
            ),
            age_column(),
        ],
        ("rbac.authorization.k8s.io", "rolebindings") => vec![
            name,
            column(
                "Role",
                "string",
                "",
                "RoleRef can reference a Role in the current namespace or a ClusterRole in the global namespace. If the RoleRef cannot be resolved, the Authorizer must return an error.",
                0,
            ),
            age_column(),
            column("Users", "string", "", "Users in the roleBinding", 1),
            column("Groups", "string", "", "Groups in the roleBinding", 1),
            column(
                "ServiceAccounts",
                "string",
                "",
                "ServiceAccounts in the roleBinding",
                1,
            ),
        ],
        ("", "serviceaccounts") => vec![
            name,
            column(
                "Secrets",
                "string",
                "",
                "Secrets is a list of the secrets in the same namespace that pods running using this ServiceAccount are allowed to use.",
                0,
            ),
            age_column(),
        ],
        ("", "endpoints") => vec![
            name,
            column(
                "Endpoints",
                "string",
                "",
                "Endpoints is the list of endpoints of the service.",
                0,
            ),
            age_column(),
        ],
        ("discovery.k8s.io", "endpointslices") => vec![
            name,
            column(
                "AddressType",
                "string",
                "",
                "addressType specifies the type of address carried by this EndpointSlice.",
                0,
            ),
            column(
                "Ports",
                "string",
                "",
                "ports specifies the list of network ports exposed by each endpoint in this slice.",
                0,
            ),
            column(
                "Endpoints",
                "string",
                "",
                "endpoints is a list of unique endpoints in this slice.",
                0,
            ),
            age_column(),
        ],
        // A custom resource without printer columns: what the real server shows for one.
        _ if rt.is_custom => vec![
            name,
            column(
                "Age",
                "date",
                "",
                "CreationTimestamp is a timestamp representing the server time when this object was created.",
                0,
            ),
        ],
        ("", "namespaces") => vec![
            name,
            column("Status", "string", "", "The status of the namespace", 0),
            column(
                "Age",
                "string",
                "",
                "CreationTimestamp is a timestamp representing the server time when this object was created.",
                0,
            ),
        ],
        ("", "services") => vec![
            name,
            column("Type", "string", "", "The type of the service.", 0),
            column(
                "Cluster-IP",
                "string",
                "",
                "The cluster IP of the service.",
                0,
            ),
            column(
                "External-IP",
                "string",
                "",
                "The external IP of the service.",
                0,
            ),
            column("Port(s)", "string", "", "The ports of the service.", 0),
            column(
                "Age",
                "string",
                "",
                "CreationTimestamp is a timestamp representing the server time when this object was created.",
                0,
            ),
            column(
                "Selector",
                "string",
                "",
                "Route service traffic to pods with label keys and values matching this selector.",
                1,
            ),
        ],
        ("", "events") => vec![
            column(
                "Last Seen",
                "string",
                "",
                "Time when this event was last observed.",
                0,
            ),
            column(
                "Type",
                "string",
                "",
                "Type of this event (Normal, Warning).",
                0,
            ),
            column(
                "Reason",
                "string",
                "",
                "Short, machine understandable string that gives the reason for the transition into the object's current status.",
                0,
            ),
            column(
                "Object",
                "string",
                "",
                "The object that this event is about.",
                0,
            ),
            column(
                "Message",
                "string",
                "",
                "A human-readable description of the status of this operation.",
                0,
            ),
        ],
        _ => vec![
            name,
            column(
                "Created At",
                "date",
                "",
                "CreationTimestamp is a timestamp representing the server time when this object was created.",
                0,
            ),
        ],
    }
}

/// A claim's row: its phase, volume, capacity, access modes (as kubectl abbreviates them),
/// class, attributes class, age and (wide) volume mode.
/// A claim's row as 1.33's printer writes it: capacity and access modes once it names its
/// volume, `Terminating` while deleted, the modes in a fixed order without repeats.
fn claim_cells(claim: &Value, now: Timestamp) -> Vec<Value> {
    let text = |value: &Value| value.as_str().unwrap_or_default().to_owned();
    let has_volume = !text(&claim["spec"]["volumeName"]).is_empty();
    let present: Vec<&str> = claim["status"]["accessModes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let modes: Vec<&str> = [
        ("ReadWriteOnce", "RWO"),
        ("ReadOnlyMany", "ROX"),
        ("ReadWriteMany", "RWX"),
        ("ReadWriteOncePod", "RWOP"),
    ]
    .iter()
    .filter(|(mode, _)| present.contains(mode))
    .map(|(_, short)| *short)
    .collect();
    let phase = if claim["metadata"]["deletionTimestamp"].is_string() {
        "Terminating".to_owned()
    } else {
        text(&claim["status"]["phase"])
    };
    let class = claim["spec"]["storageClassName"]
        .as_str()
        .or_else(|| {
            claim["metadata"]["annotations"]["volume.beta.kubernetes.io/storage-class"].as_str()
        })
        .unwrap_or_default();
    vec![
        json!(phase),
        json!(text(&claim["spec"]["volumeName"])),
        json!(match has_volume {
            true => text(&claim["status"]["capacity"]["storage"]),
            false => String::new(),
        }),
        json!(match has_volume {
            true => modes.join(","),
            false => String::new(),
        }),
        json!(class),
        json!(match claim["spec"]["volumeAttributesClassName"].as_str() {
            Some(class) => class.to_owned(),
            None => "<unset>".to_owned(),
        }),
        json!(age(claim, now)),
        json!(claim["spec"]["volumeMode"].as_str().unwrap_or("<unset>")),
    ]
}

fn pod_cells(pod: &Value, now: Timestamp) -> Vec<Value> {
    let statuses = pod["status"]["containerStatuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let total = pod["spec"]["containers"].as_array().map_or(0, Vec::len);
    let ready = statuses.iter().filter(|s| s["ready"] == true).count();
    let restarts: i64 = statuses
        .iter()
        .chain(
            pod["status"]["initContainerStatuses"]
                .as_array()
                .into_iter()
                .flatten(),
        )
        .filter_map(|s| s["restartCount"].as_i64())
        .sum();
    let mut status = pod["status"]["reason"]
        .as_str()
        .or_else(|| pod["status"]["phase"].as_str())
        .unwrap_or("Pending")
        .to_owned();
    if let Some(reason) = init_status(pod) {
        status = reason;
    } else {
        for s in &statuses {
            if let Some(reason) = s["state"]["waiting"]["reason"].as_str() {
                status = reason.to_owned();
            } else if let Some(reason) = s["state"]["terminated"]["reason"].as_str() {
                status = reason.to_owned();
            }
        }
    }
    if pod["metadata"]["deletionTimestamp"].is_string() {
        status = "Terminating".to_owned();
    }
    let none = || json!("<none>");
    vec![
        json!(format!("{ready}/{total}")),
        json!(status),
        json!(restarts.to_string()),
        json!(age(pod, now)),
        pod["status"]["podIP"]
            .as_str()
            .map(|s| json!(s))
            .unwrap_or_else(none),
        pod["spec"]["nodeName"]
            .as_str()
            .map(|s| json!(s))
            .unwrap_or_else(none),
        none(),
        none(),
    ]
}

fn node_cells(node: &Value, now: Timestamp) -> Vec<Value> {
    let ready = node["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .map(|c| match c["status"].as_str() {
            Some("True") => "Ready",
            Some("False") => "NotReady",
            _ => "Unknown",
        })
        .unwrap_or("Unknown");
    let mut status = ready.to_owned();
    if node["spec"]["unschedulable"] == true {
        status.push_str(",SchedulingDisabled");
    }
    let roles: Vec<String> = node["metadata"]["labels"]
        .as_object()
        .map(|l| {
            l.keys()
                .filter_map(|k| {
                    k.strip_prefix("node-role.kubernetes.io/")
                        .map(str::to_owned)
                })
                .collect()
        })
        .unwrap_or_default();
    let internal_ip = node["status"]["addresses"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["type"] == "InternalIP"))
        .and_then(|a| a["address"].as_str())
        .unwrap_or("<none>");
    vec![
        json!(status),
        json!(if roles.is_empty() {
            "<none>".to_owned()
        } else {
            roles.join(",")
        }),
        json!(age(node, now)),
        json!(
            node["status"]["nodeInfo"]["kubeletVersion"]
                .as_str()
                .unwrap_or("")
        ),
        json!(internal_ip),
    ]
}

fn service_cells(service: &Value, now: Timestamp) -> Vec<Value> {
    let ports: Vec<String> = service["spec"]["ports"]
        .as_array()
        .map(|ports| {
            ports
                .iter()
                .map(|p| {
                    // `80:30080/TCP` with a node port, as kubectl's printer shows it.
                    let node_port = p["nodePort"]
                        .as_u64()
                        .map(|n| format!(":{n}"))
                        .unwrap_or_default();
                    format!(
                        "{}{node_port}/{}",
                        p["port"],
                        p["protocol"].as_str().unwrap_or("TCP")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let selector: Vec<String> = service["spec"]["selector"]
        .as_object()
        .map(|s| {
            s.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    vec![
        json!(service["spec"]["type"].as_str().unwrap_or("ClusterIP")),
        json!(service["spec"]["clusterIP"].as_str().unwrap_or("<none>")),
        // An ExternalName service's external address is the name it aliases.
        json!(service["spec"]["externalName"].as_str().unwrap_or("<none>")),
        json!(if ports.is_empty() {
            "<none>".to_owned()
        } else {
            ports.join(",")
        }),
        json!(age(service, now)),
        json!(if selector.is_empty() {
            "<none>".to_owned()
        } else {
            selector.join(",")
        }),
    ]
}

fn event_cells(event: &Value, now: Timestamp) -> Vec<Value> {
    let last = event["lastTimestamp"]
        .as_str()
        .or_else(|| event["eventTime"].as_str())
        .or_else(|| event["metadata"]["creationTimestamp"].as_str())
        .and_then(|t| t.parse::<Timestamp>().ok())
        .map(|t| human_duration(now.duration_since(t).as_secs()))
        .unwrap_or_else(|| "<unknown>".to_owned());
    let object = format!(
        "{}/{}",
        event["involvedObject"]["kind"]
            .as_str()
            .unwrap_or_default()
            .to_lowercase(),
        event["involvedObject"]["name"].as_str().unwrap_or_default()
    );
    vec![
        json!(last),
        json!(event["type"].as_str().unwrap_or_default()),
        json!(event["reason"].as_str().unwrap_or_default()),
        json!(object),
        json!(event["message"].as_str().unwrap_or_default()),
    ]
}

fn custom_cell(object: &Value, col: &PrinterColumn, now: Timestamp) -> Value {
    let Some(path) = &col.json_path else {
        return Value::Null;
    };
    if col.type_ == "date" {
        let path = if path.starts_with('$') {
            path.clone()
        } else {
            format!("${path}")
        };
        let found: Vec<&Value> = object.query(&path).unwrap_or_default();
        return found
            .first()
            .and_then(|v| v.as_str())
            .and_then(|t| t.parse::<Timestamp>().ok())
            .map(|t| json!(human_duration(now.duration_since(t).as_secs())))
            .unwrap_or(Value::Null);
    }
    let path = if path.starts_with('$') {
        path.clone()
    } else {
        format!("${path}")
    };
    let found: Vec<&Value> = object.query(&path).unwrap_or_default();
    match found.as_slice() {
        [] => Value::Null,
        [one] => (*one).clone(),
        many => json!(
            many.iter()
                .map(|v| v
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| v.to_string()))
                .collect::<Vec<_>>()
                .join(",")
        ),
    }
}

fn cells(rt: &ResourceType, object: &Value, cols: &[PrinterColumn], now: Timestamp) -> Vec<Value> {
    let name = json!(object["metadata"]["name"].as_str().unwrap_or_default());
    if !rt.printer_columns.is_empty() {
        let mut row = vec![name];
        row.extend(cols.iter().skip(1).map(|c| custom_cell(object, c, now)));
        return row;
    }
    let mut row = match (rt.group.as_str(), rt.resource.as_str()) {
        ("", "events") => return event_cells(object, now),
        ("", "pods") => pod_cells(object, now),
        ("", "nodes") => node_cells(object, now),
        ("", "namespaces") => vec![
            json!(object["status"]["phase"].as_str().unwrap_or("Active")),
            json!(age(object, now)),
        ],
        ("", "services") => service_cells(object, now),
        ("apps", "deployments") => {
            let status = |key: &str| object["status"][key].as_i64().unwrap_or(0);
            vec![
                json!(format!(
                    "{}/{}",
                    status("readyReplicas"),
                    object["spec"]["replicas"].as_i64().unwrap_or(0)
                )),
                json!(status("updatedReplicas")),
                json!(status("availableReplicas")),
                json!(age(object, now)),
            ]
        }
        ("", "componentstatuses") => {
            let healthy = object["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "Healthy");
            let status = match healthy.map(|c| c["status"] == "True") {
                Some(true) => "Healthy",
                Some(false) => "Unhealthy",
                None => "Unknown",
            };
            let said = |key: &str| json!(healthy.and_then(|c| c[key].as_str()).unwrap_or_default());
            vec![json!(status), said("message"), said("error")]
        }
        ("apiregistration.k8s.io", "apiservices") => {
            let service = &object["spec"]["service"];
            let service = if service.is_object() {
                format!(
                    "{}/{}",
                    service["namespace"].as_str().unwrap_or_default(),
                    service["name"].as_str().unwrap_or_default()
                )
            } else {
                "Local".to_owned()
            };
            let available = object["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "Available");
            let available = match available {
                Some(c) if c["status"] == "True" => "True".to_owned(),
                Some(c) => format!(
                    "{} ({})",
                    c["status"].as_str().unwrap_or_default(),
                    c["reason"].as_str().unwrap_or_default()
                ),
                None => "Unknown".to_owned(),
            };
            vec![json!(service), json!(available), json!(age(object, now))]
        }
        ("certificates.k8s.io", "certificatesigningrequests") => vec![
            json!(age(object, now)),
            json!(object["spec"]["signerName"].as_str().unwrap_or_default()),
            json!(object["spec"]["username"].as_str().unwrap_or_default()),
            json!(
                object["spec"]["expirationSeconds"]
                    .as_i64()
                    .map(human_duration)
                    .unwrap_or_else(|| "<none>".to_owned())
            ),
            json!(crate::certificates::condition_cell(object)),
        ],
        ("batch", "jobs") => job_cells(object, now),
        ("batch", "cronjobs") => cron_job_cells(object, now),
        ("apps", "replicasets") => vec![
            json!(object["spec"]["replicas"].as_i64().unwrap_or(0)),
            json!(object["status"]["replicas"].as_i64().unwrap_or(0)),
            json!(object["status"]["readyReplicas"].as_i64().unwrap_or(0)),
            json!(age(object, now)),
        ],
        ("", "configmaps") => vec![
            json!(count(&object["data"]) + count(&object["binaryData"])),
            json!(age(object, now)),
        ],
        ("", "secrets") => vec![
            json!(object["type"].as_str().unwrap_or("Opaque")),
            json!(count(&object["data"])),
            json!(age(object, now)),
        ],
        ("", "serviceaccounts") => vec![json!(count(&object["secrets"])), json!(age(object, now))],
        ("coordination.k8s.io", "leases") => vec![
            json!(
                object["spec"]["holderIdentity"]
                    .as_str()
                    .unwrap_or_default()
            ),
            json!(age(object, now)),
        ],
        ("", "persistentvolumeclaims") => claim_cells(object, now),
        ("policy", "poddisruptionbudgets") => {
            let either = |key: &str| match &object["spec"][key] {
                Value::Null => "N/A".to_owned(),
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            vec![
                json!(either("minAvailable")),
                json!(either("maxUnavailable")),
                json!(object["status"]["disruptionsAllowed"].as_i64().unwrap_or(0)),
                json!(age(object, now)),
            ]
        }
        ("rbac.authorization.k8s.io", "rolebindings") => {
            let subjects = |kind: &str| {
                object["subjects"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|s| s["kind"] == kind)
                    // `SubjectsStrings`: a service account as `namespace/name`, even with
                    // no namespace.
                    .map(|s| match kind {
                        "ServiceAccount" => format!(
                            "{}/{}",
                            s["namespace"].as_str().unwrap_or_default(),
                            s["name"].as_str().unwrap_or_default()
                        ),
                        _ => s["name"].as_str().unwrap_or_default().to_owned(),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            vec![
                json!(format!(
                    "{}/{}",
                    object["roleRef"]["kind"].as_str().unwrap_or_default(),
                    object["roleRef"]["name"].as_str().unwrap_or_default()
                )),
                json!(age(object, now)),
                json!(subjects("User")),
                json!(subjects("Group")),
                json!(subjects("ServiceAccount")),
            ]
        }
        ("", "endpoints") => {
            let mut listed = vec![];
            for subset in object["subsets"].as_array().into_iter().flatten() {
                for address in subset["addresses"].as_array().into_iter().flatten() {
                    for port in subset["ports"].as_array().into_iter().flatten() {
                        listed.push(format!(
                            "{}:{}",
                            address["ip"].as_str().unwrap_or_default(),
                            port["port"]
                        ));
                    }
                    if subset["ports"].as_array().is_none_or(Vec::is_empty) {
                        listed.push(address["ip"].as_str().unwrap_or_default().to_owned());
                    }
                }
            }
            vec![json!(first_three(listed)), json!(age(object, now))]
        }
        ("discovery.k8s.io", "endpointslices") => {
            let ports: Vec<String> = object["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| p["port"].to_string())
                .collect();
            let addresses: Vec<String> = object["endpoints"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|e| e["addresses"].as_array().cloned().unwrap_or_default())
                .filter_map(|a| a.as_str().map(str::to_owned))
                .collect();
            vec![
                json!(object["addressType"].as_str().unwrap_or_default()),
                json!(if ports.is_empty() {
                    "<unset>".to_owned()
                } else {
                    ports.join(",")
                }),
                json!(first_three(addresses)),
                json!(age(object, now)),
            ]
        }
        _ => vec![object["metadata"]["creationTimestamp"].clone()],
    };
    row.insert(0, name);
    row
}

/// What a Table row carries besides its cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

fn row(
    rt: &ResourceType,
    object: &Value,
    cols: &[PrinterColumn],
    include: IncludeObject,
    now: Timestamp,
) -> Value {
    let carried = match include {
        IncludeObject::None => Value::Null,
        IncludeObject::Metadata => json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": object["metadata"],
        }),
        IncludeObject::Object => object.clone(),
    };
    json!({"cells": cells(rt, object, cols, now), "object": carried})
}

/// A Table of `objects`.
pub fn table(
    rt: &ResourceType,
    objects: &[Value],
    metadata: Value,
    include: IncludeObject,
) -> Value {
    let cols = columns(rt);
    let now = Timestamp::now();
    let definitions: Vec<Value> = cols
        .iter()
        .map(|c| json!({"name": c.name, "type": c.type_, "format": c.format, "description": c.description, "priority": c.priority}))
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": definitions,
        "rows": objects.iter().map(|o| row(rt, o, &cols, include, now)).collect::<Vec<_>>(),
    })
}

/// A pod template's containers and images, comma-separated, as the wide columns show them.
fn template_cells(template: &Value) -> (String, String) {
    let containers = template["spec"]["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let names: Vec<&str> = containers
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    let images: Vec<&str> = containers
        .iter()
        .filter_map(|c| c["image"].as_str())
        .collect();
    (names.join(","), images.join(","))
}

/// A label selector as kubectl writes it (`a=b,c in (d)`), `<none>` when empty.
fn selector_text(selector: &Value) -> String {
    match crate::apps::selector_string(selector) {
        text if text.is_empty() => "<none>".to_owned(),
        text => text,
    }
}

/// A Job's row: its state, `succeeded/completions`, how long it ran (or runs), its age.
fn job_cells(job: &Value, now: Timestamp) -> Vec<Value> {
    let succeeded = job["status"]["succeeded"].as_i64().unwrap_or(0);
    let completions = match (
        job["spec"]["completions"].as_i64(),
        job["spec"]["parallelism"].as_i64(),
    ) {
        (Some(completions), _) => format!("{succeeded}/{completions}"),
        (None, Some(parallelism)) if parallelism > 1 => format!("{succeeded}/1 of {parallelism}"),
        _ => format!("{succeeded}/1"),
    };
    let at = |field: &str| {
        job["status"][field]
            .as_str()
            .and_then(|t| t.parse::<Timestamp>().ok())
    };
    let duration = match (at("startTime"), at("completionTime")) {
        (Some(start), Some(end)) => human_duration(end.duration_since(start).as_secs()),
        (Some(start), None) => human_duration(now.duration_since(start).as_secs()),
        _ => String::new(),
    };
    let (containers, images) = template_cells(&job["spec"]["template"]);
    vec![
        json!(crate::batch::job_status(job)),
        json!(completions),
        json!(duration),
        json!(age(job, now)),
        json!(containers),
        json!(images),
        json!(selector_text(&job["spec"]["selector"])),
    ]
}

/// A CronJob's row: its schedule and time zone, whether suspended, how many Jobs run, when it
/// last ran, its age.
fn cron_job_cells(cron_job: &Value, now: Timestamp) -> Vec<Value> {
    let last = cron_job["status"]["lastScheduleTime"]
        .as_str()
        .and_then(|t| t.parse::<Timestamp>().ok())
        .map(|t| human_duration(now.duration_since(t).as_secs()))
        .unwrap_or_else(|| "<none>".to_owned());
    let (containers, images) = template_cells(&cron_job["spec"]["jobTemplate"]["spec"]["template"]);
    vec![
        json!(cron_job["spec"]["schedule"].as_str().unwrap_or_default()),
        json!(cron_job["spec"]["timeZone"].as_str().unwrap_or("<none>")),
        // `printBoolPtr`: a string, as kubectl prints it.
        json!(match cron_job["spec"]["suspend"].as_bool() {
            Some(true) => "True",
            Some(false) => "False",
            None => "<unset>",
        }),
        json!(count(&cron_job["status"]["active"])),
        json!(last),
        json!(age(cron_job, now)),
        json!(containers),
        json!(images),
        json!(selector_text(
            &cron_job["spec"]["jobTemplate"]["spec"]["selector"]
        )),
    ]
}

/// At most three entries, then how many more, as kubectl's printer lists endpoints.
fn first_three(entries: Vec<String>) -> String {
    match entries.len() {
        0 => "<none>".to_owned(),
        n if n > 3 => format!("{} + {} more...", entries[..3].join(","), n - 3),
        _ => entries.join(","),
    }
}

/// The STATUS of a pod still initializing, as kubectl's printer words it: the first init
/// container not done says `Init:<reason>` (terminated or waiting), or `Init:N/M` while it runs.
fn init_status(pod: &Value) -> Option<String> {
    let statuses = pod["status"]["initContainerStatuses"].as_array()?;
    let total = pod["spec"]["initContainers"].as_array().map_or(0, Vec::len);
    for (i, container) in statuses.iter().enumerate() {
        let terminated = &container["state"]["terminated"];
        let waiting = container["state"]["waiting"]["reason"]
            .as_str()
            .filter(|r| !r.is_empty() && *r != "PodInitializing");
        return Some(match terminated["exitCode"].as_i64() {
            Some(0) => continue,
            Some(code) => match terminated["reason"].as_str().filter(|r| !r.is_empty()) {
                Some(reason) => format!("Init:{reason}"),
                None => format!("Init:ExitCode:{code}"),
            },
            None => match waiting {
                Some(reason) => format!("Init:{reason}"),
                None => format!("Init:{i}/{total}"),
            },
        });
    }
    None
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_pod_initializing_says_so_as_kubectls_printer_does() {
        let pod = |statuses: Value| {
            json!({"spec": {"initContainers": [{"name": "a"}, {"name": "b"}]},
                   "status": {"initContainerStatuses": statuses}})
        };
        let done = json!({"state": {"terminated": {"exitCode": 0, "reason": "Completed"}}});
        let rows = [
            (json!([done, {"state": {"running": {}}}]), Some("Init:1/2")),
            (
                json!([{"state": {"terminated": {"exitCode": 3, "reason": "Error"}}}]),
                Some("Init:Error"),
            ),
            (
                json!([{"state": {"terminated": {"exitCode": 3}}}]),
                Some("Init:ExitCode:3"),
            ),
            (
                json!([{"state": {"waiting": {"reason": "CrashLoopBackOff"}}}]),
                Some("Init:CrashLoopBackOff"),
            ),
            (
                json!([{"state": {"waiting": {"reason": "PodInitializing"}}}]),
                Some("Init:0/2"),
            ),
            (json!([done, done]), None),
        ];
        for (statuses, expected) in rows {
            assert_eq!(
                init_status(&pod(statuses.clone())).as_deref(),
                expected,
                "{statuses}"
            );
        }
    }

    use super::*;

    #[test]
    fn a_claims_row_reads_as_the_printer_writes_it() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let claim = json!({"metadata": {"creationTimestamp": "2026-01-01T00:00:00Z",
                "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"volumeName": "pv-1"},
            "status": {"phase": "Bound", "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteMany", "ReadWriteOnce", "ReadWriteOnce"]}});
        let cells = claim_cells(&claim, now);
        assert_eq!(cells[0], "Terminating");
        assert_eq!(cells[2], "1Gi");
        assert_eq!(cells[3], "RWO,RWX", "in the printer's order, once each");
        assert_eq!(cells[7], "<unset>", "no volume mode said");
        let unbound = json!({"metadata": {}, "spec": {}, "status": {}});
        let cells = claim_cells(&unbound, now);
        assert_eq!(cells[0], "", "no phase yet");
        assert_eq!(cells[2], "");
        assert_eq!(human_duration(2 * 365 * 24 * 3600), "2y");
    }

    #[test]
    fn ages_read_like_kubectl() {
        let rows = [
            (5, "5s"),
            (119, "119s"),
            (200, "3m20s"),
            (600, "10m"),
            (3 * 3600 + 120, "3h2m"),
            (20 * 3600, "20h"),
            (3 * 86400, "3d"),
            (400 * 86400, "400d"),
        ];
        for (seconds, text) in rows {
            assert_eq!(human_duration(seconds), text, "{seconds}");
        }
    }
}
