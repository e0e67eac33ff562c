//! Pod Security admission as the real API server runs it (k8s.io/pod-security-admission,
//! Kubernetes 1.30-1.33): a namespace's `pod-security.kubernetes.io/{enforce,warn,audit}`
//! labels (with `-version`) choose a level, `privileged`, `baseline` or `restricted`; a pod
//! that breaks an `enforce` level is refused (403, `violates PodSecurity "restricted:latest":
//! ...`), one that breaks a `warn` level gets a `Warning` header, and a workload's pod template
//! is only warned about. `audit` is parsed but has no effect: the sim keeps no audit log. No
//! user, namespace or runtime class is exempt (a real server exempts only what its admission
//! configuration lists; the sim has none).

use serde_json::Value;

use crate::{
    error::{ApiError, ApiResult, Cause},
    store::Store,
};

const PREFIX: &str = "pod-security.kubernetes.io/";

/// A level, strictest last (so levels compare by strictness).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Privileged,
    Baseline,
    Restricted,
}

impl Level {
    fn parse(text: &str) -> Option<Self> {
        match text {
            "privileged" => Some(Level::Privileged),
            "baseline" => Some(Level::Baseline),
            "restricted" => Some(Level::Restricted),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }
}

/// `latest`, or `v1.N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    Latest,
    Minor(u32),
}

impl Version {
    fn parse(text: &str) -> Option<Self> {
        if text == "latest" {
            return Some(Version::Latest);
        }
        let minor = text.strip_prefix("v1.")?;
        let canonical = minor == "0" || (!minor.starts_with('0') && !minor.is_empty());
        (canonical && minor.chars().all(|c| c.is_ascii_digit()))
            .then(|| minor.parse().ok().map(Version::Minor))
            .flatten()
    }

    /// Whether the checks of Kubernetes 1.`minor` apply at this version.
    fn has(self, minor: u32) -> bool {
        match self {
            Version::Latest => true,
            Version::Minor(v) => v >= minor,
        }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Version::Latest => write!(f, "latest"),
            Version::Minor(v) => write!(f, "v1.{v}"),
        }
    }
}

/// A level at a version, as the messages name it: `restricted:latest`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LevelVersion {
    pub level: Level,
    pub version: Version,
}

impl std::fmt::Display for LevelVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.level.as_str(), self.version)
    }
}

/// What a namespace's labels ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub enforce: LevelVersion,
    pub warn: LevelVersion,
    pub audit: LevelVersion,
}

const PRIVILEGED: LevelVersion = LevelVersion {
    level: Level::Privileged,
    version: Version::Latest,
};

/// The policy of a namespace's labels, and the label errors (for a namespace write). An
/// invalid enforce level counts as `restricted` (closed), an invalid warn or audit level as
/// `privileged` (open), an invalid version as `latest`; a valid enforce level stricter than
/// an absent warn level is warned about too.
pub fn policy(labels: &Value) -> (Policy, Vec<Cause>) {
    let mut errors = vec![];
    let mut mode = |mode: &str, invalid_level: Level| {
        let level_key = format!("{PREFIX}{mode}");
        let version_key = format!("{PREFIX}{mode}-version");
        let mut lv = PRIVILEGED;
        let level = labels[&level_key].as_str();
        let version = labels[&version_key].as_str();
        let mut valid_level = false;
        if let Some(text) = level {
            match Level::parse(text) {
                Some(level) => {
                    lv.level = level;
                    valid_level = true;
                }
                None => {
                    lv.level = invalid_level;
                    errors.push(label_error(
                        &level_key,
                        text,
                        "must be one of privileged, baseline, restricted",
                    ));
                }
            }
        }
        if let Some(text) = version {
            match Version::parse(text) {
                Some(version) => lv.version = version,
                None => errors.push(label_error(
                    &version_key,
                    text,
                    "must be \"latest\" or \"v1.x\"",
                )),
            }
        }
        (lv, valid_level, level.is_some(), version.is_some())
    };
    let (enforce, enforce_valid, _, _) = mode("enforce", Level::Restricted);
    let (audit, _, _, _) = mode("audit", Level::Privileged);
    let (mut warn, _, has_warn, has_warn_version) = mode("warn", Level::Privileged);
    if !has_warn && enforce_valid && enforce.level > warn.level {
        warn.level = enforce.level;
        if !has_warn_version {
            warn.version = enforce.version;
        }
    }
    (
        Policy {
            enforce,
            warn,
            audit,
        },
        errors,
    )
}

fn label_error(key: &str, value: &str, detail: &str) -> Cause {
    Cause {
        reason: "FieldValueInvalid".to_owned(),
        message: format!("Invalid value: \"{value}\": {detail}"),
        field: format!("metadata.labels[{key}]"),
    }
}

/// `"a", "b"`.
fn join_quote(items: &[String]) -> String {
    if items.is_empty() {
        return String::new();
    }
    format!("\"{}\"", items.join("\", \""))
}

fn plural<'a>(singular: &'a str, plural: &'a str, count: usize) -> &'a str {
    if count == 1 { singular } else { plural }
}

/// `container "a"`, `containers "a", "b"`.
fn containers(names: &[String]) -> String {
    format!(
        "{} {}",
        plural("container", "containers", names.len()),
        join_quote(names)
    )
}

/// Sorted, without repeats.
fn set(mut items: Vec<String>) -> Vec<String> {
    items.sort();
    items.dedup();
    items
}

/// Every container of the pod spec: init containers, containers, ephemeral containers.
fn all_containers(spec: &Value) -> Vec<&Value> {
    ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .flat_map(|list| spec[*list].as_array().into_iter().flatten())
        .collect()
}

fn name(container: &Value) -> String {
    container["name"].as_str().unwrap_or_default().to_owned()
}

/// The setters that set a forbidden value, `pod` first: `pod and containers "a", "b"`.
fn setters(pod: bool, bad: &[String]) -> String {
    let mut parts = vec![];
    if pod {
        parts.push("pod".to_owned());
    }
    if !bad.is_empty() {
        parts.push(containers(bad));
    }
    parts.join(" and ")
}

type Check = fn(&Value, &Value, Version) -> Option<(String, String)>;

fn app_armor(meta: &Value, spec: &Value, _: Version) -> Option<(String, String)> {
    let allowed = |t: &str| t == "RuntimeDefault" || t == "Localhost";
    let mut values = vec![];
    let pod_type = spec["securityContext"]["appArmorProfile"]["type"].as_str();
    let pod_bad = pod_type.is_some_and(|t| !allowed(t));
    values.extend(pod_type.filter(|t| !allowed(t)).map(str::to_owned));
    let mut bad = vec![];
    for c in all_containers(spec) {
        if let Some(t) = c["securityContext"]["appArmorProfile"]["type"].as_str()
            && !allowed(t)
        {
            bad.push(name(c));
            values.push(t.to_owned());
        }
    }
    let mut values = set(values);
    let mut annotations: Vec<String> = meta["annotations"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.starts_with("container.apparmor.security.beta.kubernetes.io/"))
        .filter_map(|(k, v)| {
            let v = v.as_str().unwrap_or_default();
            let fine = v.is_empty() || v == "runtime/default" || v.starts_with("localhost/");
            (!fine).then(|| format!("{k}=\"{v}\""))
        })
        .collect();
    annotations.sort();
    let mut who = setters(pod_bad, &bad);
    if !annotations.is_empty() {
        let what = plural("annotation", "annotations", annotations.len());
        who = if who.is_empty() {
            what.to_owned()
        } else {
            format!("{who} and {what}")
        };
        values.extend(annotations);
    }
    (!who.is_empty()).then(|| {
        (
            plural(
                "forbidden AppArmor profile",
                "forbidden AppArmor profiles",
                values.len(),
            )
            .to_owned(),
            format!(
                "{who} must not set AppArmor profile type to {}",
                join_quote(&values)
            ),
        )
    })
}

const DEFAULT_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

fn capabilities_baseline(_: &Value, spec: &Value, _: Version) -> Option<(String, String)> {
    let mut bad = vec![];
    let mut added = vec![];
    for c in all_containers(spec) {
        let extra: Vec<String> = c["securityContext"]["capabilities"]["add"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .filter(|a| !DEFAULT_CAPABILITIES.contains(a))
            .map(str::to_owned)
            .collect();
        if !extra.is_empty() {
            bad.push(name(c));
            added.extend(extra);
        }
    }
    (!bad.is_empty()).then(|| {
        (
            "non-default capabilities".to_owned(),
            format!(
                "{} must not include {} in securityContext.capabilities.add",
                containers(&bad),
                join_quote(&set(added))
            ),
        )
    })
}

fn host_namespaces(_: &Value, spec: &Value, _: Version) -> Option<(String, String)> {
    let used: Vec<&str> = [
        ("hostNetwork", "hostNetwork=true"),
        ("hostPID", "hostPID=true"),
        ("hostIPC", "hostIPC=true"),
    ]
    .iter()
    .filter(|(field, _)| spec[*field].as_bool() == Some(true))
    .map(|(_, said)| *said)
    .collect();
    (!used.is_empty()).then(|| ("host namespaces".to_owned(), used.join(", ")))
}

fn host_path_volumes(_: &Value, spec: &Value, _: Version) -> Option<(String, String)> {
    let bad: Vec<String> = spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| !v["hostPath"].is_null())
        .map(name)
        .collect();
    (!bad.is_empty()).then(|| {
        (
            "hostPath volumes".to_owned(),
            format!(
                "{} {}",
                plural("volume", "volumes", bad.len()),
                join_quote(&bad)
            ),
        )
    })
}

fn host_ports(_: &Value, spec: &Value, _: Version) -> Option<(String, String)> {
    let mut bad = vec![];
    let mut ports = vec![];
    for c in all_containers(spec) {
        let used: Vec<String> = c["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["hostPort"].as_i64().filter(|p| *p != 0))
            .map(|p| p.to_string())
            .collect();
        if !used.is_empty() {
            bad.push(name(c));
            ports.extend(used);
        }
    }
    let ports = set(ports);
    (!bad.is_empty()).then(|| {
        (
            "hostPort".to_owned(),
            format!(
                "{} {} {} {}",
                containers(&bad),
                plural("uses", "use", bad.len()),
                plural("hostPort", "hostPorts", ports.len()),
                ports.join(", ")
            ),
        )
    })
}

fn privileged(_: &Value, spec: &Value, _: Version) -> Option<(String, String)> {
    let bad: Vec<String> = all_containers(spec)
        .into_iter()
        .filter(|c| c["securityContext"]["privileged"].as_bool() == Some(true))
        .map(name)
        .collect();
    (!bad.is_empty()).then(|| {
        (
            "privileged".to_owned(),
            format!(
                "{} must not set securityContext.privileged=true",
                containers(&bad)
            ),
        )
    })
}

fn proc_mount(_: &Value, spec: &Value, _: Version) -> Option<(String, String)> {
    let mut bad = vec![];
    let mut types = vec![];
    for c in all_containers(spec) {
        if let Some(t) = c["securityContext"]["procMount"].as_str()
            && t != "Default"
        {
            bad.push(name(c));
            types.push(t.to_owned());
        }
    }
    (!bad.is_empty()).then(|| {
        (
            "procMount".to_owned(),
            format!(
                "{} must not set securityContext.procMount to {}",
                containers(&bad),
                join_quote(&set(types))
            ),
        )
    })
}

fn se_linux(_: &Value, spec: &Value, version: Version) -> Option<(String, String)> {
    let allowed = |t: &str| {
        ["", "container_t", "container_init_t", "container_kvm_t"].contains(&t)
            || (t == "container_engine_t" && version.has(31))
    };
    let (mut types, mut user, mut role) = (vec![], false, false);
    let mut look = |options: &Value| -> bool {
        let mut bad = false;
        if let Some(t) = options["type"].as_str()
            && !allowed(t)
        {
            types.push(t.to_owned());
            bad = true;
        }
        if options["user"].as_str().is_some_and(|u| !u.is_empty()) {
            user = true;
            bad = true;
        }
        if options["role"].as_str().is_some_and(|r| !r.is_empty()) {
            role = true;
            bad = true;
        }
        bad
    };
    let pod_bad = look(&spec["securityContext"]["seLinuxOptions"]);
    let bad: Vec<String> = all_containers(spec)
        .into_iter()
        .filter(|c| look(&c["securityContext"]["seLinuxOptions"]))
        .map(name)
        .collect();
    if !pod_bad && bad.is_empty() {
        return None;
    }
    let types = set(types);
    let mut data = vec![];
    if !types.is_empty() {
        data.push(format!(
            "{} {}",
            plural("type", "types", types.len()),
            join_quote(&types)
        ));
    }
    if user {
        data.push("user may not be set".to_owned());
    }
    if role {
        data.push("role may not be set".to_owned());
    }
    Some((
        "seLinuxOptions".to_owned(),
        format!(
            "{} set forbidden securityContext.seLinuxOptions: {}",
            setters(pod_bad, &bad),
            data.join("; ")
        ),
    ))
}

/// `Unconfined` (or any type not `RuntimeDefault`/`Localhost`) set by the pod or containers.
fn seccomp_setters(spec: &Value) -> (bool, Vec<String>, Vec<String>) {
    let allowed = |t: &str| t == "RuntimeDefault" || t == "Localhost";
    let mut values = vec![];
    let pod_type = spec["securityContext"]["seccompProfile"]["type"].as_str();
    let pod_bad = pod_type.is_some_and(|t| !allowed(t));
    values.extend(pod_type.filter(|t| !allowed(t)).map(str::to_owned));
    let mut bad = vec![];
    for c in all_containers(spec) {
        if let Some(t) = c["securityContext"]["seccompProfile"]["type"].as_str()
            && !allowed(t)
        {
            bad.push(name(c));
            values.push(t.to_owned());
        }
    }
    (pod_bad, bad, set(values))
}

fn seccomp_baseline(_: &Value, spec: &Value, _: Version) -> Option<(String, String)> {
    let (pod_bad, bad, values) = seccomp_setters(spec);
    (pod_bad || !bad.is_empty()).then(|| {
        (
            "seccompProfile".to_owned(),
            format!(
                "{} must not set securityContext.seccompProfile.type to {}",
                setters(pod_bad, &bad),
                join_quote(&values)
            ),
        )
    })
}

fn sysctls(_: &Value, spec: &Value, version: Version) -> Option<(String, String)> {
    let mut allowed = vec![
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_unprivileged_port_start",
    ];
    if version.has(27) {
        allowed.push("net.ipv4.ip_local_reserved_ports");
    }
    if version.has(29) {
        allowed.extend([
            "net.ipv4.tcp_keepalive_time",
            "net.ipv4.tcp_fin_timeout",
            "net.ipv4.tcp_keepalive_intvl",
            "net.ipv4.tcp_keepalive_probes",
        ]);
    }
    if version.has(32) {
        allowed.extend(["net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"]);
    }
    let bad: Vec<&str> = spec["securityContext"]["sysctls"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["name"].as_str())
        .filter(|n| !allowed.contains(n))
        .collect();
    (!bad.is_empty()).then(|| ("forbidden sysctls".to_owned(), bad.join(", ")))
}

fn host_process(_: &Value, spec: &Value, _: Version) -> Option<(String, String)> {
    let set_true =
        |context: &Value| context["windowsOptions"]["hostProcess"].as_bool() == Some(true);
    let pod_bad = set_true(&spec["securityContext"]);
    let bad: Vec<String> = all_containers(spec)
        .into_iter()
        .filter(|c| set_true(&c["securityContext"]))
        .map(name)
        .collect();
    (pod_bad || !bad.is_empty()).then(|| {
        (
            "hostProcess".to_owned(),
            format!(
                "{} must not set securityContext.windowsOptions.hostProcess=true",
                setters(pod_bad, &bad)
            ),
        )
    })
}

fn windows(spec: &Value) -> bool {
    spec["os"]["name"] == "windows"
}

fn allow_privilege_escalation(
    _: &Value,
    spec: &Value,
    version: Version,
) -> Option<(String, String)> {
    if version.has(25) && windows(spec) {
        return None;
    }
    let bad: Vec<String> = all_containers(spec)
        .into_iter()
        .filter(|c| c["securityContext"]["allowPrivilegeEscalation"].as_bool() != Some(false))
        .map(name)
        .collect();
    (!bad.is_empty()).then(|| {
        (
            "allowPrivilegeEscalation != false".to_owned(),
            format!(
                "{} must set securityContext.allowPrivilegeEscalation=false",
                containers(&bad)
            ),
        )
    })
}

fn capabilities_restricted(_: &Value, spec: &Value, version: Version) -> Option<(String, String)> {
    if version.has(25) && windows(spec) {
        return None;
    }
    let (mut missing_drop, mut adding, mut added) = (vec![], vec![], vec![]);
    for c in all_containers(spec) {
        let capabilities = &c["securityContext"]["capabilities"];
        let strings = |key: &str| -> Vec<String> {
            capabilities[key]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        };
        if capabilities.is_null() || !strings("drop").iter().any(|d| d == "ALL") {
            missing_drop.push(name(c));
        }
        let extra: Vec<String> = strings("add")
            .into_iter()
            .filter(|a| a != "NET_BIND_SERVICE")
            .collect();
        if !extra.is_empty() {
            adding.push(name(c));
            added.extend(extra);
        }
    }
    let mut details = vec![];
    if !missing_drop.is_empty() {
        details.push(format!(
            "{} must set securityContext.capabilities.drop=[\"ALL\"]",
            containers(&missing_drop)
        ));
    }
    if !adding.is_empty() {
        details.push(format!(
            "{} must not include {} in securityContext.capabilities.add",
            containers(&adding),
            join_quote(&set(added))
        ));
    }
    (!details.is_empty()).then(|| ("unrestricted capabilities".to_owned(), details.join("; ")))
}

/// The volume sources "restricted" allows, and the names of the others as reported.
const ALLOWED_VOLUMES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
    "image",
];
const KNOWN_VOLUMES: &[&str] = &[
    "hostPath",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "gitRepo",
    "nfs",
    "iscsi",
    "glusterfs",
    "rbd",
    "flexVolume",
    "cinder",
    "cephfs",
    "flocker",
    "fc",
    "azureFile",
    "vsphereVolume",
    "quobyte",
    "azureDisk",
    "photonPersistentDisk",
    "portworxVolume",
    "scaleIO",
    "storageos",
];

fn restricted_volumes(_: &Value, spec: &Value, _: Version) -> Option<(String, String)> {
    let (mut bad, mut types) = (vec![], vec![]);
    for volume in spec["volumes"].as_array().into_iter().flatten() {
        let Some(source) = volume.as_object() else {
            continue;
        };
        let sources: Vec<&str> = source
            .keys()
            .map(String::as_str)
            .filter(|k| *k != "name")
            .collect();
        if sources.iter().any(|s| ALLOWED_VOLUMES.contains(s)) {
            continue;
        }
        bad.push(name(volume));
        types.push(
            sources
                .iter()
                .find(|s| KNOWN_VOLUMES.contains(s))
                .copied()
                .unwrap_or("unknown")
                .to_owned(),
        );
    }
    let types = set(types);
    (!bad.is_empty()).then(|| {
        (
            "restricted volume types".to_owned(),
            format!(
                "{} {} {} {} {}",
                plural("volume", "volumes", bad.len()),
                join_quote(&bad),
                plural("uses", "use", bad.len()),
                plural(
                    "restricted volume type",
                    "restricted volume types",
                    types.len()
                ),
                join_quote(&types)
            ),
        )
    })
}

fn run_as_non_root(_: &Value, spec: &Value, _: Version) -> Option<(String, String)> {
    let pod = spec["securityContext"]["runAsNonRoot"].as_bool();
    let (mut explicit, mut implicit) = (vec![], vec![]);
    for c in all_containers(spec) {
        match c["securityContext"]["runAsNonRoot"].as_bool() {
            Some(false) => explicit.push(name(c)),
            Some(true) => {}
            None if pod != Some(true) => implicit.push(name(c)),
            None => {}
        }
    }
    let reason = "runAsNonRoot != true".to_owned();
    if pod == Some(false) || !explicit.is_empty() {
        return Some((
            reason,
            format!(
                "{} must not set securityContext.runAsNonRoot=false",
                setters(pod == Some(false), &explicit)
            ),
        ));
    }
    (!implicit.is_empty()).then(|| {
        (
            reason,
            format!(
                "pod or {} must set securityContext.runAsNonRoot=true",
                containers(&implicit)
            ),
        )
    })
}

fn run_as_user(_: &Value, spec: &Value, _: Version) -> Option<(String, String)> {
    let root = |context: &Value| context["runAsUser"].as_i64() == Some(0);
    let pod_bad = root(&spec["securityContext"]);
    let bad: Vec<String> = all_containers(spec)
        .into_iter()
        .filter(|c| root(&c["securityContext"]))
        .map(name)
        .collect();
    (pod_bad || !bad.is_empty()).then(|| {
        (
            "runAsUser=0".to_owned(),
            format!("{} must not set runAsUser=0", setters(pod_bad, &bad)),
        )
    })
}

fn seccomp_restricted(_: &Value, spec: &Value, version: Version) -> Option<(String, String)> {
    if version.has(25) && windows(spec) {
        return None;
    }
    let (pod_bad, bad, values) = seccomp_setters(spec);
    let reason = "seccompProfile".to_owned();
    if pod_bad || !bad.is_empty() {
        return Some((
            reason,
            format!(
                "{} must not set securityContext.seccompProfile.type to {}",
                setters(pod_bad, &bad),
                join_quote(&values)
            ),
        ));
    }
    let pod_set = !spec["securityContext"]["seccompProfile"]["type"].is_null();
    let implicit: Vec<String> = all_containers(spec)
        .into_iter()
        .filter(|c| !pod_set && c["securityContext"]["seccompProfile"]["type"].is_null())
        .map(name)
        .collect();
    (!implicit.is_empty()).then(|| {
        (
            reason,
            format!(
                "pod or {} must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\"",
                containers(&implicit)
            ),
        )
    })
}

/// The checks of a level at a version, in the real registry's order: the baseline checks by
/// ID, then (for restricted) the restricted ones by ID, those that replace a baseline check
/// taking its place out. Each with the first minor version it applies from.
fn checks(level: Level) -> Vec<(u32, Check)> {
    let baseline: Vec<(u32, Check)> = vec![
        (0, app_armor),
        (0, capabilities_baseline),
        (0, host_namespaces),
        (0, host_path_volumes),
        (0, host_ports),
        (0, privileged),
        (0, proc_mount),
        (0, se_linux),
        (0, seccomp_baseline),
        (0, sysctls),
        (0, host_process),
    ];
    match level {
        Level::Privileged => vec![],
        Level::Baseline => baseline,
        Level::Restricted => {
            let replaced = [
                capabilities_baseline as Check,
                host_path_volumes,
                seccomp_baseline,
            ];
            let mut all: Vec<(u32, Check)> = baseline
                .into_iter()
                .filter(|(_, c)| !replaced.iter().any(|r| std::ptr::fn_addr_eq(*r, *c)))
                .collect();
            all.extend([
                (8, allow_privilege_escalation as Check),
                (22, capabilities_restricted),
                (0, restricted_volumes),
                (0, run_as_non_root),
                (23, run_as_user),
                (19, seccomp_restricted),
            ]);
            all
        }
    }
}

/// What `pod` (its metadata and spec) breaks at `lv`: `reason (detail), ...`, or nothing.
pub fn violations(lv: LevelVersion, meta: &Value, spec: &Value) -> Option<String> {
    let found: Vec<String> = checks(lv.level)
        .into_iter()
        .filter(|(since, _)| lv.version.has(*since))
        .filter_map(|(_, check)| check(meta, spec, lv.version))
        .map(|(reason, detail)| format!("{reason} ({detail})"))
        .collect();
    (!found.is_empty()).then(|| found.join(", "))
}

/// The pod template of a workload resource, if `resource` is one Pod Security looks at.
fn template<'a>(group: &str, resource: &str, object: &'a Value) -> Option<&'a Value> {
    match (group, resource) {
        ("apps", "deployments" | "replicasets" | "statefulsets" | "daemonsets")
        | ("batch", "jobs")
        | ("", "replicationcontrollers") => Some(&object["spec"]["template"]),
        ("", "podtemplates") => Some(&object["template"]),
        ("batch", "cronjobs") => Some(&object["spec"]["jobTemplate"]["spec"]["template"]),
        _ => None,
    }
}

/// Whether a pod update is one Pod Security looks at: a container's image changed, or the
/// number of containers, or an ephemeral container was added.
fn significant_update(old: &Value, new: &Value) -> bool {
    let images = |pod: &Value, list: &str| -> Vec<(String, String)> {
        pod["spec"][list]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| (name(c), c["image"].as_str().unwrap_or_default().to_owned()))
            .collect()
    };
    ["containers", "initContainers"].iter().any(|list| {
        images(old, list)
            .iter()
            .map(|(_, i)| i)
            .ne(images(new, list).iter().map(|(_, i)| i))
    }) || images(new, "ephemeralContainers")
        .iter()
        .any(|c| !images(old, "ephemeralContainers").contains(c))
}

/// Pod Security admission of a create (`old` absent) or update of `object`: the warnings for
/// the `Warning` header, or the 403 of an enforce level.
pub fn admit(
    store: &Store,
    group: &str,
    resource: &str,
    subresource: &str,
    namespace: &str,
    object: &Value,
    old: Option<&Value>,
) -> ApiResult<Vec<String>> {
    let is_pod = group.is_empty() && resource == "pods";
    let (meta, spec) = if is_pod {
        if !subresource.is_empty() && subresource != "ephemeralcontainers" {
            return Ok(vec![]);
        }
        if old.is_some_and(|old| !significant_update(old, object)) {
            return Ok(vec![]);
        }
        (&object["metadata"], &object["spec"])
    } else {
        match template(group, resource, object) {
            Some(template) if subresource.is_empty() => (&template["metadata"], &template["spec"]),
            _ => return Ok(vec![]),
        }
    };
    let Some(ns) = store.get("/namespaces", "", namespace) else {
        return Ok(vec![]);
    };
    let (policy, _) = policy(&ns["metadata"]["labels"]);
    if is_pod && let Some(found) = violations(policy.enforce, meta, spec) {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        return Err(ApiError::Forbidden {
            message: format!(
                "pods \"{name}\" is forbidden: violates PodSecurity \"{}\": {found}",
                policy.enforce
            ),
            kind: "pods".to_owned(),
            name: Some(name.to_owned()),
            group: String::new(),
        });
    }
    Ok(violations(policy.warn, meta, spec)
        .map(|found| format!("would violate PodSecurity \"{}\": {found}", policy.warn))
        .into_iter()
        .collect())
}

/// A namespace write with invalid Pod Security labels is refused (unless an update leaves the
/// same errors as before).
pub fn check_namespace(namespace: &Value, old: Option<&Value>) -> Vec<Cause> {
    let (_, errors) = policy(&namespace["metadata"]["labels"]);
    let unchanged = old.is_some_and(|old| {
        let (_, before) = policy(&old["metadata"]["labels"]);
        !before.is_empty() && before == errors
    });
    if unchanged { vec![] } else { errors }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn at(level: &str) -> LevelVersion {
        let labels = json!({format!("{PREFIX}enforce"): level});
        policy(&labels).0.enforce
    }

    #[test]
    fn a_bare_pod_breaks_restricted_in_the_real_words() {
        let spec = json!({"containers": [{"name": "nginx", "image": "nginx"}]});
        assert_eq!(
            violations(at("restricted"), &json!({}), &spec).unwrap(),
            "allowPrivilegeEscalation != false (container \"nginx\" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (container \"nginx\" must set securityContext.capabilities.drop=[\"ALL\"]), runAsNonRoot != true (pod or container \"nginx\" must set securityContext.runAsNonRoot=true), seccompProfile (pod or container \"nginx\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")"
        );
        assert_eq!(violations(at("baseline"), &json!({}), &spec), None);
        assert_eq!(violations(at("privileged"), &json!({}), &spec), None);
    }

    #[test]
    fn every_level_lists_its_checks_in_the_registrys_order() {
        let spec = json!({
            "hostNetwork": true,
            "initContainers": [{"name": "init", "image": "x"}],
            "containers": [
                {"name": "app", "image": "x", "securityContext": {"privileged": true}, "ports": [{"containerPort": 80, "hostPort": 80}]},
                {"name": "sidecar", "image": "x"}
            ],
            "volumes": [{"name": "host", "hostPath": {"path": "/"}}]
        });
        let pinned = policy(&json!({format!("{PREFIX}enforce"): "restricted", format!("{PREFIX}enforce-version"): "v1.30"})).0.enforce;
        assert_eq!(
            format!(
                "violates PodSecurity \"{pinned}\": {}",
                violations(pinned, &json!({}), &spec).unwrap()
            ),
            "violates PodSecurity \"restricted:v1.30\": host namespaces (hostNetwork=true), hostPort (container \"app\" uses hostPort 80), privileged (container \"app\" must not set securityContext.privileged=true), allowPrivilegeEscalation != false (containers \"init\", \"app\", \"sidecar\" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (containers \"init\", \"app\", \"sidecar\" must set securityContext.capabilities.drop=[\"ALL\"]), restricted volume types (volume \"host\" uses restricted volume type \"hostPath\"), runAsNonRoot != true (pod or containers \"init\", \"app\", \"sidecar\" must set securityContext.runAsNonRoot=true), seccompProfile (pod or containers \"init\", \"app\", \"sidecar\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")"
        );
        assert_eq!(
            violations(at("baseline"), &json!({}), &spec).unwrap(),
            "host namespaces (hostNetwork=true), hostPath volumes (volume \"host\"), hostPort (container \"app\" uses hostPort 80), privileged (container \"app\" must not set securityContext.privileged=true)"
        );
    }

    #[test]
    fn the_other_checks_say_what_is_forbidden() {
        let baseline = at("baseline");
        let rows = [
            (
                json!({"containers": [{"name": "a", "securityContext": {"capabilities": {"add": ["SYS_ADMIN", "CHOWN", "NET_ADMIN"]}}}]}),
                "non-default capabilities (container \"a\" must not include \"NET_ADMIN\", \"SYS_ADMIN\" in securityContext.capabilities.add)",
            ),
            (
                json!({"securityContext": {"seccompProfile": {"type": "Unconfined"}}, "containers": [{"name": "a"}]}),
                "seccompProfile (pod must not set securityContext.seccompProfile.type to \"Unconfined\")",
            ),
            (
                json!({"securityContext": {"sysctls": [{"name": "kernel.msgmax"}, {"name": "net.ipv4.tcp_syncookies"}]}, "containers": [{"name": "a"}]}),
                "forbidden sysctls (kernel.msgmax)",
            ),
            (
                json!({"hostPID": true, "hostIPC": true, "containers": [{"name": "a"}]}),
                "host namespaces (hostPID=true, hostIPC=true)",
            ),
            (
                json!({"containers": [{"name": "a", "securityContext": {"seLinuxOptions": {"type": "spc_t", "user": "u"}}}]}),
                "seLinuxOptions (container \"a\" set forbidden securityContext.seLinuxOptions: type \"spc_t\"; user may not be set)",
            ),
            (
                json!({"containers": [{"name": "a", "securityContext": {"appArmorProfile": {"type": "Unconfined"}}}]}),
                "forbidden AppArmor profile (container \"a\" must not set AppArmor profile type to \"Unconfined\")",
            ),
        ];
        for (spec, want) in rows {
            assert_eq!(
                violations(baseline, &json!({}), &spec).as_deref(),
                Some(want),
                "{spec}"
            );
        }
        let restricted = at("restricted");
        let ok = json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}});
        let spec = json!({"securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}, "runAsUser": 0},
            "containers": [{"name": "a", "securityContext": ok}, {"name": "b", "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"], "add": ["SYS_TIME"]}, "runAsNonRoot": false}}],
            "volumes": [{"name": "v", "emptyDir": {}}, {"name": "n", "nfs": {"server": "s", "path": "/"}}]});
        assert_eq!(
            violations(restricted, &json!({}), &spec).unwrap(),
            "unrestricted capabilities (container \"b\" must not include \"SYS_TIME\" in securityContext.capabilities.add), restricted volume types (volume \"n\" uses restricted volume type \"nfs\"), runAsNonRoot != true (container \"b\" must not set securityContext.runAsNonRoot=false), runAsUser=0 (pod must not set runAsUser=0)"
        );
    }

    #[test]
    fn labels_choose_the_levels_and_bad_ones_fail_closed_for_enforce_only() {
        let labels = |pairs: &[(&str, &str)]| {
            let map: serde_json::Map<String, Value> = pairs
                .iter()
                .map(|(k, v)| (format!("{PREFIX}{k}"), json!(v)))
                .collect();
            Value::Object(map)
        };
        let (p, errors) = policy(&labels(&[]));
        assert_eq!(
            (p.enforce, p.warn, p.audit),
            (PRIVILEGED, PRIVILEGED, PRIVILEGED)
        );
        assert!(errors.is_empty());
        let (p, _) = policy(&labels(&[
            ("enforce", "baseline"),
            ("enforce-version", "v1.29"),
        ]));
        assert_eq!(
            p.warn.to_string(),
            "baseline:v1.29",
            "warn follows a stricter enforce"
        );
        let (p, _) = policy(&labels(&[("enforce", "baseline"), ("warn", "restricted")]));
        assert_eq!(p.warn.to_string(), "restricted:latest");
        let (p, errors) = policy(&labels(&[
            ("enforce", "bogus"),
            ("warn", "bogus"),
            ("warn-version", "1.30"),
        ]));
        assert_eq!(p.enforce.level, Level::Restricted);
        assert_eq!(p.warn.level, Level::Privileged);
        let said: Vec<String> = errors
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        assert_eq!(
            said,
            [
                "metadata.labels[pod-security.kubernetes.io/enforce]: Invalid value: \"bogus\": must be one of privileged, baseline, restricted",
                "metadata.labels[pod-security.kubernetes.io/warn]: Invalid value: \"bogus\": must be one of privileged, baseline, restricted",
                "metadata.labels[pod-security.kubernetes.io/warn-version]: Invalid value: \"1.30\": must be \"latest\" or \"v1.x\"",
            ]
        );
        for bad in ["1.30", "v1.030", "v2.0", "V1.30", ""] {
            assert_eq!(Version::parse(bad), None, "{bad}");
        }
        assert_eq!(Version::parse("v1.0"), Some(Version::Minor(0)));
    }

    #[test]
    fn only_a_significant_pod_update_is_looked_at() {
        let pod = |image: &str, label: &str| json!({"metadata": {"labels": {"a": label}}, "spec": {"containers": [{"name": "c", "image": image}]}});
        assert!(!significant_update(&pod("x:1", "a"), &pod("x:1", "b")));
        assert!(significant_update(&pod("x:1", "a"), &pod("x:2", "a")));
    }
}
