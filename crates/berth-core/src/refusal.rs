//! What the API server's refusal of a write means: a stable reason for the Ready condition and
//! the Warning event, and the API server's own words (rule: never silent).

use std::time::Duration;

use jiff::Timestamp;

use crate::action::Action;

/// The API server refused the operator's last attempt at an action. The pure core turns it into
/// the status (phase `Error`, `Ready=False` with [`Refusal::reason`]), a Warning event while it
/// is fresh, and a growing delay before the action is tried again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// What was refused.
    pub action: Action,
    /// `Forbidden`, `QuotaExceeded`, `AdmissionDenied`, `Invalid`, ... (see [`reason_of`]).
    pub reason: String,
    /// The API server's message, as it said it.
    pub message: String,
    /// The workspace generation the action was derived from: a changed spec is tried at once.
    pub generation: Option<i64>,
    /// Refusals of this action in a row.
    pub attempts: u32,
    /// When the last refusal came.
    pub at: Timestamp,
    /// The refusal came in this very reconcile, so its Warning event is published now.
    pub fresh: bool,
}

/// The first retry waits this long; each refusal in a row doubles it, up to the requeue cap.
pub const FIRST_RETRY: Duration = Duration::from_secs(1);

impl Refusal {
    /// A refusal of `action`, following `previous` (attempts count up while the same action of
    /// the same generation keeps being refused).
    pub fn new(
        action: Action,
        code: u16,
        status_reason: &str,
        message: &str,
        generation: Option<i64>,
        previous: Option<&Refusal>,
        now: Timestamp,
    ) -> Self {
        let attempts = previous
            .filter(|p| p.action == action && p.generation == generation)
            .map_or(1, |p| p.attempts.saturating_add(1));
        Refusal {
            action,
            reason: reason_of(code, status_reason, message),
            message: message.to_owned(),
            generation,
            attempts,
            at: now,
            fresh: true,
        }
    }

    /// How long after [`Refusal::at`] the action may be tried again: 1 s, 2 s, 4 s ... `cap`.
    pub fn backoff(&self, cap: Duration) -> Duration {
        FIRST_RETRY
            .saturating_mul(1 << self.attempts.saturating_sub(1).min(20))
            .min(cap.max(FIRST_RETRY))
    }

    /// How long from `now` until the action may be tried again (zero once it may).
    pub fn retry_in(&self, now: Timestamp, cap: Duration) -> Duration {
        let since = Duration::try_from(now.duration_since(self.at)).unwrap_or_default();
        self.backoff(cap).saturating_sub(since)
    }
}

/// A stable reason for a refusal, from the API server's answer. Quota and admission refusals
/// come as `403 Forbidden`; what tells them apart is the wording the API server has used for
/// them for years (`exceeded quota`, `admission webhook "..." denied the request`,
/// `violates PodSecurity`, `ValidatingAdmissionPolicy`).
pub fn reason_of(code: u16, status_reason: &str, message: &str) -> String {
    let reason = if message.contains("exceeded quota") || message.contains("failed quota") {
        "QuotaExceeded"
    } else if (message.contains("admission webhook") && message.contains("denied the request"))
        || message.contains("violates PodSecurity")
        || message.contains("ValidatingAdmissionPolicy")
    {
        "AdmissionDenied"
    } else if !status_reason.is_empty() && status_reason.chars().all(|c| c.is_ascii_alphanumeric())
    {
        return status_reason.to_owned();
    } else {
        match code {
            400 => "BadRequest",
            403 => "Forbidden",
            404 => "NotFound",
            409 => "Conflict",
            422 => "Invalid",
            429 => "TooManyRequests",
            500..=599 => "ServiceUnavailable",
            _ => "ApiError",
        }
    };
    reason.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_come_from_the_api_answer() {
        let rows = [
            (
                403,
                "Forbidden",
                "pods \"w-ws\" is forbidden: error looking up service account default/nope: serviceaccount \"nope\" not found",
                "Forbidden",
            ),
            (
                403,
                "Forbidden",
                "pods \"w-ws\" is forbidden: exceeded quota: compute, requested: pods=1, used: pods=1, limited: pods=1",
                "QuotaExceeded",
            ),
            (
                403,
                "Forbidden",
                "pods \"w-ws\" is forbidden: failed quota: compute: must specify requests.cpu for: workspace",
                "QuotaExceeded",
            ),
            (
                400,
                "BadRequest",
                "admission webhook \"deny.example.com\" denied the request: no",
                "AdmissionDenied",
            ),
            (
                403,
                "Forbidden",
                "pods \"w-ws\" is forbidden: violates PodSecurity \"restricted:latest\": runAsNonRoot != true",
                "AdmissionDenied",
            ),
            (
                422,
                "Invalid",
                "Pod \"w-ws\" is invalid: metadata.labels: Invalid value",
                "Invalid",
            ),
            (422, "", "Pod \"w-ws\" is invalid", "Invalid"),
            (
                500,
                "",
                "etcdserver: request timed out",
                "ServiceUnavailable",
            ),
            (418, "", "teapot", "ApiError"),
            // A webhook that could not be called denied nothing: the API server's reason.
            (
                500,
                "InternalError",
                "Internal error occurred: failed calling admission webhook \"deny.example.com\": context deadline exceeded",
                "InternalError",
            ),
            // Without the API server's reason (or with one that is not a word), the code says.
            (400, "", "bad", "BadRequest"),
            (403, "", "no", "Forbidden"),
            (404, "", "gone", "NotFound"),
            (409, "", "exists", "Conflict"),
            (429, "", "slow down", "TooManyRequests"),
            (503, "Service Unavailable", "later", "ServiceUnavailable"),
        ];
        for (code, status_reason, message, want) in rows {
            assert_eq!(reason_of(code, status_reason, message), want, "{message}");
        }
    }

    #[test]
    fn attempts_count_up_for_the_same_action_and_generation_only() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let first = Refusal::new(
            Action::CreatePod,
            403,
            "Forbidden",
            "no",
            Some(1),
            None,
            now,
        );
        let second = Refusal::new(
            Action::CreatePod,
            403,
            "Forbidden",
            "no",
            Some(1),
            Some(&first),
            now,
        );
        assert_eq!((first.attempts, second.attempts), (1, 2));
        let new_spec = Refusal::new(
            Action::CreatePod,
            403,
            "Forbidden",
            "no",
            Some(2),
            Some(&second),
            now,
        );
        assert_eq!(new_spec.attempts, 1);
        let other = Refusal::new(
            Action::CreateClaim,
            403,
            "Forbidden",
            "no",
            Some(1),
            Some(&second),
            now,
        );
        assert_eq!(other.attempts, 1);
    }

    #[test]
    fn the_retry_delay_doubles_up_to_the_cap() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let mut refusal = Refusal::new(Action::CreatePod, 403, "", "no", None, None, now);
        let cap = Duration::from_secs(60);
        let mut delays = vec![];
        for attempts in 1..=8 {
            refusal.attempts = attempts;
            delays.push(refusal.backoff(cap).as_secs());
        }
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60]);
        refusal.attempts = 3;
        let later = Timestamp::from_second(1_800_000_001).unwrap();
        assert_eq!(refusal.retry_in(later, cap), Duration::from_secs(3));
        let much_later = Timestamp::from_second(1_800_000_100).unwrap();
        assert_eq!(refusal.retry_in(much_later, cap), Duration::ZERO);
    }
}
