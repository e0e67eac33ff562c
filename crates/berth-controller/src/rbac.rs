//! The RBAC of `deploy/rbac/` and the webhook of `deploy/webhook/`, embedded: `berth dev` and
//! the operator's tests create exactly what the README documents and run the operator with it.

/// The operator's namespace, service account, ClusterRole, Role and bindings.
pub const OPERATOR: &str = include_str!("../../../deploy/rbac/berth-controller.yaml");
/// `system:auth-delegator` for the `default` service account of `default`.
pub const WORKSPACE_SERVICE_ACCOUNT: &str =
    include_str!("../../../deploy/rbac/workspace-service-account.yaml");
/// The admission webhook's service account, RBAC, Service and ValidatingWebhookConfiguration.
pub const WEBHOOK: &str = include_str!("../../../deploy/webhook/berth-webhook.yaml");
