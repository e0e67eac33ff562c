//! What the pure core asks the reconcile loop to do through the API, and how a person and an
//! event name each action. Its own module, so what decides and what reports both use it.

use berth_api::condition::event_reasons;

use crate::pod;

/// Something to do through the API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    CreateClaim,
    /// Grow the home claim's storage request to the spec's `home.size` (the claim with this
    /// UID: a precondition, so a claim of the same name made since is never changed).
    ResizeClaim {
        uid: String,
    },
    CreateService,
    /// Set the ports and selector of the workspace's own service (this UID: a precondition,
    /// so a service of the same name made since is never changed).
    UpdateService {
        uid: String,
    },
    /// Delete the workspace's own service (this UID: a precondition).
    DeleteService {
        uid: String,
    },
    CreatePod,
    /// Delete the pod with this UID (a precondition, so a newer pod is never hit).
    DeletePod {
        uid: String,
    },
    /// Delete the pod at once (grace 0): its node is gone and will never stop it.
    ForceDeletePod {
        uid: String,
    },
    /// Stop an idle workspace: set its `spec.paused`, if its spec is still the one decided on.
    Cull,
}

impl Action {
    /// What the action does, as a person would say it: `create pod w-ws`.
    pub fn describe(&self, workspace: &str) -> String {
        match self {
            Action::CreateClaim => format!("create claim {}", pod::claim_name(workspace)),
            Action::ResizeClaim { .. } => format!("grow claim {}", pod::claim_name(workspace)),
            Action::CreateService => format!("create service {}", pod::service_name(workspace)),
            Action::UpdateService { .. } => {
                format!("update service {}", pod::service_name(workspace))
            }
            Action::DeleteService { .. } => {
                format!("delete service {}", pod::service_name(workspace))
            }
            Action::CreatePod => format!("create pod {}", pod::pod_name(workspace)),
            Action::DeletePod { .. } | Action::ForceDeletePod { .. } => {
                format!("delete pod {}", pod::pod_name(workspace))
            }
            Action::Cull => format!("pause idle workspace {workspace}"),
        }
    }

    /// The reason of the Warning event published when the API server refuses the action, as
    /// Kubernetes' own controllers name it.
    pub fn refused_reason(&self) -> &'static str {
        match self {
            Action::CreateClaim | Action::CreateService | Action::CreatePod => {
                event_reasons::FAILED_CREATE
            }
            Action::UpdateService { .. } | Action::ResizeClaim { .. } | Action::Cull => {
                event_reasons::FAILED_UPDATE
            }
            Action::DeleteService { .. }
            | Action::DeletePod { .. }
            | Action::ForceDeletePod { .. } => event_reasons::FAILED_DELETE,
        }
    }
}
