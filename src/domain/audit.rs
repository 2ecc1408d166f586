//! The audit trail's records: which operator actions are recorded, and
//! what a record says. A record names who, the action, its target and a
//! short detail; it never holds a token, a photo or a guest's prompt
//! (the detail of a settings change names the changed settings and their
//! values, none of which is a guest's).

use std::fmt;
use std::str::FromStr;

use super::roles::Operator;

/// Every operator action the trail records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuditAction {
    ExperienceCreate,
    ExperienceUpdate,
    ExperienceExport,
    TerminalCreate,
    SagaApprove,
    SagaReject,
    SagaCancel,
    SagaRetry,
    SagasBulk,
    SessionHide,
    SessionUnhide,
    SessionErase,
    BreakerOpen,
    BreakerClose,
    OperatorCreate,
    OperatorRevoke,
    PrinterAdd,
    PrinterRemove,
    PrintRequest,
    PrintCancel,
    PrintApprove,
    WebhookAdd,
    WebhookRemove,
    WebhookEnable,
    WebhookRedeliver,
    MailRetry,
    MailTemplateEdit,
}

impl AuditAction {
    pub const ALL: [AuditAction; 27] = [
        AuditAction::ExperienceCreate,
        AuditAction::ExperienceUpdate,
        AuditAction::ExperienceExport,
        AuditAction::TerminalCreate,
        AuditAction::SagaApprove,
        AuditAction::SagaReject,
        AuditAction::SagaCancel,
        AuditAction::SagaRetry,
        AuditAction::SagasBulk,
        AuditAction::SessionHide,
        AuditAction::SessionUnhide,
        AuditAction::SessionErase,
        AuditAction::BreakerOpen,
        AuditAction::BreakerClose,
        AuditAction::OperatorCreate,
        AuditAction::OperatorRevoke,
        AuditAction::PrinterAdd,
        AuditAction::PrinterRemove,
        AuditAction::PrintRequest,
        AuditAction::PrintCancel,
        AuditAction::PrintApprove,
        AuditAction::WebhookAdd,
        AuditAction::WebhookRemove,
        AuditAction::WebhookEnable,
        AuditAction::WebhookRedeliver,
        AuditAction::MailRetry,
        AuditAction::MailTemplateEdit,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AuditAction::ExperienceCreate => "experience.create",
            AuditAction::ExperienceUpdate => "experience.update",
            AuditAction::ExperienceExport => "experience.export",
            AuditAction::TerminalCreate => "terminal.create",
            AuditAction::SagaApprove => "saga.approve",
            AuditAction::SagaReject => "saga.reject",
            AuditAction::SagaCancel => "saga.cancel",
            AuditAction::SagaRetry => "saga.retry",
            AuditAction::SagasBulk => "sagas.bulk",
            AuditAction::SessionHide => "session.hide",
            AuditAction::SessionUnhide => "session.unhide",
            AuditAction::SessionErase => "session.erase",
            AuditAction::BreakerOpen => "breaker.open",
            AuditAction::BreakerClose => "breaker.close",
            AuditAction::OperatorCreate => "operator.create",
            AuditAction::OperatorRevoke => "operator.revoke",
            AuditAction::PrinterAdd => "printer.add",
            AuditAction::PrinterRemove => "printer.remove",
            AuditAction::PrintRequest => "print.request",
            AuditAction::PrintCancel => "print.cancel",
            AuditAction::PrintApprove => "print.approve",
            AuditAction::WebhookAdd => "webhook.add",
            AuditAction::WebhookRemove => "webhook.remove",
            AuditAction::WebhookEnable => "webhook.enable",
            AuditAction::WebhookRedeliver => "webhook.redeliver",
            AuditAction::MailRetry => "mail.retry",
            AuditAction::MailTemplateEdit => "mail.template",
        }
    }
}

impl fmt::Display for AuditAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AuditAction {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AuditAction::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = AuditAction::ALL.iter().map(|a| a.as_str()).collect();
                format!("action must be one of {}", names.join(", "))
            })
    }
}

/// One record to write with an action: who did what to what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    pub operator: Operator,
    pub action: AuditAction,
    /// `kind:id`, e.g. `saga:<uuid>`, `experience:<slug>`.
    pub target: String,
    /// The experience the action concerns (its id), when there is one: the
    /// experience's export carries its records.
    pub experience_id: Option<String>,
    pub detail: String,
}

impl AuditEntry {
    pub fn new(operator: &Operator, action: AuditAction, target: impl Into<String>) -> Self {
        AuditEntry {
            operator: operator.clone(),
            action,
            target: target.into(),
            experience_id: None,
            detail: String::new(),
        }
    }

    pub fn of_experience(mut self, experience_id: Option<String>) -> Self {
        self.experience_id = experience_id;
        self
    }

    pub fn detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = clip(&detail.into(), DETAIL_MAX_CHARS);
        self
    }
}

/// A record's detail is short: longer texts are cut here.
pub const DETAIL_MAX_CHARS: usize = 1_000;

/// `text` cut to `max` characters, with an ellipsis when cut.
fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// The detail of a settings change: each changed setting with its value
/// before and after (`max_in_flight: 1 -> 4; provider: a -> b`), in the
/// order given. Unchanged settings are left out; `None` when none
/// changed. Secrets are named, never shown (`gallery_pin: changed`).
pub fn changes_detail(changes: &[(&str, String, String)]) -> Option<String> {
    let parts: Vec<String> = changes
        .iter()
        .filter(|(_, before, after)| before != after)
        .map(|(name, before, after)| {
            if *name == "gallery_pin" {
                format!("{name}: changed")
            } else {
                format!("{name}: {before} -> {after}")
            }
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_action_parses_from_its_name() {
        for action in AuditAction::ALL {
            assert_eq!(action.as_str().parse::<AuditAction>(), Ok(action));
        }
        assert!("saga.delete".parse::<AuditAction>().is_err());
    }

    #[test]
    fn a_settings_detail_lists_only_what_changed() {
        let detail = changes_detail(&[
            ("max_in_flight", "1".into(), "4".into()),
            ("title", "Comics".into(), "Comics".into()),
            ("provider", "a".into(), "b".into()),
        ]);
        assert_eq!(
            detail.as_deref(),
            Some("max_in_flight: 1 -> 4; provider: a -> b")
        );
        assert_eq!(changes_detail(&[("title", "x".into(), "x".into())]), None);
    }

    #[test]
    fn a_pin_change_is_named_not_shown() {
        let detail = changes_detail(&[("gallery_pin", "(hash a)".into(), "(hash b)".into())]);
        assert_eq!(detail.as_deref(), Some("gallery_pin: changed"));
    }

    #[test]
    fn long_details_are_cut() {
        let entry = AuditEntry::new(&Operator::bootstrap(), AuditAction::SagasBulk, "sagas")
            .detail("x".repeat(5_000));
        assert_eq!(entry.detail.chars().count(), DETAIL_MAX_CHARS);
        assert!(entry.detail.ends_with('…'));
    }
}
