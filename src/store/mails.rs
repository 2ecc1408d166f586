//! Mail to guests: the outbox of mails, and the operators' templates.
//!
//! - **Asked once, bounded in the statement that takes it**
//!   ([`Store::request_mail`]): one insert that counts the session's mails
//!   (`mails_per_guest`) and the address's mails of the last hour (by its
//!   keyed digest, never the address), so two requests at once cannot
//!   both pass a bound.
//! - **Sent by a lease** ([`Store::claim_mails`]): a claimed mail is held
//!   under the sender's token, so two instances never send it at once, and
//!   its outcome is written fenced on that token
//!   ([`Store::mail_answered`]), with its `email.sent` or `email.failed`
//!   webhook event in the same transaction. A mail whose sender died is
//!   claimed again when its lease ends, and sent again with the same
//!   `Message-ID`.
//! - **The address is personal data**: the sender writes SMTP answers
//!   with it masked, and forgetting the session blanks it
//!   (`Store::forget_session`).

use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter,
    QueryOrder, QuerySelect,
};
use serde_json::{json, Value as Json};

use super::entities::{experiences, mail_templates, mails};
use super::webhooks::HookEvent;
use super::{new_id, Store, StoreError, StoreResult};
use crate::domain::mail::{masked, MailStatus};
use crate::domain::policy::EpochMs;
use crate::domain::webhook::WebhookEvent;

/// The window of the per-address bound.
pub const ADDRESS_WINDOW_MS: i64 = 3_600_000;

/// A guest's request for mail, checked.
#[derive(Debug, Clone)]
pub struct MailAsk {
    pub session_id: String,
    pub experience_id: String,
    pub address: String,
    /// [`crate::domain::mail::address_key`] of the address.
    pub address_key: String,
    pub locale: String,
    /// The version of the consent texts the guest agreed to.
    pub consent_notice: String,
    pub marketing: bool,
    /// The experience's `mails_per_guest`.
    pub per_session: i32,
    /// Mails to one address in [`ADDRESS_WINDOW_MS`].
    pub per_address: u32,
}

/// Why a mail was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MailRefused {
    /// The session has its `mails_per_guest` mails.
    SessionBound(i32),
    /// The address was mailed its share in the last hour.
    AddressBound,
}

/// How one attempt ended, as the sender writes it.
#[derive(Debug, Clone)]
pub struct MailOutcome {
    /// Why it was not sent (the address masked); None: sent.
    pub error: Option<String>,
    /// When to try again (None: sent, or failed for good).
    pub retry_at_ms: Option<EpochMs>,
}

impl Store {
    /// Takes a guest's mail, or says which bound refused it.
    pub async fn request_mail(
        &self,
        ask: MailAsk,
        now: EpochMs,
    ) -> StoreResult<Result<mails::Model, MailRefused>> {
        let id = new_id();
        let rows = self
            .write_returning(self.sql(
                "INSERT INTO mails (id, session_id, experience_id, address, address_key, locale, \
                 consent_notice, consent_at_ms, marketing, marketing_at_ms, status, attempts, \
                 next_attempt_at_ms, created_at_ms, updated_at_ms) \
                 SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, \
                 CASE WHEN $9 THEN $8 ELSE NULL END, 'QUEUED', 0, $8, $8, $8 \
                 WHERE (SELECT COUNT(*) FROM mails WHERE session_id = $2 \
                        AND status <> 'CANCELED') < $10 \
                 AND (SELECT COUNT(*) FROM mails WHERE address_key = $5 \
                        AND created_at_ms > $11) < $12 \
                 RETURNING id",
                vec![
                    id.clone().into(),
                    ask.session_id.clone().into(),
                    ask.experience_id.into(),
                    ask.address.into(),
                    ask.address_key.into(),
                    ask.locale.into(),
                    ask.consent_notice.into(),
                    now.into(),
                    ask.marketing.into(),
                    i64::from(ask.per_session).into(),
                    (now - ADDRESS_WINDOW_MS).into(),
                    i64::from(ask.per_address).into(),
                ],
            ))
            .await?;
        if rows.is_empty() {
            let asked = self.mails_of_session(&ask.session_id).await?;
            let counted = asked
                .iter()
                .filter(|m| m.status != MailStatus::Canceled.as_str())
                .count();
            return Ok(Err(if counted >= ask.per_session.max(0) as usize {
                MailRefused::SessionBound(ask.per_session)
            } else {
                MailRefused::AddressBound
            }));
        }
        self.mail(&id)
            .await?
            .map(Ok)
            .ok_or(StoreError::NotFound("mail"))
    }

    pub async fn mail(&self, id: &str) -> StoreResult<Option<mails::Model>> {
        Ok(mails::Entity::find_by_id(id.to_owned())
            .one(self.db())
            .await?)
    }

    /// A session's mails, oldest first.
    pub async fn mails_of_session(&self, session_id: &str) -> StoreResult<Vec<mails::Model>> {
        Ok(mails::Entity::find()
            .filter(mails::Column::SessionId.eq(session_id))
            .order_by_asc(mails::Column::CreatedAtMs)
            .order_by_asc(mails::Column::Id)
            .all(self.db())
            .await?)
    }

    /// When the next queued mail is due (None: none is queued).
    pub async fn next_mail_due(&self) -> StoreResult<Option<EpochMs>> {
        let row = self
            .db()
            .query_one_raw(self.sql(
                "SELECT MIN(next_attempt_at_ms) FROM mails WHERE status = 'QUEUED'",
                vec![],
            ))
            .await?;
        Ok(row.and_then(|r| r.try_get_by_index::<Option<i64>>(0).ok().flatten()))
    }

    /// Claims up to `limit` queued mails that are due and that no live
    /// lease holds, oldest due first, for `lease_ms` under `token`.
    pub async fn claim_mails(
        &self,
        token: &str,
        now: EpochMs,
        lease_ms: i64,
        limit: i64,
    ) -> StoreResult<Vec<mails::Model>> {
        let ids = self
            .lease_rows(
                "mails",
                "SELECT id FROM mails WHERE status = 'QUEUED' AND next_attempt_at_ms <= $2 \
                 AND (lease_until_ms IS NULL OR lease_until_ms < $2) \
                 ORDER BY next_attempt_at_ms, created_at_ms LIMIT $4",
                (token, now, lease_ms),
                limit,
                Vec::new(),
            )
            .await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        Ok(mails::Entity::find()
            .filter(mails::Column::Id.is_in(ids))
            .filter(mails::Column::LeaseToken.eq(token))
            .order_by_asc(mails::Column::NextAttemptAtMs)
            .order_by_asc(mails::Column::CreatedAtMs)
            .all(self.db())
            .await?)
    }

    /// Writes a claimed mail's attempt, fenced on its lease, with its
    /// webhook event when it ended (`email.sent`, `email.failed`).
    /// `Conflict` when the lease was lost (another instance has it, or the
    /// session was forgotten meanwhile).
    pub async fn mail_answered(
        &self,
        mail: &mails::Model,
        token: &str,
        outcome: &MailOutcome,
        now: EpochMs,
    ) -> StoreResult<MailStatus> {
        let status = match (&outcome.error, outcome.retry_at_ms) {
            (None, _) => MailStatus::Sent,
            (Some(_), Some(_)) => MailStatus::Queued,
            (Some(_), None) => MailStatus::Failed,
        };
        let tx = self.write_tx().await?;
        let written = tx
            .execute_raw(self.sql(
                "UPDATE mails SET status = $1, attempts = attempts + 1, last_error = $2, \
                 next_attempt_at_ms = $3, updated_at_ms = $4, \
                 sent_at_ms = CASE WHEN $5 THEN $4 ELSE sent_at_ms END, \
                 lease_token = NULL, lease_until_ms = NULL \
                 WHERE id = $6 AND lease_token = $7",
                vec![
                    status.as_str().into(),
                    outcome.error.clone().into(),
                    outcome.retry_at_ms.unwrap_or(mail.next_attempt_at_ms).into(),
                    now.into(),
                    (status == MailStatus::Sent).into(),
                    mail.id.clone().into(),
                    token.into(),
                ],
            ))
            .await?
            .rows_affected();
        if written == 0 {
            return Err(StoreError::Conflict(format!(
                "mail {}: the lease was lost; nothing was written",
                mail.id
            )));
        }
        let event = match status {
            MailStatus::Sent => Some(HookEvent {
                event: WebhookEvent::EmailSent,
                session_id: mail.session_id.clone(),
                experience_id: mail.experience_id.clone(),
                data: json!({"email_id": mail.id, "marketing": mail.marketing}),
            }),
            MailStatus::Failed => Some(HookEvent {
                event: WebhookEvent::EmailFailed,
                session_id: mail.session_id.clone(),
                experience_id: mail.experience_id.clone(),
                data: json!({"email_id": mail.id, "reason": outcome.error}),
            }),
            _ => None,
        };
        self.enqueue_hooks(&tx, event.into_iter().collect(), now)
            .await?;
        tx.commit().await?;
        Ok(status)
    }

    /// The newest mails (of `status` when given), at most `limit`, each
    /// with its experience's slug.
    pub async fn mails_page(
        &self,
        status: Option<MailStatus>,
        limit: u64,
    ) -> StoreResult<Vec<(mails::Model, String)>> {
        let mut query = mails::Entity::find();
        if let Some(status) = status {
            query = query.filter(mails::Column::Status.eq(status.as_str()));
        }
        let page = query
            .order_by_desc(mails::Column::CreatedAtMs)
            .order_by_desc(mails::Column::Id)
            .limit(limit)
            .all(self.db())
            .await?;
        let mut ids: Vec<String> = page.iter().map(|m| m.experience_id.clone()).collect();
        ids.sort_unstable();
        ids.dedup();
        let slugs: std::collections::HashMap<String, String> = experiences::Entity::find()
            .filter(experiences::Column::Id.is_in(ids))
            .all(self.db())
            .await?
            .into_iter()
            .map(|e| (e.id, e.slug))
            .collect();
        Ok(page
            .into_iter()
            .map(|m| {
                let slug = slugs.get(&m.experience_id).cloned().unwrap_or_default();
                (m, slug)
            })
            .collect())
    }

    /// Queues failed mails again, due now (an operator's "retry"): those
    /// of `ids` that failed and still have their address. The ones queued.
    pub async fn retry_mails(&self, ids: &[String], now: EpochMs) -> StoreResult<Vec<String>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let list: Vec<String> = (0..ids.len()).map(|i| format!("${}", i + 2)).collect();
        let mut values: Vec<sea_orm::Value> = vec![now.into()];
        values.extend(ids.iter().map(|id| sea_orm::Value::from(id.clone())));
        let rows = self
            .write_returning(self.sql(
                &format!(
                    "UPDATE mails SET status = 'QUEUED', next_attempt_at_ms = $1, \
                     updated_at_ms = $1, attempts = 0 \
                     WHERE id IN ({}) AND status = 'FAILED' AND address IS NOT NULL RETURNING id",
                    list.join(", ")
                ),
                values,
            ))
            .await?;
        Ok(rows
            .iter()
            .map(|r| r.try_get_by_index::<String>(0))
            .collect::<Result<_, _>>()?)
    }

    /// The operators' template of `locale`, if one was saved.
    pub async fn mail_template(&self, locale: &str) -> StoreResult<Option<mail_templates::Model>> {
        Ok(mail_templates::Entity::find_by_id(locale.to_owned())
            .one(self.db())
            .await?)
    }

    /// Saves the template of `locale` (replacing the one before).
    pub async fn put_mail_template(
        &self,
        locale: &str,
        subject: &str,
        body: &str,
        now: EpochMs,
    ) -> StoreResult<()> {
        let tx = self.write_tx().await?;
        tx.execute_raw(self.sql(
            "DELETE FROM mail_templates WHERE locale = $1",
            vec![locale.into()],
        ))
        .await?;
        mail_templates::ActiveModel {
            locale: Set(locale.to_owned()),
            subject: Set(subject.to_owned()),
            body: Set(body.to_owned()),
            updated_at_ms: Set(now),
        }
        .insert(&*tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Removes the template of `locale` (the built-in one is used again).
    pub async fn delete_mail_template(&self, locale: &str) -> StoreResult<()> {
        self.write_one(self.sql(
            "DELETE FROM mail_templates WHERE locale = $1",
            vec![locale.into()],
        ))
        .await
        .map(drop)
    }
}

/// What forgetting a session does to its mails: the address and its
/// digest blanked (with the last answer, which may quote it), a mail not
/// yet sent canceled, and the stored answers to its mail requests (their
/// request digests cover the address) removed.
pub(crate) const FORGET_MAILS: [&str; 2] = [
    "UPDATE mails SET address = NULL, address_key = NULL, \
     last_error = NULL, lease_token = NULL, lease_until_ms = NULL, \
     status = CASE WHEN status = 'SENT' THEN 'SENT' ELSE 'CANCELED' END \
     WHERE session_id = $1",
    "DELETE FROM idempotency_records WHERE scope = 'email:' || $1",
];

/// A mail as the guest sees it: its id, its status and the address masked.
pub fn guest_mail_json(m: &mails::Model) -> Json {
    json!({
        "email_id": m.id,
        "status": m.status,
        "address": m.address.as_deref().map(masked),
    })
}

/// A mail as /ops's log shows it (the address masked).
pub fn mail_json(m: &mails::Model, slug: &str, now: EpochMs) -> Json {
    let sending = m.status == MailStatus::Queued.as_str()
        && m.lease_until_ms.is_some_and(|until| until >= now);
    json!({
        "email_id": m.id,
        "session_id": m.session_id,
        "experience": slug,
        "address": m.address.as_deref().map(masked),
        "locale": m.locale,
        "status": if sending { "SENDING" } else { m.status.as_str() },
        "attempts": m.attempts,
        "last_error": m.last_error,
        "marketing": m.marketing,
        "consent_notice": m.consent_notice,
        "consent_at": crate::clock::rfc3339(m.consent_at_ms),
        "created_at": crate::clock::rfc3339(m.created_at_ms),
        "sent_at": m.sent_at_ms.map(crate::clock::rfc3339),
        "next_attempt_at": (m.status == MailStatus::Queued.as_str()).then(|| crate::clock::rfc3339(m.next_attempt_at_ms)),
    })
}
