//! What a workspace's kind and options gave it at its start (`status.resolved`), how a
//! workspace's spec reads with it, and what differs when the kind has changed since. Pure: a
//! kind and a spec in, a record, a spec and a list of differences out.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::EnvVar;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    HomeVolume, Lifecycle, PodTemplate, WorkspaceSpec, WorkspaceVolumes,
    kind::{
        ImageConfig, KindHome, KindLifecycle, KindOption, KindProbes, KindSecurityContext,
        OptionList, PodConfig, WorkspaceKindSpec,
    },
};

/// The options a workspace picks from its kind; an absent one is the kind's default.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceOptions {
    /// The id of one of the kind's image options (`kubectl get wsk KIND -o yaml` lists them);
    /// the kind's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub image: Option<String>,
    /// The id of one of the kind's pod options; the kind's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub pod: Option<String>,
}

/// What the workspace's kind and options gave it when it last started from stopped. Its pods
/// are built from this record, whatever the kind says since, until the workspace next starts
/// from stopped: a kind's change never restarts a running workspace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KindResolution {
    /// The kind's name.
    pub kind: String,
    /// The image option in force.
    pub image: ResolvedOption<ImageConfig>,
    /// The pod option in force.
    pub pod: ResolvedOption<PodConfig>,
    /// The kind's home volume, as it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home: Option<KindHome>,
    /// The kind's environment variables, as they were.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::workspace::env_schema")]
    pub env: Vec<EnvVar>,
    /// The kind's probes, as they were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probes: Option<Box<KindProbes>>,
    /// The kind's security context, as it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<Box<KindSecurityContext>>,
    /// The kind's service account, as it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// The kind's lifecycle defaults, as they were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<KindLifecycle>,
}

/// One option of a kind as a workspace got it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedOption<T: JsonSchema> {
    /// What the workspace asked for (`spec.options`); absent when it took the kind's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested: Option<String>,
    /// The option in force: the one asked for (or the default), or where it redirected.
    pub id: String,
    /// The redirect followed from the option asked for, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirected_from: Option<String>,
    /// What the option set.
    pub spec: T,
}

/// Why a workspace's kind and options give no record.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KindError {
    /// The kind does not exist.
    #[error(
        "WorkspaceKind {kind:?} does not exist (kubectl get workspacekinds lists those that do)"
    )]
    KindNotFound { kind: String },
    /// The kind has no option of the id asked for.
    #[error(
        "spec.options.{list}: WorkspaceKind {kind:?} has no {list} option {id:?}; its {list} options are: {valid}"
    )]
    OptionNotFound {
        kind: String,
        list: &'static str,
        id: String,
        valid: String,
    },
}

impl KindError {
    /// The condition reason that says it.
    pub fn reason(&self) -> &'static str {
        match self {
            KindError::KindNotFound { .. } => "KindNotFound",
            KindError::OptionNotFound { .. } => "OptionNotFound",
        }
    }
}

/// The option `requested` (or the list's default) names, following its redirect.
fn pick<T: JsonSchema + Clone>(
    kind: &str,
    list_name: &'static str,
    list: &OptionList<T>,
    requested: Option<&String>,
) -> Result<ResolvedOption<T>, KindError> {
    let find = |id: &str| list.values.iter().find(|v| v.id == id);
    let missing = |id: &str| KindError::OptionNotFound {
        kind: kind.to_owned(),
        list: list_name,
        id: id.to_owned(),
        valid: list
            .values
            .iter()
            .map(|v| v.id.as_str())
            .collect::<Vec<_>>()
            .join(", "),
    };
    let asked = requested.map_or(list.default.as_str(), String::as_str);
    let first: &KindOption<T> = find(asked).ok_or_else(|| missing(asked))?;
    // One hop: the API refuses chains and cycles.
    let (option, redirected_from) = match &first.redirect {
        Some(redirect) => (
            find(&redirect.to).ok_or_else(|| missing(&redirect.to))?,
            Some(first.id.clone()),
        ),
        None => (first, None),
    };
    Ok(ResolvedOption {
        requested: requested.cloned(),
        id: option.id.clone(),
        redirected_from,
        spec: option.spec.clone(),
    })
}

/// What kind `name` (`None`: it does not exist) and the picked options give a workspace now.
pub fn resolve(
    name: &str,
    kind: Option<&WorkspaceKindSpec>,
    options: Option<&WorkspaceOptions>,
) -> Result<KindResolution, KindError> {
    let kind = kind.ok_or_else(|| KindError::KindNotFound {
        kind: name.to_owned(),
    })?;
    let options = options.cloned().unwrap_or_default();
    Ok(KindResolution {
        kind: name.to_owned(),
        image: pick(name, "image", &kind.options.image, options.image.as_ref())?,
        pod: pick(name, "pod", &kind.options.pod, options.pod.as_ref())?,
        home: kind.home.clone(),
        env: kind.env.clone(),
        probes: kind.probes.clone(),
        security_context: kind.security_context.clone(),
        service_account_name: kind.service_account_name.clone(),
        lifecycle: kind.lifecycle.clone(),
    })
}

impl KindResolution {
    /// Whether the record answers what `spec` asks now: the same kind and options (a
    /// workspace that picks another option asks for a new shape).
    pub fn answers(&self, spec: &WorkspaceSpec) -> bool {
        let options = spec.options.clone().unwrap_or_default();
        spec.kind.as_deref() == Some(self.kind.as_str())
            && self.image.requested == options.image
            && self.pod.requested == options.pod
    }

    /// The spec as the workspace's pod, claim and service are built from it: the author's
    /// spec with what the kind gives (image, ports, resources, scheduling, home, env, service
    /// account, lifecycle). The author's own ports, env and home win over the kind's of the
    /// same name; an idle timeout is at most the kind's maximum.
    pub fn apply(&self, spec: &WorkspaceSpec) -> WorkspaceSpec {
        let mut out = spec.clone();
        out.image = self.image.spec.image.clone();
        if out.command.is_none() {
            out.command = self.image.spec.command.clone();
        }
        let own_ports: BTreeSet<(&str, i32)> = spec
            .ports
            .iter()
            .map(|p| (p.name.as_str(), p.port))
            .collect();
        out.ports = self
            .image
            .spec
            .ports
            .iter()
            .filter(|p| {
                !own_ports
                    .iter()
                    .any(|(n, n_port)| *n == p.name || *n_port == p.port)
            })
            .cloned()
            .chain(spec.ports.iter().cloned())
            .collect();
        out.resources = self.pod.spec.resources.clone().map(Box::new);
        let mut template = spec.pod_template.clone().unwrap_or_default();
        template.node_selector = self.pod.spec.node_selector.clone();
        template.tolerations = self.pod.spec.tolerations.clone();
        template.affinity = self.pod.spec.affinity.clone();
        if let Some(home) = &self.home {
            let volumes = template
                .volumes
                .get_or_insert_with(WorkspaceVolumes::default);
            volumes.home.get_or_insert_with(|| HomeVolume {
                size: home.size.clone(),
                storage_class_name: home.storage_class_name.clone(),
                mount_path: home.mount_path.clone(),
            });
        }
        out.pod_template = (*template != PodTemplate::default()).then_some(template);
        out.env = self
            .env
            .iter()
            .filter(|e| !spec.env.iter().any(|own| own.name == e.name))
            .cloned()
            .chain(spec.env.iter().cloned())
            .collect();
        out.service_account_name = self.service_account_name.clone();
        out.lifecycle = self.lifecycle(spec.lifecycle.as_deref()).map(Box::new);
        out
    }

    /// The author's lifecycle over the kind's defaults, the idle timeout bounded by the kind's
    /// maximum.
    fn lifecycle(&self, own: Option<&Lifecycle>) -> Option<Lifecycle> {
        let kind = self.lifecycle.clone().unwrap_or_default();
        let own = own.cloned().unwrap_or_default();
        let mut idle = own.idle_timeout.or(kind.idle_timeout);
        if let Some(max) = kind.max_idle_timeout {
            let longer = match (&idle, max.to_duration()) {
                (Some(asked), Ok(max)) => asked.to_duration().map_or(true, |a| a > max),
                (None, _) => true,
                (Some(_), Err(_)) => false,
            };
            if longer {
                idle = Some(max);
            }
        }
        let lifecycle = Lifecycle {
            start_timeout: own.start_timeout.or(kind.start_timeout),
            pod_recreation: own.pod_recreation.or(kind.pod_recreation),
            idle_timeout: idle,
        };
        (lifecycle != Lifecycle::default()).then_some(lifecycle)
    }

    /// What differs between this record and what the kind gives now, field by field, in the
    /// words `UpdateAvailable` says it: `image: devbox:1.4 -> devbox:1.5 (option py311
    /// redirects to py312: "3.11 is end of life")`. Empty when nothing does.
    pub fn differences(&self, now: &KindResolution, kind: &WorkspaceKindSpec) -> Vec<String> {
        let mut out = vec![];
        let image_why = why(&self.image, &now.image, &kind.options.image);
        let pod_why = why(&self.pod, &now.pod, &kind.options.pod);
        let (was, is) = (&self.image.spec, &now.image.spec);
        let before = out.len();
        differ(&mut out, "image", &was.image, &is.image, &image_why);
        differ(
            &mut out,
            "imagePullPolicy",
            &was.image_pull_policy,
            &is.image_pull_policy,
            &image_why,
        );
        differ(&mut out, "ports", &was.ports, &is.ports, &image_why);
        differ(&mut out, "command", &was.command, &is.command, &image_why);
        if out.len() == before {
            option_moved(&mut out, "image", &self.image, &now.image, &image_why);
        }
        let (was, is) = (&self.pod.spec, &now.pod.spec);
        let before = out.len();
        differ(
            &mut out,
            "resources",
            &was.resources,
            &is.resources,
            &pod_why,
        );
        differ(
            &mut out,
            "nodeSelector",
            &was.node_selector,
            &is.node_selector,
            &pod_why,
        );
        differ(
            &mut out,
            "tolerations",
            &was.tolerations,
            &is.tolerations,
            &pod_why,
        );
        differ(&mut out, "affinity", &was.affinity, &is.affinity, &pod_why);
        if out.len() == before {
            option_moved(&mut out, "pod", &self.pod, &now.pod, &pod_why);
        }
        differ(&mut out, "home", &self.home, &now.home, "");
        differ(&mut out, "env", &self.env, &now.env, "");
        differ(&mut out, "probes", &self.probes, &now.probes, "");
        differ(
            &mut out,
            "securityContext",
            &self.security_context,
            &now.security_context,
            "",
        );
        differ(
            &mut out,
            "serviceAccountName",
            &self.service_account_name,
            &now.service_account_name,
            "",
        );
        differ(&mut out, "lifecycle", &self.lifecycle, &now.lifecycle, "");
        out
    }
}

/// Why the option in force moved, for the differences' lines: a redirect (with its message)
/// or a new default.
fn why<T: JsonSchema>(
    was: &ResolvedOption<T>,
    now: &ResolvedOption<T>,
    list: &OptionList<T>,
) -> String {
    if was.id == now.id {
        return String::new();
    }
    match &now.redirected_from {
        Some(from) => {
            let message = list
                .values
                .iter()
                .find(|v| v.id == *from)
                .and_then(|v| v.redirect.as_ref())
                .map(|r| r.message.as_str())
                .unwrap_or_default();
            match message {
                "" => format!(" (option {from} redirects to {})", now.id),
                m => format!(" (option {from} redirects to {}: {m:?})", now.id),
            }
        }
        None => format!(" (the kind's default is now {})", now.id),
    }
}

/// A line for an option that moved though nothing it sets differs (a new id, the same spec).
fn option_moved<T: JsonSchema>(
    out: &mut Vec<String>,
    list: &str,
    was: &ResolvedOption<T>,
    now: &ResolvedOption<T>,
    why: &str,
) {
    if was.id != now.id {
        out.push(format!("{list} option: {} -> {}{why}", was.id, now.id));
    }
}

/// A line for a field that differs: `field: was -> now` and why.
fn differ<T: Serialize + PartialEq>(
    out: &mut Vec<String>,
    field: &str,
    was: &T,
    now: &T,
    why: &str,
) {
    if was != now {
        out.push(format!("{field}: {} -> {}{why}", shown(was), shown(now)));
    }
}

/// A value as a person reads it in one line: text as it is, anything else as compact JSON,
/// nothing as `none`.
fn shown<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value).unwrap_or_default() {
        serde_json::Value::Null => "none".to_owned(),
        serde_json::Value::Array(a) if a.is_empty() => "none".to_owned(),
        serde_json::Value::Object(o) if o.is_empty() => "none".to_owned(),
        serde_json::Value::String(s) => s,
        other => other.to_string(),
    }
}

/// The port of `workspace` named `wanted` (or with that number; None: its first), among the
/// ports in force: its own and its kind's, as the operator recorded the kind
/// (`status.resolved`); else what it has, in words.
pub fn port_in_force(
    workspace: &crate::Workspace,
    wanted: Option<&str>,
) -> Result<crate::WorkspacePort, String> {
    use kube::ResourceExt;
    let ports = match workspace.status.as_ref().and_then(|s| s.resolved.as_ref()) {
        Some(record) => record.apply(&workspace.spec).ports,
        None => workspace.spec.ports.clone(),
    };
    let name = format!(
        "{}/{}",
        workspace.namespace().unwrap_or_default(),
        workspace.name_any()
    );
    let found = match wanted {
        Some(wanted) => ports
            .iter()
            .find(|p| p.name == wanted || p.port.to_string() == wanted),
        None => ports.first(),
    };
    found.cloned().ok_or_else(|| {
        let names: Vec<String> = ports
            .iter()
            .map(|p| format!("{} ({})", p.name, p.port))
            .collect();
        match wanted {
            Some(wanted) => format!(
                "workspace {name} has no port {wanted}; its ports: {}",
                if names.is_empty() {
                    "none".to_owned()
                } else {
                    names.join(", ")
                }
            ),
            None => format!("workspace {name} declares no port to open"),
        }
    })
}

#[cfg(test)]
mod port_tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_port_is_found_among_the_workspaces_own_and_its_kinds_by_name_or_number() {
        let ws: crate::Workspace = serde_json::from_value(json!({
            "apiVersion": "berth.dev/v1alpha1", "kind": "Workspace",
            "metadata": {"name": "py", "namespace": "team"},
            "spec": {"kind": "python", "ports": [{"name": "api", "port": 9000}]},
            "status": {"resolved": {
                "kind": "python",
                "image": {"id": "py311", "spec": {"image": "devbox:1", "ports": [{"name": "http", "port": 8080}]}},
                "pod": {"id": "small", "spec": {}}
            }}
        }))
        .unwrap();
        assert_eq!(
            port_in_force(&ws, None).unwrap().name,
            "http",
            "the kind's come first"
        );
        assert_eq!(port_in_force(&ws, Some("9000")).unwrap().name, "api");
        assert_eq!(port_in_force(&ws, Some("http")).unwrap().port, 8080);
        assert_eq!(
            port_in_force(&ws, Some("ssh")).unwrap_err(),
            "workspace team/py has no port ssh; its ports: http (8080), api (9000)"
        );
    }

    #[test]
    fn an_image_options_command_runs_unless_the_workspace_gives_its_own() {
        let record: KindResolution = serde_json::from_value(json!({
            "kind": "ide",
            "image": {"id": "editor", "spec": {"image": "devbox:1", "command": ["serve", "--edit"]}},
            "pod": {"id": "small", "spec": {}}
        }))
        .unwrap();
        let spec = |own: serde_json::Value| -> crate::WorkspaceSpec {
            serde_json::from_value(own).unwrap()
        };
        assert_eq!(
            record.apply(&spec(json!({"kind": "ide"}))).command,
            Some(vec!["serve".to_owned(), "--edit".to_owned()])
        );
        assert_eq!(
            record
                .apply(&spec(json!({"kind": "ide", "command": ["sleep", "1d"]})))
                .command,
            Some(vec!["sleep".to_owned(), "1d".to_owned()])
        );
    }
}
