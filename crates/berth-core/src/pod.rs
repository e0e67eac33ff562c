//! What a workspace needs, built as a deterministic function of its spec (rule C4): the pod,
//! the home claim and the service, with Berth's labels and a controller ownerReference. The
//! pod carries a hash of the pod-affecting spec so a change can be noticed (rule C5).

use std::collections::BTreeMap;

use berth_api::{
    KindResolution, Workspace, WorkspaceSpec,
    labels::{self, bounded},
};
use k8s_openapi::{
    api::core::v1::{
        Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, GRPCAction,
        ObjectFieldSelector, PersistentVolumeClaim, PersistentVolumeClaimSpec,
        PersistentVolumeClaimVolumeSource, Pod, PodSpec, Probe, ResourceRequirements,
        SeccompProfile, SecretVolumeSource, SecurityContext, Service, ServicePort, ServiceSpec,
        TCPSocketAction, Volume, VolumeMount, VolumeResourceRequirements,
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{ObjectMeta, OwnerReference},
        util::intstr::IntOrString,
    },
};

use crate::cached_pod::CachedPod;
use crate::config::AgentConfig;
use kube::{Resource, ResourceExt};
use sha2::{Digest, Sha256};

/// The name of the workspace container.
pub const CONTAINER: &str = "workspace";
/// The agent's own container, when the workspace has no command to wrap.
pub const AGENT_CONTAINER: &str = "berth-agent";
/// The init container that copies `berth` into the pod.
pub const INSTALL_CONTAINER: &str = "berth-install";
/// The init container of a workspace with content that runs its image's entrypoint: the
/// agent, until the content is in place.
pub const CONTENT_CONTAINER: &str = "berth-content";
/// The `emptyDir` the agent binary is copied into, and where it is mounted.
pub const AGENT_VOLUME: &str = "berth-agent";
pub const AGENT_DIR: &str = "/opt/berth";
/// The agent's TLS secret volume, and where it is mounted.
pub const AGENT_TLS_VOLUME: &str = "berth-agent-tls";
pub const AGENT_TLS_DIR: &str = "/etc/berth/agent-tls";
/// The volume of the content's credentials secret (`spec.content.git.auth`), mounted at
/// `berth_api::agent::CREDENTIALS_DIR` in the agent's container only.
pub const CONTENT_AUTH_VOLUME: &str = "berth-content-auth";

/// Whether the pod's agent serves TLS (the pod was built with the TLS secret; pods made before
/// TLS was turned on keep plaintext until they are replaced).
pub fn serves_agent_tls(pod: &CachedPod) -> bool {
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    mounts_agent_tls(volumes.into_iter().flatten().map(|v| v.name.as_str()))
}

/// Whether a pod with these volumes (by name) was built with the agent's TLS secret.
pub fn mounts_agent_tls<'a>(mut volumes: impl Iterator<Item = &'a str>) -> bool {
    volumes.any(|name| name == AGENT_TLS_VOLUME)
}

/// The port the agent of `pod` (as [`build_pod`] made it) serves: the `BERTH_AGENT_PORT`
/// of the container that runs it (the workspace container whose command is the agent wrapping
/// the workspace's, else the agent's own container; of duplicate variables the last, the
/// agent's, wins as with the kubelet).
pub fn agent_port(pod: &Pod) -> Option<u16> {
    let containers = &pod.spec.as_ref()?.containers;
    let wrapper = format!("{AGENT_DIR}/berth");
    let wraps = |c: &&Container| {
        c.name == CONTAINER
            && matches!(c.command.as_deref(), Some([program, agent, dashes, ..])
                if *program == wrapper && agent == "agent" && dashes == "--")
    };
    let container = (containers.iter().find(wraps))
        .or_else(|| containers.iter().find(|c| c.name == AGENT_CONTAINER))?;
    container
        .env
        .iter()
        .flatten()
        .rfind(|e| e.name == "BERTH_AGENT_PORT")?
        .value
        .as_deref()?
        .parse()
        .ok()
}

/// The workspace's pod: `<workspace>-ws`, the same name for every pod it ever has.
pub fn pod_name(workspace: &str) -> String {
    bounded(workspace, "-ws", 253)
}

/// The workspace's home claim: `<workspace>-home`.
pub fn claim_name(workspace: &str) -> String {
    bounded(workspace, "-home", 253)
}

/// The storage a claim requests.
pub fn claim_request(claim: &PersistentVolumeClaim) -> Option<Quantity> {
    claim
        .spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")
        .cloned()
}

/// The storage a claim's volume has.
pub fn claim_capacity(claim: &PersistentVolumeClaim) -> Option<Quantity> {
    claim
        .status
        .as_ref()?
        .capacity
        .as_ref()?
        .get("storage")
        .cloned()
}

/// Bytes of a storage quantity (`10Gi`, `500M`, `1e9`, `1073741824`); `None` when it is not one.
fn storage_bytes(quantity: &Quantity) -> Option<f64> {
    let text = quantity.0.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "m" => 1e-3,
        s if s.starts_with(['e', 'E']) => 10f64.powi(s[1..].parse().ok()?),
        _ => return None,
    };
    Some(number * factor)
}

/// Whether `have` is less storage than `want` (an unknown amount is never less).
pub fn storage_less(have: Option<&Quantity>, want: Option<&Quantity>) -> bool {
    match (have.and_then(storage_bytes), want.and_then(storage_bytes)) {
        (Some(have), Some(want)) => have < want,
        _ => false,
    }
}

/// The workspace's service: a DNS-1035 label (at most 63 characters, starting with a letter,
/// no dots). A workspace name that is one is used as it is; any other (a leading digit, a
/// dot, 63 characters or more) becomes `ws-<name with dots as dashes>` cut to fit and filled
/// to 63 characters with a hash of the name, so no two workspace names share a service.
pub fn service_name(workspace: &str) -> String {
    let starts_with_letter = workspace.starts_with(|c: char| c.is_ascii_lowercase());
    if starts_with_letter && !workspace.contains('.') && workspace.len() < 63 {
        return workspace.to_owned();
    }
    let readable = if starts_with_letter && !workspace.contains('.') {
        workspace.to_owned()
    } else {
        format!("ws-{}", workspace.replace('.', "-"))
    };
    labels::hashed(&readable, workspace, "", 63)
}

/// The ownerReference that makes the workspace the controller of what Berth creates.
pub fn owner_reference(workspace: &Workspace) -> OwnerReference {
    workspace
        .controller_owner_ref(&())
        .expect("a workspace read from the API has a name and uid")
}

/// Whether `object` is controlled by `workspace` (same UID).
pub fn is_owned_by(meta: &ObjectMeta, workspace: &Workspace) -> bool {
    let uid = workspace.metadata.uid.as_deref();
    meta.owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && Some(r.uid.as_str()) == uid)
}

fn metadata(
    workspace: &Workspace,
    name: String,
    extra_labels: &BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
) -> ObjectMeta {
    let mut all_labels = extra_labels.clone();
    all_labels.extend(labels::owned_labels(&workspace.name_any()));
    // The operator shard that owns the workspace watches its objects by this label.
    if let Some(namespace) = workspace.namespace() {
        all_labels.insert(
            labels::SHARD.to_owned(),
            crate::shard::label_value(&namespace),
        );
    }
    ObjectMeta {
        name: Some(name),
        namespace: workspace.namespace(),
        labels: Some(all_labels),
        annotations: (!annotations.is_empty()).then_some(annotations),
        owner_references: Some(vec![owner_reference(workspace)]),
        ..Default::default()
    }
}

/// The version of the projection [`spec_hash`] hashes. Changing what the projection holds
/// (or how) restarts every workspace on upgrade: do it only on purpose, with a new version.
pub const SPEC_HASH_VERSION: &str = "v1";

/// A stable hash of the fields of the spec that shape the pod (image, command, env,
/// resources, ports, service account, pod template), versioned and canonical: nulls, empty
/// lists and empty maps count as absent and keys are sorted, so a new optional field, or a
/// dependency that serializes an unset field differently, never changes it. When it changes,
/// the pod must be replaced (rule C5).
pub fn spec_hash(spec: &WorkspaceSpec) -> String {
    shape_hash(spec, None)
}

fn to_value<T: serde::Serialize>(field: &T) -> serde_json::Value {
    serde_json::to_value(field).expect("spec fields serialize to JSON: their maps have string keys")
}

/// What a workspace's kind record gives its pod beyond the spec it shapes (`KindResolution::
/// apply`): the pull policy, probes and security context.
fn kind_extras(record: Option<&KindResolution>) -> serde_json::Value {
    record.map_or(serde_json::Value::Null, |r| {
        serde_json::json!({
            "imagePullPolicy": r.image.spec.image_pull_policy,
            "probes": to_value(&r.probes),
            "securityContext": to_value(&r.security_context),
        })
    })
}

/// The hash of the pod a workspace gets: its (shaped) spec's, and what its kind record adds.
/// Without a kind it is the spec's hash, as it always was.
pub fn pod_hash(workspace: &Workspace) -> String {
    let record = workspace
        .status
        .as_ref()
        .and_then(|s| s.resolved.as_deref());
    shape_hash(&workspace.spec, record)
}

fn shape_hash(spec: &WorkspaceSpec, record: Option<&KindResolution>) -> String {
    let projection = serde_json::json!({
        "kindExtras": kind_extras(record),
        "image": spec.image,
        "command": to_value(&spec.command),
        "env": to_value(&spec.env),
        "resources": to_value(&spec.resources),
        // A port's name and number shape the pod; how the gateway serves it does not.
        "ports": spec
            .ports
            .iter()
            .map(|p| serde_json::json!({"name": p.name, "port": p.port}))
            .collect::<Vec<_>>(),
        "serviceAccountName": spec.service_account_name,
        "podTemplate": to_value(&spec.pod_template),
    });
    let mut canonical = SPEC_HASH_VERSION.as_bytes().to_vec();
    write_canonical(&projection, &mut canonical);
    let digest = Sha256::digest(&canonical);
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Whether a value says nothing: null, an empty list or map, or a map of such values.
fn is_empty(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::Null => true,
        serde_json::Value::Array(items) => items.is_empty(),
        serde_json::Value::Object(map) => map.values().all(is_empty),
        _ => false,
    }
}

/// JSON with sorted keys and without empty values, written straight into `out` (a reconcile
/// hashes its workspace's pod shape: no string is built per key or leaf).
fn write_canonical(value: &serde_json::Value, out: &mut Vec<u8>) {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().filter(|(_, v)| !is_empty(v)).collect();
            entries.sort_unstable_by_key(|(key, _)| *key);
            out.push(b'{');
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json(key, out);
                out.push(b':');
                write_canonical(value, out);
            }
            out.push(b'}');
        }
        serde_json::Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        other => write_json(other, out),
    }
}

fn write_json<T: serde::Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) {
    serde_json::to_writer(out, value).expect("a JSON string or scalar serializes");
}

/// The hash pods got before [`SPEC_HASH_VERSION`] (the whole serialized spec but `paused`
/// and `lifecycle`): pods made by an older operator still match, so upgrading restarts none.
fn unversioned_spec_hash(spec: &WorkspaceSpec) -> String {
    let mut shaping = spec.clone();
    shaping.paused = false;
    shaping.lifecycle = None;
    let canonical = serde_json::to_value(&shaping)
        .map(|v| v.to_string())
        .unwrap_or_default();
    let digest = Sha256::digest(canonical.as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Whether `pod` was built from this (shaped) workspace (rule C5): its hash annotation is the
/// workspace's, or the unversioned hash an older operator wrote.
pub fn built_from(pod: &CachedPod, workspace: &Workspace) -> bool {
    pod.spec_hash
        .as_ref()
        .is_some_and(|h| *h == pod_hash(workspace) || *h == unversioned_spec_hash(&workspace.spec))
        && content_current(pod, workspace)
}

/// What the agent is to clone, and where (`spec.content` and the home volume): no secret, only
/// whether one is mounted.
pub fn content_spec(workspace: &Workspace) -> Option<berth_api::agent::ContentSpec> {
    let git = &workspace.spec.content.as_ref()?.git;
    let home = home_volume(workspace)?;
    Some(berth_api::agent::ContentSpec {
        url: git.url.clone(),
        reference: git.reference.clone(),
        path: git.directory(),
        depth: git.depth(),
        home: home.mount_path.as_str().to_owned(),
        auth: git.auth.is_some(),
    })
}

/// Whether `pod` was given the content the spec asks for now: a pod whose agent still has to
/// clone is replaced when the spec's content changes (a wrong ref fixed); once the content is
/// in place, a change restarts nothing (the checkout is never cloned over, and
/// `ContentReady` says so).
fn content_current(pod: &CachedPod, workspace: &Workspace) -> bool {
    let in_place = workspace
        .status
        .as_ref()
        .is_some_and(|s| s.content.is_some());
    in_place || pod.content_hash == content_hash(workspace)
}

/// The hash of [`content_spec`], a pod's [`labels::CONTENT_HASH`].
fn content_hash(workspace: &Workspace) -> Option<String> {
    let content = serde_json::to_string(&content_spec(workspace)?).unwrap_or_default();
    let digest = Sha256::digest(content.as_bytes());
    Some(digest.iter().take(8).map(|b| format!("{b:02x}")).collect())
}

/// What every container running the agent gets: who it serves, and a gRPC readiness probe on
/// its health service.
fn agent_env(workspace: &Workspace, agent: &AgentConfig) -> Vec<EnvVar> {
    let namespace = workspace.namespace().unwrap_or_default();
    let account = workspace
        .spec
        .service_account_name
        .clone()
        .unwrap_or_else(|| "default".to_owned());
    let value = |name: &str, value: String| EnvVar {
        name: name.to_owned(),
        value: Some(value),
        value_from: None,
    };
    vec![
        value("BERTH_WORKSPACE_NAMESPACE", namespace.clone()),
        value("BERTH_WORKSPACE_NAME", workspace.name_any()),
        EnvVar {
            name: "POD_NAME".to_owned(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "metadata.name".to_owned(),
                    api_version: None,
                }),
                ..Default::default()
            }),
        },
        value(
            "BERTH_AGENT_SERVICE_ACCOUNT",
            format!("{namespace}:{account}"),
        ),
        value("BERTH_AGENT_PORT", agent.port.to_string()),
    ]
    .into_iter()
    // Connections to the workspace's own ports are its use (idle culling).
    .chain((!workspace.spec.ports.is_empty()).then(|| {
        let ports: Vec<String> = workspace
            .spec
            .ports
            .iter()
            .map(|p| p.port.to_string())
            .collect();
        value(berth_api::agent::ACTIVITY_PORTS_ENV, ports.join(","))
    }))
    .chain(
        workspace
            .spec
            .pod_template
            .as_ref()
            .and_then(|t| t.volumes.as_ref())
            .and_then(|v| v.home.as_ref())
            .map(|home| {
                value(
                    berth_api::agent::HOME_ENV,
                    home.mount_path.as_str().to_owned(),
                )
            }),
    )
    .chain(content_spec(workspace).map(|content| {
        value(
            berth_api::agent::CONTENT_ENV,
            serde_json::to_string(&content).unwrap_or_default(),
        )
    }))
    .chain(agent.tls.iter().flat_map(|_| {
        [
            value(
                berth_api::agent::TLS_CERT_ENV,
                format!("{AGENT_TLS_DIR}/tls.crt"),
            ),
            value(
                berth_api::agent::TLS_KEY_ENV,
                format!("{AGENT_TLS_DIR}/tls.key"),
            ),
        ]
    }))
    .collect()
}

/// The agent's readiness probe: its gRPC health service, or a TCP connect with TLS (the
/// kubelet's gRPC probes cannot speak TLS).
fn agent_probe(agent: &AgentConfig) -> Probe {
    let port = i32::from(agent.port);
    Probe {
        grpc: agent.tls.is_none().then_some(GRPCAction {
            port,
            service: None,
        }),
        tcp_socket: agent.tls.is_some().then_some(TCPSocketAction {
            port: IntOrString::Int(port),
            host: None,
        }),
        period_seconds: Some(2),
        failure_threshold: Some(3),
        ..Default::default()
    }
}

/// The agent's TLS secret, mounted where its variables point.
fn agent_tls_mount(agent: &AgentConfig, volumes: &mut Vec<Volume>) -> Option<VolumeMount> {
    let tls = agent.tls.as_ref()?;
    Some(private_secret(
        volumes,
        AGENT_TLS_VOLUME,
        &tls.secret,
        AGENT_TLS_DIR,
    ))
}

/// Berth's init container `berth-install`, which copies the agent into an empty volume for
/// a container of the workspace's image to run; that volume's read-only mount.
fn install_agent(
    agent: &AgentConfig,
    volumes: &mut Vec<Volume>,
    init_containers: &mut Vec<Container>,
) -> VolumeMount {
    volumes.push(Volume {
        name: AGENT_VOLUME.into(),
        empty_dir: Some(Default::default()),
        ..Default::default()
    });
    let mount = |read_only: bool| VolumeMount {
        name: AGENT_VOLUME.into(),
        mount_path: AGENT_DIR.into(),
        read_only: read_only.then_some(true),
        ..Default::default()
    };
    init_containers.push(Container {
        name: INSTALL_CONTAINER.into(),
        image: Some(agent.image.clone()),
        command: Some(vec![
            agent.binary.clone(),
            "install".into(),
            format!("{AGENT_DIR}/berth"),
        ]),
        volume_mounts: Some(vec![mount(false)]),
        security_context: Some(restricted(true)),
        ..Default::default()
    });
    mount(true)
}

/// The content's credentials secret, for the container whose agent clones.
fn content_auth_mount(workspace: &Workspace, volumes: &mut Vec<Volume>) -> Option<VolumeMount> {
    let auth = workspace.spec.content.as_ref()?.git.auth.as_ref()?;
    Some(private_secret(
        volumes,
        CONTENT_AUTH_VOLUME,
        &auth.secret_name,
        berth_api::agent::CREDENTIALS_DIR,
    ))
}

/// A secret volume only its owner may read (0400), and its read-only mount at `path`.
fn private_secret(volumes: &mut Vec<Volume>, name: &str, secret: &str, path: &str) -> VolumeMount {
    volumes.push(Volume {
        name: name.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.to_owned()),
            default_mode: Some(0o400),
            ..Default::default()
        }),
        ..Default::default()
    });
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: Some(true),
        ..Default::default()
    }
}

/// What every container Berth puts in a workspace pod runs with, as Pod Security
/// "restricted" asks: no privilege escalation, no capabilities, and (for Berth's own
/// containers always, for the workspace's unless the operator allows root images) not as
/// root. The seccomp profile `RuntimeDefault` is the pod's.
fn restricted(non_root: bool) -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        run_as_non_root: non_root.then_some(true),
        ..Default::default()
    }
}

/// The workspace container's security context: a kind's, with what "restricted" asks filled
/// in where the kind says nothing.
fn container_security(kind: Option<SecurityContext>, non_root: bool) -> SecurityContext {
    let restricted = restricted(non_root);
    let Some(mut context) = kind else {
        return restricted;
    };
    context.allow_privilege_escalation = context
        .allow_privilege_escalation
        .or(restricted.allow_privilege_escalation);
    context.capabilities = context.capabilities.or(restricted.capabilities);
    context.run_as_non_root = context.run_as_non_root.or(restricted.run_as_non_root);
    context
}

/// The workspace's pod, with the agent injected (rule C4): with a command, an init container
/// copies `berth` into an `emptyDir` and the workspace container runs `berth agent -- <command>`,
/// so the agent supervises it; without one, the image's own entrypoint runs untouched and the
/// agent runs beside it in its own container (it cannot know the image's command).
pub fn build_pod(workspace: &Workspace, agent: &AgentConfig) -> Pod {
    let spec = &workspace.spec;
    let name = workspace.name_any();
    let template = spec.pod_template.clone().unwrap_or_default();
    let template_meta = template.metadata.clone().unwrap_or_default();
    let mut annotations = template_meta.annotations.clone();
    annotations.insert(labels::SPEC_HASH.to_owned(), pod_hash(workspace));
    if let Some(hash) = content_hash(workspace) {
        annotations.insert(labels::CONTENT_HASH.to_owned(), hash);
    }
    let record = workspace
        .status
        .as_ref()
        .and_then(|s| s.resolved.as_deref());

    let mut volumes = vec![];
    let mut mounts = vec![];
    let workspace_volumes = template.volumes.clone().unwrap_or_default();
    if let Some(home) = &workspace_volumes.home {
        volumes.push(Volume {
            name: "home".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim_name(&name),
                read_only: None,
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: "home".into(),
            mount_path: home.mount_path.as_str().to_owned(),
            ..Default::default()
        });
    }
    for (i, data) in workspace_volumes.data.iter().enumerate() {
        let volume = format!("data-{i}");
        volumes.push(Volume {
            name: volume.clone(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: data.claim_name.clone(),
                read_only: data.read_only.then_some(true),
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: volume,
            mount_path: data.mount_path.as_str().to_owned(),
            read_only: data.read_only.then_some(true),
            ..Default::default()
        });
    }
    for (i, secret) in workspace_volumes.secrets.iter().enumerate() {
        let volume = format!("secret-{i}");
        volumes.push(Volume {
            name: volume.clone(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.secret_name.clone()),
                default_mode: Some(secret.default_mode.unwrap_or(0o644)),
                optional: secret.optional,
                items: None,
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: volume,
            mount_path: secret.mount_path.as_str().to_owned(),
            read_only: Some(true),
            ..Default::default()
        });
    }

    let mut init_containers = vec![];
    let mut sidecars = vec![];
    let mut env = spec.env.clone();
    let (command, probe) = match &spec.command {
        Some(command) if !command.is_empty() => {
            mounts.push(install_agent(agent, &mut volumes, &mut init_containers));
            mounts.extend(agent_tls_mount(agent, &mut volumes));
            mounts.extend(content_auth_mount(workspace, &mut volumes));
            // The agent's variables come last: they win over the spec's.
            env.extend(agent_env(workspace, agent));
            let mut wrapped = vec![format!("{AGENT_DIR}/berth"), "agent".into(), "--".into()];
            wrapped.extend(command.iter().cloned());
            (Some(wrapped), Some(agent_probe(agent)))
        }
        _ => {
            let tls_mount = agent_tls_mount(agent, &mut volumes);
            // The image's entrypoint cannot wait for the content: the agent puts it in place
            // first, as the pod's init container (the sidecar then finds it there).
            let home_mount = mounts
                .iter()
                .find(|m| m.name == "home")
                .filter(|_| workspace.spec.content.is_some())
                .cloned();
            if let Some(home_mount) = &home_mount {
                let mut content_mounts = vec![
                    home_mount.clone(),
                    install_agent(agent, &mut volumes, &mut init_containers),
                ];
                content_mounts.extend(tls_mount.clone());
                content_mounts.extend(content_auth_mount(workspace, &mut volumes));
                // The workspace's image and security context, so the checkout's files are the
                // workspace's user's, as they would be had it cloned them itself.
                init_containers.push(Container {
                    name: CONTENT_CONTAINER.into(),
                    image: Some(spec.image.clone()),
                    image_pull_policy: record.and_then(|r| r.image.spec.image_pull_policy.clone()),
                    command: Some(vec![
                        format!("{AGENT_DIR}/berth"),
                        "agent".into(),
                        "--until-content".into(),
                    ]),
                    env: Some(agent_env(workspace, agent)),
                    volume_mounts: Some(content_mounts),
                    security_context: Some(container_security(
                        record.and_then(|r| r.security_context.as_ref()?.container.clone()),
                        !agent.root_images,
                    )),
                    ..Default::default()
                });
            }
            let sidecar_mounts: Vec<VolumeMount> =
                tls_mount.into_iter().chain(home_mount).collect();
            sidecars.push(Container {
                name: AGENT_CONTAINER.into(),
                image: Some(agent.image.clone()),
                command: Some(vec![agent.binary.clone(), "agent".into()]),
                env: Some(agent_env(workspace, agent)),
                volume_mounts: (!sidecar_mounts.is_empty()).then_some(sidecar_mounts),
                readiness_probe: Some(agent_probe(agent)),
                security_context: Some(restricted(true)),
                resources: Some(ResourceRequirements {
                    requests: Some(
                        [
                            ("cpu".to_owned(), Quantity("10m".into())),
                            ("memory".to_owned(), Quantity("32Mi".into())),
                        ]
                        .into(),
                    ),
                    ..Default::default()
                }),
                ..Default::default()
            });
            (None, None)
        }
    };
    // A kind's probes: its readiness probe says when the workspace's app is ready (the
    // agent is verified by WhoAmI anyway).
    let probes = record.and_then(|r| r.probes.clone()).unwrap_or_default();
    let container = Container {
        name: CONTAINER.into(),
        image: Some(spec.image.clone()),
        image_pull_policy: record.and_then(|r| r.image.spec.image_pull_policy.clone()),
        command,
        readiness_probe: probes.readiness.or(probe),
        liveness_probe: probes.liveness,
        env: (!env.is_empty()).then_some(env),
        resources: spec.resources.as_deref().cloned(),
        ports: (!spec.ports.is_empty()).then(|| {
            spec.ports
                .iter()
                .map(|p| ContainerPort {
                    name: Some(p.name.clone()),
                    container_port: p.port,
                    protocol: Some("TCP".into()),
                    ..Default::default()
                })
                .collect()
        }),
        volume_mounts: (!mounts.is_empty()).then_some(mounts),
        security_context: Some(container_security(
            record.and_then(|r| r.security_context.as_ref()?.container.clone()),
            !agent.root_images,
        )),
        ..Default::default()
    };
    let mut pod_security = record
        .and_then(|r| r.security_context.as_ref()?.pod.clone())
        .unwrap_or_default();
    pod_security.seccomp_profile.get_or_insert(SeccompProfile {
        type_: "RuntimeDefault".into(),
        localhost_profile: None,
    });
    Pod {
        metadata: metadata(
            workspace,
            pod_name(&name),
            &template_meta.labels,
            annotations,
        ),
        spec: Some(PodSpec {
            init_containers: (!init_containers.is_empty()).then_some(init_containers),
            containers: std::iter::once(container).chain(sidecars).collect(),
            volumes: (!volumes.is_empty()).then_some(volumes),
            service_account_name: spec.service_account_name.clone(),
            node_selector: (!template.node_selector.is_empty())
                .then(|| template.node_selector.clone()),
            tolerations: (!template.tolerations.is_empty()).then(|| template.tolerations.clone()),
            affinity: template.affinity.clone(),
            restart_policy: Some("Always".into()),
            security_context: Some(pod_security),
            ..Default::default()
        }),
        status: None,
    }
}

/// The workspace's home volume, when its (shaped) spec has one.
fn home_volume(workspace: &Workspace) -> Option<&berth_api::HomeVolume> {
    workspace
        .spec
        .pod_template
        .as_ref()?
        .volumes
        .as_ref()?
        .home
        .as_ref()
}

/// The home claim, when the spec asks for one.
pub fn build_claim(workspace: &Workspace) -> Option<PersistentVolumeClaim> {
    let home = home_volume(workspace)?.clone();
    Some(PersistentVolumeClaim {
        metadata: metadata(
            workspace,
            claim_name(&workspace.name_any()),
            &BTreeMap::new(),
            BTreeMap::new(),
        ),
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some([("storage".to_owned(), home.size.clone())].into()),
                limits: None,
            }),
            storage_class_name: home.storage_class_name.clone(),
            ..Default::default()
        }),
        status: None,
    })
}

/// The ClusterIP service, when the spec has ports.
pub fn build_service(workspace: &Workspace) -> Option<Service> {
    if workspace.spec.ports.is_empty() {
        return None;
    }
    let name = workspace.name_any();
    Some(Service {
        metadata: metadata(
            workspace,
            service_name(&name),
            &BTreeMap::new(),
            BTreeMap::new(),
        ),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(
                [(
                    labels::WORKSPACE.to_owned(),
                    labels::workspace_label_value(&name),
                )]
                .into(),
            ),
            ports: Some(
                workspace
                    .spec
                    .ports
                    .iter()
                    .map(|p| ServicePort {
                        name: Some(p.name.clone()),
                        port: p.port,
                        target_port: Some(IntOrString::Int(p.port)),
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        status: None,
    })
}

/// Whether a service's ports are what the workspace asks for.
pub fn service_ports_match(service: &Service, workspace: &Workspace) -> bool {
    let have: Vec<(Option<String>, i32)> = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|p| (p.name, p.port))
        .collect();
    let want: Vec<(Option<String>, i32)> = workspace
        .spec
        .ports
        .iter()
        .map(|p| (Some(p.name.clone()), p.port))
        .collect();
    have == want
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::DEFAULT_AGENT_IMAGE;
    use serde_json::json;

    /// A workspace as the API server would return it.
    pub fn workspace(name: &str, spec: serde_json::Value) -> Workspace {
        serde_json::from_value(json!({
            "apiVersion": "berth.dev/v1alpha1", "kind": "Workspace",
            "metadata": {"name": name, "namespace": "team-a", "uid": format!("uid-{name}"), "generation": 1},
            "spec": spec
        }))
        .expect("a valid workspace")
    }

    #[test]
    fn names_are_deterministic_and_bounded() {
        assert_eq!(pod_name("alice-dev"), "alice-dev-ws");
        assert_eq!(claim_name("alice-dev"), "alice-dev-home");
        assert_eq!(service_name("alice-dev"), "alice-dev");
        assert!(service_name("1.dev").starts_with("ws-1-dev-"));
        assert_eq!(service_name("1.dev").len(), 63);
        let long = "a".repeat(250);
        assert!(pod_name(&long).len() <= 253);
        assert_eq!(pod_name(&long), pod_name(&long));
        assert_ne!(pod_name(&long), pod_name(&format!("{}b", "a".repeat(249))));
        assert!(service_name(&"b".repeat(100)).len() <= 63);
    }

    #[test]
    fn names_that_derive_alike_today_derive_apart() {
        // A leading digit or a dot maps to `ws-...`, which another workspace may be named.
        assert_ne!(service_name("2a.b"), service_name("ws-2a-b"));
        // A name of exactly the limit's length and a longer name cut to it.
        let long = "a".repeat(300);
        let cut = pod_name(&long[..253]);
        let spelled = cut.strip_suffix("-ws").unwrap();
        assert_ne!(pod_name(spelled), cut);
    }

    #[test]
    fn the_pod_carries_volumes_labels_owner_and_hash() {
        let ws = workspace(
            "alice",
            json!({
                "image": "devbox:1",
                "command": ["sleep", "infinity"],
                "ports": [{"name": "http", "port": 8080}],
                "serviceAccountName": "dev",
                "podTemplate": {
                    "metadata": {"labels": {"team": "a", "berth.dev/workspace": "spoofed"}},
                    "nodeSelector": {"disk": "ssd"},
                    "volumes": {
                        "home": {"size": "10Gi", "mountPath": "/home/dev"},
                        "data": [{"claimName": "shared", "mountPath": "/data", "readOnly": true}],
                        "secrets": [{"secretName": "git", "mountPath": "/secrets/git", "defaultMode": 256, "optional": true}]
                    }
                }
            }),
        );
        let pod = build_pod(&ws, &AgentConfig::default());
        let value = serde_json::to_value(&pod).unwrap();
        assert_eq!(value["metadata"]["name"], "alice-ws");
        assert_eq!(
            value["metadata"]["labels"]["berth.dev/workspace"], "alice",
            "Berth's labels win"
        );
        assert_eq!(value["metadata"]["labels"]["team"], "a");
        assert_eq!(
            value["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "berth"
        );
        assert_eq!(value["metadata"]["ownerReferences"][0]["uid"], "uid-alice");
        assert_eq!(value["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(
            value["metadata"]["annotations"][labels::SPEC_HASH],
            spec_hash(&ws.spec)
        );
        let spec = &value["spec"];
        assert_eq!(
            spec["containers"][0]["command"],
            json!(["/opt/berth/berth", "agent", "--", "sleep", "infinity"]),
            "the agent supervises the workspace's command"
        );
        assert_eq!(
            spec["initContainers"],
            json!([{
                "name": "berth-install",
                "image": DEFAULT_AGENT_IMAGE,
                "command": ["/usr/local/bin/berth", "install", "/opt/berth/berth"],
                "volumeMounts": [{"name": "berth-agent", "mountPath": "/opt/berth"}],
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": true}
            }])
        );
        assert_eq!(
            spec["containers"][0]["readinessProbe"]["grpc"],
            json!({"port": 50051})
        );
        assert_eq!(
            spec["containers"][0]["env"],
            json!([
                {"name": "BERTH_WORKSPACE_NAMESPACE", "value": "team-a"},
                {"name": "BERTH_WORKSPACE_NAME", "value": "alice"},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "BERTH_AGENT_SERVICE_ACCOUNT", "value": "team-a:dev"},
                {"name": "BERTH_AGENT_PORT", "value": "50051"},
                {"name": "BERTH_AGENT_ACTIVITY_PORTS", "value": "8080"},
                {"name": "BERTH_HOME", "value": "/home/dev"}
            ])
        );
        assert_eq!(spec["containers"].as_array().unwrap().len(), 1);
        assert_eq!(spec["serviceAccountName"], "dev");
        assert_eq!(spec["nodeSelector"], json!({"disk": "ssd"}));
        assert_eq!(
            spec["volumes"],
            json!([
                {"name": "home", "persistentVolumeClaim": {"claimName": "alice-home"}},
                {"name": "data-0", "persistentVolumeClaim": {"claimName": "shared", "readOnly": true}},
                {"name": "secret-0", "secret": {"secretName": "git", "defaultMode": 256, "optional": true}},
                {"name": "berth-agent", "emptyDir": {}}
            ])
        );
        assert_eq!(
            spec["containers"][0]["volumeMounts"][3],
            json!({"name": "berth-agent", "mountPath": "/opt/berth", "readOnly": true})
        );
        assert_eq!(
            spec["containers"][0]["volumeMounts"][2],
            json!({"name": "secret-0", "mountPath": "/secrets/git", "readOnly": true})
        );
        let claim = serde_json::to_value(build_claim(&ws).unwrap()).unwrap();
        assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "10Gi");
        let service = serde_json::to_value(build_service(&ws).unwrap()).unwrap();
        assert_eq!(
            service["spec"]["selector"],
            json!({"berth.dev/workspace": "alice"})
        );
        assert_eq!(service["spec"]["ports"][0]["targetPort"], 8080);
    }

    /// What Pod Security "restricted" asks of every container of a pod and of the pod.
    fn restricted_violations(pod: &Pod) -> Vec<String> {
        let spec = pod.spec.as_ref().unwrap();
        let pod_context = spec.security_context.clone().unwrap_or_default();
        let mut found = vec![];
        if pod_context
            .seccomp_profile
            .as_ref()
            .map(|p| p.type_.as_str())
            != Some("RuntimeDefault")
        {
            found.push("the pod's seccomp profile".to_owned());
        }
        let containers = spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers);
        for c in containers {
            let context = c.security_context.clone().unwrap_or_default();
            if context.allow_privilege_escalation != Some(false) {
                found.push(format!("{}: allowPrivilegeEscalation", c.name));
            }
            if context.capabilities.and_then(|c| c.drop) != Some(vec!["ALL".to_owned()]) {
                found.push(format!("{}: capabilities", c.name));
            }
            let non_root = context.run_as_non_root.or(pod_context.run_as_non_root);
            if non_root != Some(true) {
                found.push(format!("{}: runAsNonRoot", c.name));
            }
        }
        found
    }

    #[test]
    fn every_container_runs_restricted_unless_the_admin_allows_root_images() {
        let with_command = workspace("a", json!({"image": "x:1", "command": ["sleep", "1"]}));
        let sidecar = workspace("b", json!({"image": "x:1"}));
        for ws in [&with_command, &sidecar] {
            let pod = build_pod(ws, &AgentConfig::default());
            assert_eq!(restricted_violations(&pod), Vec::<String>::new());
        }
        // Root is the admin's choice, for the workspace container only.
        let root = AgentConfig {
            root_images: true,
            ..AgentConfig::default()
        };
        for ws in [&with_command, &sidecar] {
            let pod = build_pod(ws, &root);
            assert_eq!(restricted_violations(&pod), ["workspace: runAsNonRoot"]);
        }
    }

    #[test]
    fn without_a_command_the_image_entrypoint_runs_and_the_agent_is_a_sidecar() {
        let ws = workspace(
            "bob",
            json!({"image": "devbox:1", "env": [{"name": "A", "value": "1"}]}),
        );
        let agent = AgentConfig {
            image: "registry.example/berth:9".into(),
            port: 6000,
            ..AgentConfig::default()
        };
        let spec = serde_json::to_value(build_pod(&ws, &agent)).unwrap()["spec"].clone();
        assert_eq!(spec["initContainers"], serde_json::Value::Null);
        assert_eq!(spec["volumes"], serde_json::Value::Null);
        let workspace_container = &spec["containers"][0];
        assert_eq!(workspace_container["name"], "workspace");
        assert_eq!(workspace_container["command"], serde_json::Value::Null);
        assert_eq!(
            workspace_container["env"],
            json!([{"name": "A", "value": "1"}])
        );
        let sidecar = &spec["containers"][1];
        assert_eq!(sidecar["name"], "berth-agent");
        assert_eq!(sidecar["image"], "registry.example/berth:9");
        assert_eq!(sidecar["command"], json!(["/usr/local/bin/berth", "agent"]));
        assert_eq!(sidecar["readinessProbe"]["grpc"], json!({"port": 6000}));
        assert_eq!(
            sidecar["env"][3],
            json!({"name": "BERTH_AGENT_SERVICE_ACCOUNT", "value": "team-a:default"})
        );
    }

    /// A spec stored before the CRD refused `BERTH_` names may still carry them: the agent's
    /// own variables come after the spec's, and the kubelet takes the last of duplicates.
    #[test]
    fn the_agents_variables_win_over_the_specs() {
        let ws = workspace(
            "alice",
            json!({"image": "devbox:1", "command": ["sleep", "1"], "env": [
                {"name": "BERTH_WORKSPACE_NAME", "value": "bob"},
                {"name": "BERTH_AGENT_SERVICE_ACCOUNT", "value": "team-b:admin"},
                {"name": "EDITOR", "value": "vi"}
            ]}),
        );
        let spec =
            serde_json::to_value(build_pod(&ws, &AgentConfig::default())).unwrap()["spec"].clone();
        let env = spec["containers"][0]["env"].as_array().unwrap().clone();
        let last = |name: &str| {
            env.iter()
                .rfind(|e| e["name"] == name)
                .map(|e| e["value"].clone())
        };
        assert_eq!(last("BERTH_WORKSPACE_NAME"), Some(json!("alice")));
        assert_eq!(
            last("BERTH_AGENT_SERVICE_ACCOUNT"),
            Some(json!("team-a:default"))
        );
        assert_eq!(last("EDITOR"), Some(json!("vi")), "the user's own stay");
    }

    #[test]
    fn the_agents_port_is_read_from_the_container_that_runs_it() {
        let agent = AgentConfig {
            port: 50123,
            ..AgentConfig::default()
        };
        let theirs = json!([{"name": "BERTH_AGENT_PORT", "value": "22"}]);
        // Wrapping the workspace's command: the spec's own variable of that name loses, as
        // the kubelet takes the last.
        let wrapped = workspace(
            "w",
            json!({"image": "devbox:1", "command": ["sleep", "1"], "env": theirs}),
        );
        assert_eq!(agent_port(&build_pod(&wrapped, &agent)), Some(50123));
        // Beside the image's entrypoint: the agent's own container; the workspace
        // container's variables are the workspace's, never read.
        let beside = workspace("b", json!({"image": "devbox:1", "env": theirs}));
        assert_eq!(agent_port(&build_pod(&beside, &agent)), Some(50123));
        // A command that is not the agent's wrapping, or another container, names no port.
        let mut pod = build_pod(&wrapped, &agent);
        container_named(&mut pod, CONTAINER)
            .command
            .as_mut()
            .unwrap()[2] = "-x".into();
        assert_eq!(agent_port(&pod), None);
        let mut pod = build_pod(&wrapped, &agent);
        container_named(&mut pod, CONTAINER).name = "other".into();
        assert_eq!(agent_port(&pod), None);
    }

    fn container_named<'a>(pod: &'a mut Pod, name: &str) -> &'a mut Container {
        let containers = &mut pod.spec.as_mut().unwrap().containers;
        containers.iter_mut().find(|c| c.name == name).unwrap()
    }

    #[test]
    fn with_tls_the_agent_mounts_its_secret_and_is_probed_by_tcp() {
        let agent = AgentConfig {
            tls: Some(crate::config::AgentTls {
                secret: "agent-cert".into(),
                ca_pem: b"ca".to_vec(),
            }),
            ..AgentConfig::default()
        };
        for (spec, container) in [
            (json!({"image": "devbox:1", "command": ["sleep", "1"]}), 0),
            (json!({"image": "devbox:1"}), 1),
        ] {
            let ws = workspace("t", spec);
            let pod = build_pod(&ws, &agent);
            assert!(serves_agent_tls(&CachedPod::from(&pod)));
            assert!(!serves_agent_tls(&CachedPod::from(&build_pod(
                &ws,
                &AgentConfig::default()
            ))));
            let spec = serde_json::to_value(pod.spec.unwrap()).unwrap();
            let volumes = spec["volumes"].as_array().unwrap();
            assert!(volumes.contains(&json!({"name": "berth-agent-tls", "secret": {"secretName": "agent-cert", "defaultMode": 256}})));
            let runs_agent = &spec["containers"][container];
            assert!(runs_agent["volumeMounts"].as_array().unwrap().contains(
                &json!({"name": "berth-agent-tls", "mountPath": "/etc/berth/agent-tls", "readOnly": true})
            ));
            let env = runs_agent["env"].as_array().unwrap();
            assert!(env.contains(
                &json!({"name": "BERTH_AGENT_TLS_CERT", "value": "/etc/berth/agent-tls/tls.crt"})
            ));
            assert!(env.contains(
                &json!({"name": "BERTH_AGENT_TLS_KEY", "value": "/etc/berth/agent-tls/tls.key"})
            ));
            assert_eq!(
                runs_agent["readinessProbe"],
                json!({"tcpSocket": {"port": 50051}, "periodSeconds": 2, "failureThreshold": 3}),
                "kubelet gRPC probes cannot speak TLS"
            );
        }
    }

    #[test]
    fn the_agent_knows_where_the_home_volume_is_so_a_shell_starts_there() {
        let home = json!({"volumes": {"home": {"size": "1Gi", "mountPath": "/home/dev"}}});
        let env_of = |spec: serde_json::Value| {
            let pod = build_pod(&workspace("t", spec), &AgentConfig::default());
            let spec = serde_json::to_value(pod.spec.unwrap()).unwrap();
            spec["containers"][0]["env"].clone()
        };
        let with =
            env_of(json!({"image": "devbox:1", "command": ["sleep", "1"], "podTemplate": home}));
        assert!(
            with.as_array()
                .unwrap()
                .contains(&json!({"name": "BERTH_HOME", "value": "/home/dev"})),
            "{with}"
        );
        let without = env_of(json!({"image": "devbox:1", "command": ["sleep", "1"]}));
        assert!(!without.to_string().contains("BERTH_HOME"), "{without}");
    }

    #[test]
    fn the_agent_that_clones_gets_the_home_and_the_credentials_and_no_secret_in_its_spec() {
        let home = json!({"volumes": {"home": {"size": "1Gi", "mountPath": "/home/dev"}}});
        let content = json!({"git": {"url": "https://h/org/app.git", "ref": "main", "auth": {"secretName": "git-creds"}}});
        let agent = AgentConfig::default();
        let auth_mount = json!({"name": "berth-content-auth", "mountPath": "/etc/berth/content-auth", "readOnly": true});
        let home_mount = json!({"name": "home", "mountPath": "/home/dev"});
        let given = json!({"url": "https://h/org/app.git", "ref": "main", "path": "app", "depth": 1, "home": "/home/dev", "auth": true});
        // The agent wrapping the command clones in the workspace container.
        let ws = workspace(
            "t",
            json!({"image": "devbox:1", "command": ["sleep", "1"], "podTemplate": home, "content": content}),
        );
        let pod = build_pod(&ws, &agent);
        assert!(pod.annotations().contains_key(labels::CONTENT_HASH));
        let spec = serde_json::to_value(pod.spec.unwrap()).unwrap();
        assert!(spec["volumes"].as_array().unwrap().contains(&json!({"name": "berth-content-auth", "secret": {"secretName": "git-creds", "defaultMode": 256}})));
        let workspace_container = &spec["containers"][0];
        assert!(
            workspace_container["volumeMounts"]
                .as_array()
                .unwrap()
                .contains(&auth_mount)
        );
        let env = workspace_container["env"].as_array().unwrap();
        let content_env = env.iter().find(|e| e["name"] == "BERTH_CONTENT").unwrap();
        let parsed: serde_json::Value =
            serde_json::from_str(content_env["value"].as_str().unwrap()).unwrap();
        assert_eq!(parsed, given);
        // An entrypoint workspace: the agent clones first, as the init container.
        let ws = workspace(
            "t",
            json!({"image": "devbox:1", "podTemplate": home, "content": content}),
        );
        let spec = serde_json::to_value(build_pod(&ws, &agent).spec.unwrap()).unwrap();
        assert_eq!(spec["initContainers"][0]["name"], "berth-install");
        let init = &spec["initContainers"][1];
        assert_eq!(init["name"], "berth-content");
        // The workspace's image and user: the files it clones are the workspace's.
        assert_eq!(init["image"], "devbox:1");
        assert_eq!(
            init["securityContext"],
            spec["containers"][0]["securityContext"]
        );
        assert_eq!(
            init["command"],
            json!(["/opt/berth/berth", "agent", "--until-content"])
        );
        let mounts = init["volumeMounts"].as_array().unwrap();
        assert!(
            mounts.contains(&auth_mount) && mounts.contains(&home_mount),
            "{mounts:?}"
        );
        let agent_mount =
            json!({"name": "berth-agent", "mountPath": "/opt/berth", "readOnly": true});
        assert!(mounts.contains(&agent_mount), "{mounts:?}");
        let sidecar = &spec["containers"][1];
        let mounts = sidecar["volumeMounts"].as_array().unwrap();
        assert!(
            mounts.contains(&home_mount) && !mounts.contains(&auth_mount),
            "{mounts:?}"
        );
        // Without content, nothing of it.
        let ws = workspace("t", json!({"image": "devbox:1", "podTemplate": home}));
        let pod = build_pod(&ws, &agent);
        assert!(!pod.annotations().contains_key(labels::CONTENT_HASH));
        let text = serde_json::to_string(&pod).unwrap();
        assert!(!text.contains("BERTH_CONTENT") && !text.contains("berth-content"));
    }

    /// Golden: the hash of this spec must never change, or every running workspace restarts
    /// on upgrade. A change here needs a new [`SPEC_HASH_VERSION`] and a note in the release.
    #[test]
    fn the_spec_hash_is_stable_across_releases() {
        let ws = workspace(
            "golden",
            json!({
                "image": "devbox:1.4", "command": ["sleep", "infinity"],
                "env": [{"name": "EDITOR", "value": "vim"}],
                "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
                "ports": [{"name": "http", "port": 8080}], "serviceAccountName": "dev",
                "podTemplate": {"nodeSelector": {"disk": "ssd"},
                    "volumes": {"home": {"size": "10Gi", "mountPath": "/home/dev"},
                        "secrets": [{"secretName": "git", "mountPath": "/s", "defaultMode": 256}]}},
                "lifecycle": {"startTimeout": "10m"}
            }),
        );
        assert_eq!(spec_hash(&ws.spec), GOLDEN);
    }
    const GOLDEN: &str = "60b8a813d030103a";

    #[test]
    fn the_hash_ignores_what_says_nothing_and_what_does_not_shape_the_pod() {
        let plain = workspace("a", json!({"image": "x:1"}));
        for same in [
            json!({"image": "x:1", "env": [], "ports": [], "command": null}),
            json!({"image": "x:1", "podTemplate": {}, "resources": {}}),
            json!({"image": "x:1", "podTemplate": {"metadata": {"labels": {}}, "nodeSelector": {}}}),
            json!({"image": "x:1", "paused": true, "lifecycle": {"startTimeout": "5m"}}),
        ] {
            assert_eq!(
                spec_hash(&workspace("a", same.clone()).spec),
                spec_hash(&plain.spec),
                "{same}"
            );
        }
        // How the gateway serves a port does not restart the workspace.
        let port = |extra: serde_json::Value| {
            let mut p = json!({"name": "http", "port": 80});
            p.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            spec_hash(&workspace("a", json!({"image": "x:1", "ports": [p]})).spec)
        };
        assert_eq!(
            port(json!({})),
            port(json!({"public": true, "stripPrefix": false}))
        );
        assert_ne!(port(json!({})), port(json!({"port": 81})));
    }

    #[test]
    fn pods_made_by_an_older_operator_are_still_current() {
        let ws = workspace(
            "a",
            json!({"image": "x:1", "ports": [{"name": "http", "port": 80}]}),
        );
        let mut pod = build_pod(&ws, &AgentConfig::default());
        assert!(built_from(&CachedPod::from(&pod), &ws));
        pod.metadata.annotations.as_mut().unwrap().insert(
            labels::SPEC_HASH.to_owned(),
            unversioned_spec_hash(&ws.spec),
        );
        let pod = CachedPod::from(&pod);
        assert!(built_from(&pod, &ws), "an upgrade restarts nothing");
        let changed = workspace(
            "a",
            json!({"image": "x:2", "ports": [{"name": "http", "port": 80}]}),
        );
        assert!(!built_from(&pod, &changed));
    }

    #[test]
    fn the_hash_follows_pod_shaping_fields_only() {
        let a = workspace("a", json!({"image": "x:1"}));
        let paused = workspace(
            "a",
            json!({"image": "x:1", "paused": true, "lifecycle": {"startTimeout": "5m"}}),
        );
        let other = workspace("a", json!({"image": "x:2"}));
        assert_eq!(spec_hash(&a.spec), spec_hash(&paused.spec));
        assert_ne!(spec_hash(&a.spec), spec_hash(&other.spec));
    }

    proptest::proptest! {
        #[test]
        fn building_twice_gives_the_same_pod(image in "[a-z]{1,10}:[0-9]{1,3}", port in 1i32..65535, mode in 0i32..512) {
            let ws = workspace("p", json!({"image": image, "ports": [{"name": "p", "port": port}],
                "podTemplate": {"volumes": {"secrets": [{"secretName": "s", "mountPath": "/s", "defaultMode": mode}]}}}));
            let agent = AgentConfig::default();
            proptest::prop_assert_eq!(build_pod(&ws, &agent), build_pod(&ws, &agent));
            let pod = serde_json::to_value(build_pod(&ws, &agent)).unwrap();
            proptest::prop_assert_eq!(&pod["spec"]["volumes"][0]["secret"]["defaultMode"], &json!(mode));
        }
    }
}
