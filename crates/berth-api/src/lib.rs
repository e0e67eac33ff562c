//! Berth's API: the `Workspace` and `WorkspaceKind` custom resources (`berth.dev/v1alpha1`),
//! their status and conditions, the labels Berth puts on what it creates, and the CRDs
//! generated from these types.

pub mod agent;
pub mod condition;
pub mod content;
pub mod crd;
pub mod duration;
pub mod error;
pub mod kind;
pub mod labels;
pub mod resolution;
pub mod status;
pub mod workspace;

pub use condition::{ConditionStatus, set_condition};
pub use content::{ContentStatus, GitAuth, GitContent, WorkspaceContent};
pub use duration::{DurationString, parse_duration};
pub use error::{Error, Result};
pub use kind::{KindUsage, WorkspaceKind, WorkspaceKindSpec, WorkspaceKindStatus};
pub use resolution::{KindError, KindResolution, WorkspaceOptions};
pub use status::{AdmissionRecord, AgentStatus, Phase, PodRef, WorkspaceStatus, summary};
pub use workspace::{
    DataVolume, HomeVolume, Lifecycle, MountPath, PodRecreationPolicy, PodRecreationSpec,
    PodTemplate, Reference, SecretVolume, TemplateMetadata, Workspace, WorkspacePort,
    WorkspaceSpec, WorkspaceVolumes,
};

/// The API group of every Berth resource.
pub const GROUP: &str = "berth.dev";
/// The served and stored version.
pub const VERSION: &str = "v1alpha1";
