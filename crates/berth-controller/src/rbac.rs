//! The RBAC of `deploy/rbac/` and the admission policy of `deploy/admission/`, embedded: `berth dev` and
//! the operator's tests create exactly what the README documents and run the operator with it.

/// The operator's namespace, service account, ClusterRole, Role and bindings.
pub const OPERATOR: &str = include_str!("../../../deploy/rbac/berth-controller.yaml");
/// `system:auth-delegator` for the `default` service account of `default`.
pub const WORKSPACE_SERVICE_ACCOUNT: &str =
    include_str!("../../../deploy/rbac/workspace-service-account.yaml");
/// The admission policy (ValidatingAdmissionPolicy, its binding, and the allow-lists it
/// reads) that checks a Workspace's author may use what its spec names.
pub const ADMISSION_POLICY: &str = include_str!("../../../deploy/admission/workspaces-policy.yaml");
/// The opt-in policy of `deploy/admission-owners/`: a workspace's spec is its creator's to
/// change (or a holder of `admin` on workspaces).
pub const OWNERS_POLICY: &str = include_str!("../../../deploy/admission-owners/owners-policy.yaml");
