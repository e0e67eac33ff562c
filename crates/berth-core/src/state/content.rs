//! The content family's step: a workspace with `spec.content` is Ready only once its pod's
//! agent says the content is in place; meanwhile `ContentReady` and the phase say where the
//! clone stands, in git's words, and a failure is an `Error` with a Warning event once per
//! failure series. The pod is never touched for it: the agent retries by itself.

use std::time::Duration;

use berth_api::{
    ConditionStatus, ContentStatus, Phase, Workspace,
    condition::{HasReason, HasStatus, Reason, event_reasons, find_condition, types},
};

use berth_api::content::{shown_url, without_credentials};

use super::{Builder, Notice};

/// What the content asks of the start.
pub(super) enum Hold {
    /// Wait, and look again after this long.
    Wait(Duration),
    /// Give the start up (rule C9): it failed without progress for `startTimeout`; the words.
    GiveUp(String),
}
use crate::content::{ContentCheck, ContentOutcome, remedy};

impl Builder<'_> {
    /// Says where the content of the pod `uid` stands; what the start must do while it is not
    /// in place (the caller finishes then), None when it is (or there is none). A clone that
    /// keeps failing without progress for `start_timeout` ends the start (rule C9).
    pub(super) fn content_holds(
        &mut self,
        workspace: &Workspace,
        check: Option<&ContentCheck>,
        uid: &str,
        pod_name: &str,
        (interval, start_timeout): (Duration, Duration),
    ) -> Option<Hold> {
        let git = &workspace.spec.content.as_ref()?.git;
        // Credentials an old object may still carry in its URL are never shown.
        let url = shown_url(&git.url);
        let clean = |text: &str| without_credentials(text, &git.url);
        let place = format!("{} ({url})", git.directory());
        if let Some(content) = self.status.content.clone().filter(|c| c.pod_uid == uid) {
            // In place for this pod: a changed spec changes nothing on disk, and says so.
            let cloned_by_berth = !content.url.is_empty();
            if cloned_by_berth && (content.url != url || content.reference != git.reference) {
                let at = |r: &Option<String>| {
                    r.clone().unwrap_or_else(|| "its default branch".to_owned())
                };
                let message = format!(
                    "spec.content.git now asks for {} at {}, but {} holds {} at {} (commit {}): Berth never clones over a checkout, so nothing on disk changed. Move {} away and restart the workspace to clone again",
                    url,
                    at(&git.reference),
                    content.path,
                    content.url,
                    at(&content.reference),
                    content.commit,
                    content.path
                );
                self.condition(
                    types::CONTENT_READY,
                    ConditionStatus::True,
                    Reason::ContentFound,
                    &message,
                );
            }
            return None;
        }
        let check = check.filter(|c| c.pod_uid == uid);
        let waiting = |b: &mut Self, reason: Reason, status: ConditionStatus, text: String| {
            b.condition(types::CONTENT_READY, status, reason.clone(), &text);
            b.condition(types::READY, ConditionStatus::False, reason, &text);
            b.status.ready_at = None;
            b.phase(Phase::Starting, text);
            Some(Hold::Wait(interval))
        };
        match check.map(|c| (&c.outcome, c.fresh)) {
            None | Some((ContentOutcome::Waiting, _)) => waiting(
                self,
                Reason::Unknown,
                ConditionStatus::Unknown,
                format!("Pod {pod_name} is running; waiting for its agent to clone {place}"),
            ),
            Some((ContentOutcome::Unasked { reason, message }, _)) => waiting(
                self,
                Reason::Unknown,
                ConditionStatus::Unknown,
                format!(
                    "Pod {pod_name} is running; its agent cannot be asked about cloning {place} yet ({reason}: {message})"
                ),
            ),
            Some((ContentOutcome::Cloning { progress }, _)) => waiting(
                self,
                Reason::Cloning,
                ConditionStatus::False,
                clean(progress),
            ),
            Some((
                ContentOutcome::Failed {
                    reason,
                    message,
                    retry_in,
                    failing_for,
                },
                fresh,
            )) => {
                let remedy = remedy(reason, workspace);
                let next = match retry_in {
                    Some(wait) => {
                        format!("the agent tries again in {}", crate::state::human(*wait))
                    }
                    None => {
                        "the agent tries again once the credentials or the spec change".to_owned()
                    }
                };
                let message = clean(message);
                let text = match remedy.is_empty() {
                    true => format!(
                        "Cannot clone {url} into {} ({reason}); git said: {message}; {next}. The pod is kept",
                        git.directory()
                    ),
                    false => format!(
                        "Cannot clone {url} into {} ({reason}); git said: {message}; {remedy}; {next}. The pod is kept",
                        git.directory()
                    ),
                };
                // Once per failure series: the condition did not say this reason already.
                let said = find_condition(&self.old.conditions, types::CONTENT_READY)
                    .is_some_and(|c| c.is(ConditionStatus::False) && c.has_reason(reason));
                if fresh && !said {
                    self.notices
                        .push(Notice::warning(event_reasons::CONTENT_FAILED, text.clone()));
                }
                self.condition(
                    types::CONTENT_READY,
                    ConditionStatus::False,
                    reason.clone(),
                    &text,
                );
                if *failing_for >= start_timeout {
                    return Some(Hold::GiveUp(format!(
                        "No progress for {} while cloning: {text}",
                        crate::state::human(start_timeout)
                    )));
                }
                self.condition(types::READY, ConditionStatus::False, reason.clone(), &text);
                self.status.ready_at = None;
                self.phase(Phase::Error, text);
                Some(Hold::Wait(interval))
            }
            Some((
                ContentOutcome::Ready {
                    reason,
                    url,
                    reference,
                    commit,
                    message,
                },
                _,
            )) => {
                self.status.content = Some(Box::new(ContentStatus {
                    path: git.directory(),
                    url: shown_url(url),
                    reference: reference.clone(),
                    commit: commit.clone(),
                    pod_uid: uid.to_owned(),
                }));
                let message = clean(message);
                if *reason == Reason::Cloned {
                    self.notices.push(Notice::normal(
                        event_reasons::CONTENT_READY,
                        message.clone(),
                    ));
                }
                self.condition(
                    types::CONTENT_READY,
                    ConditionStatus::True,
                    reason.clone(),
                    &message,
                );
                None
            }
        }
    }
}
