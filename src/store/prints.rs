//! Printers and prints: the print stations operators add, what each said
//! when last asked, and the prints of sessions' results with the lease of
//! the print actor that works on them.
//!
//! - A guest's print is taken only below the experience's
//!   `prints_per_guest`, counted in the statement that inserts it, so two
//!   presses at once cannot both pass the bound.
//! - The print actor claims open prints whose time has come (a lease with
//!   a token, [`Store::claim_prints`]); every write of a claimed print is
//!   fenced on that token ([`Store::write_print`]), so a worker that lost
//!   its lease changes nothing. The claim walks the `prints_open` index.

use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter,
    QueryOrder,
};

use serde_json::{json, Value};

use super::entities::{printers, prints};
use super::webhooks::HookEvent;
use super::{new_id, Store, StoreError, StoreResult, WriteTx};
use crate::domain::locale::Locale;
use crate::domain::policy::EpochMs;
use crate::domain::print::{job_name, PrintReason, PrintStatus};
use crate::domain::webhook::WebhookEvent;

/// A printer as an operator adds it, with what the printer said.
#[derive(Debug, Clone)]
pub struct NewPrinter {
    pub name: String,
    pub uri: String,
    pub media: String,
    pub colour: bool,
    /// The experiences' ids.
    pub experiences: Vec<String>,
    pub state: String,
    pub state_reasons: Vec<String>,
    pub formats: Vec<String>,
    pub dpi: i32,
}

/// What a printer said when asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrinterSaid {
    pub state: String,
    pub state_reasons: Vec<String>,
    pub formats: Vec<String>,
    pub dpi: i32,
}

/// A print asked for.
#[derive(Debug, Clone)]
pub struct PrintAsk {
    pub session_id: String,
    pub experience_id: String,
    /// The kept file it prints.
    pub source_key: String,
    /// `guest` or `operator:<name>`.
    pub requested_by: String,
    /// A guest's: at most this many for the session (None: no bound, an
    /// operator's).
    pub guest_bound: Option<i32>,
    pub awaiting_review: bool,
}

/// How a claimed print changes: its status, reason, printer and job, and
/// when it is looked at next.
#[derive(Debug, Clone)]
pub struct PrintChange {
    pub status: PrintStatus,
    pub reason: Option<String>,
    pub printer_id: Option<String>,
    pub ipp_job_id: Option<i32>,
    pub attempts: i32,
    pub next_attempt_at_ms: EpochMs,
    /// Keep the lease (the worker goes on with it now) or give it back.
    pub keep_lease: bool,
}

/// The comma-separated form of a list column.
pub fn list_column(items: &[String]) -> String {
    items.join(",")
}

/// A list column read back.
pub fn column_list(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

impl Store {
    pub async fn create_printer(
        &self,
        new: NewPrinter,
        now: EpochMs,
    ) -> StoreResult<printers::Model> {
        let model = printers::ActiveModel {
            id: Set(new_id()),
            name: Set(new.name),
            uri: Set(new.uri),
            media: Set(new.media),
            colour: Set(new.colour),
            experiences: Set(list_column(&new.experiences)),
            state: Set(new.state),
            state_reasons: Set(list_column(&new.state_reasons)),
            formats: Set(list_column(&new.formats)),
            dpi: Set(new.dpi),
            checked_at_ms: Set(Some(now)),
            created_at_ms: Set(now),
        };
        let tx = self.write_tx().await?;
        let created = model.insert(&*tx).await?;
        tx.commit().await?;
        Ok(created)
    }

    pub async fn printers(&self) -> StoreResult<Vec<printers::Model>> {
        Ok(printers::Entity::find()
            .order_by_asc(printers::Column::CreatedAtMs)
            .order_by_asc(printers::Column::Id)
            .all(self.db())
            .await?)
    }

    /// Removes a printer; its queued prints go to another printer of
    /// their experience (or wait for one). `NotFound` when there is none.
    pub async fn delete_printer(&self, id: &str) -> StoreResult<()> {
        let tx = self.write_tx().await?;
        let gone = printers::Entity::delete_by_id(id.to_owned())
            .exec(&*tx)
            .await?
            .rows_affected;
        if gone == 0 {
            return Err(StoreError::NotFound("printer"));
        }
        tx.commit().await?;
        Ok(())
    }

    /// Records what printer `id` said; true when it changed.
    pub async fn printer_said(
        &self,
        id: &str,
        said: &PrinterSaid,
        now: EpochMs,
    ) -> StoreResult<bool> {
        let reasons = list_column(&said.state_reasons);
        let formats = list_column(&said.formats);
        let changed = self
            .write_one(self.sql(
                "UPDATE printers SET state = $1, state_reasons = $2, formats = $3, dpi = $4, \
                 checked_at_ms = $5 WHERE id = $6 \
                 AND (state <> $1 OR state_reasons <> $2 OR formats <> $3 OR dpi <> $4)",
                vec![
                    said.state.clone().into(),
                    reasons.into(),
                    formats.into(),
                    said.dpi.into(),
                    now.into(),
                    id.into(),
                ],
            ))
            .await?;
        Ok(changed > 0)
    }

    /// Takes a print: None when the guest's bound is reached (counted in
    /// the same statement, over the session's guest prints not canceled).
    pub async fn request_print(
        &self,
        ask: PrintAsk,
        now: EpochMs,
    ) -> StoreResult<Option<prints::Model>> {
        let id = new_id();
        let bound = ask.guest_bound.unwrap_or(i32::MAX);
        let reason = ask
            .awaiting_review
            .then(|| PrintReason::AwaitingReview.stored(None));
        let rows = self
            .write_returning(self.sql(
                "INSERT INTO prints (id, session_id, experience_id, source_key, requested_by, \
                 status, reason, awaiting_review, job_name, attempts, next_attempt_at_ms, \
                 created_at_ms, updated_at_ms) \
                 SELECT $1, $2, $3, $4, $5, 'QUEUED', $6, $7, $8, 0, $9, $9, $9 \
                 WHERE (SELECT COUNT(*) FROM prints WHERE session_id = $2 \
                        AND requested_by = 'guest' AND status <> 'CANCELED') < $10 \
                 RETURNING id",
                vec![
                    id.clone().into(),
                    ask.session_id.into(),
                    ask.experience_id.into(),
                    ask.source_key.into(),
                    ask.requested_by.into(),
                    reason.into(),
                    ask.awaiting_review.into(),
                    job_name(&id).into(),
                    now.into(),
                    i64::from(bound).into(),
                ],
            ))
            .await?;
        if rows.is_empty() {
            return Ok(None);
        }
        self.print(&id).await
    }

    pub async fn print(&self, id: &str) -> StoreResult<Option<prints::Model>> {
        Ok(prints::Entity::find_by_id(id.to_owned())
            .one(self.db())
            .await?)
    }

    /// A session's prints, oldest first.
    pub async fn prints_of_session(&self, session_id: &str) -> StoreResult<Vec<prints::Model>> {
        Ok(prints::Entity::find()
            .filter(prints::Column::SessionId.eq(session_id))
            .order_by_asc(prints::Column::CreatedAtMs)
            .order_by_asc(prints::Column::Id)
            .all(self.db())
            .await?)
    }

    /// The prints not finished, oldest first (at most `limit`).
    pub async fn open_prints(&self, limit: u64) -> StoreResult<Vec<prints::Model>> {
        use sea_orm::QuerySelect;
        let open: Vec<&str> = PrintStatus::OPEN.iter().map(|s| s.as_str()).collect();
        Ok(prints::Entity::find()
            .filter(prints::Column::Status.is_in(open))
            .order_by_asc(prints::Column::CreatedAtMs)
            .limit(limit)
            .all(self.db())
            .await?)
    }

    /// Claims up to `limit` open prints whose time has come and that no
    /// live lease holds (a guest's print awaiting review waits), for
    /// `lease_ms` under `token`.
    pub async fn claim_prints(
        &self,
        token: &str,
        now: EpochMs,
        lease_ms: i64,
        limit: i64,
    ) -> StoreResult<Vec<prints::Model>> {
        // A read first (the partial index of open prints): an idle event
        // polls every second, and writes nothing while nothing is due.
        let due = self
            .db()
            .query_one_raw(self.sql(
                "SELECT 1 FROM prints WHERE status IN ('QUEUED', 'SENDING', 'PRINTING') \
                 AND next_attempt_at_ms <= $1 LIMIT 1",
                vec![now.into()],
            ))
            .await?;
        if due.is_none() {
            return Ok(Vec::new());
        }
        let ids = self
            .lease_rows(
                "prints",
                "SELECT id FROM prints \
                 WHERE status IN ('QUEUED', 'SENDING', 'PRINTING') \
                 AND next_attempt_at_ms <= $2 AND awaiting_review = FALSE \
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
        Ok(prints::Entity::find()
            .filter(prints::Column::Id.is_in(ids))
            .filter(prints::Column::LeaseToken.eq(token))
            .order_by_asc(prints::Column::NextAttemptAtMs)
            .order_by_asc(prints::Column::CreatedAtMs)
            .all(self.db())
            .await?)
    }

    /// Makes the oldest `limit` queued prints that wait for a later look
    /// due now (a printer's place came free: they need not wait out their
    /// round). One statement over the `prints_open` index; a print held by
    /// a lease or awaiting review is left as it is. The number hurried.
    pub async fn hurry_queued_prints(&self, now: EpochMs, limit: i64) -> StoreResult<u64> {
        self.write_one(self.sql(
            "UPDATE prints SET next_attempt_at_ms = $1 \
             WHERE id IN (SELECT id FROM prints \
               WHERE status IN ('QUEUED', 'SENDING', 'PRINTING') AND status = 'QUEUED' \
               AND next_attempt_at_ms > $1 AND awaiting_review = FALSE \
               AND (lease_until_ms IS NULL OR lease_until_ms < $1) \
               ORDER BY next_attempt_at_ms, created_at_ms LIMIT $2)",
            vec![now.into(), limit.into()],
        ))
        .await
    }

    /// Writes a claimed print's change, fenced on its lease: `Conflict`
    /// when the lease was lost (another worker has it now). A print that
    /// reached the paper is a `print.completed` webhook event, written
    /// with it while some endpoint takes it.
    pub async fn write_print(
        &self,
        id: &str,
        token: &str,
        change: &PrintChange,
        now: EpochMs,
        lease_ms: i64,
    ) -> StoreResult<()> {
        let lease_until = change.keep_lease.then_some(now + lease_ms);
        let update = self.sql(
            "UPDATE prints SET status = $1, reason = $2, printer_id = $3, ipp_job_id = $4, \
             attempts = $5, next_attempt_at_ms = $6, updated_at_ms = $7, \
             lease_token = CASE WHEN $8 THEN lease_token ELSE NULL END, lease_until_ms = $9 \
             WHERE id = $10 AND lease_token = $11",
            vec![
                change.status.as_str().into(),
                change.reason.clone().into(),
                change.printer_id.clone().into(),
                change.ipp_job_id.into(),
                change.attempts.into(),
                change.next_attempt_at_ms.into(),
                now.into(),
                change.keep_lease.into(),
                lease_until.into(),
                id.into(),
                token.into(),
            ],
        );
        let hooked = change.status == PrintStatus::Completed
            && self.hooks().take(WebhookEvent::PrintCompleted);
        let written = if hooked {
            let tx = self.write_tx().await?;
            let written = tx.execute_raw(update).await?.rows_affected();
            if written > 0 {
                let hook = self.print_completed_hook(&tx, id).await?;
                self.enqueue_hooks(&tx, hook.into_iter().collect(), now)
                    .await?;
            }
            tx.commit().await?;
            written
        } else {
            self.write_one(update).await?
        };
        if written == 0 {
            return Err(StoreError::Conflict(format!(
                "print {id}: the lease was lost; nothing was written"
            )));
        }
        Ok(())
    }

    /// The `print.completed` webhook event of print `id`: its session, its
    /// experience and the printer's name.
    async fn print_completed_hook(&self, tx: &WriteTx, id: &str) -> StoreResult<Option<HookEvent>> {
        let row = tx
            .query_one_raw(self.sql(
                "SELECT j.session_id, j.experience_id, p.name FROM prints j \
                 LEFT JOIN printers p ON p.id = j.printer_id WHERE j.id = $1",
                vec![id.into()],
            ))
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        Ok(Some(HookEvent {
            event: WebhookEvent::PrintCompleted,
            session_id: row.try_get_by_index(0)?,
            experience_id: row.try_get_by_index(1)?,
            data: json!({"print_id": id, "printer": row.try_get_by_index::<Option<String>>(2)?}),
        }))
    }

    /// An operator cancels a print that no printer has yet: `Conflict`
    /// when it is at a printer or finished.
    pub async fn cancel_print(&self, id: &str, now: EpochMs) -> StoreResult<prints::Model> {
        let written = self
            .write_one(self.sql(
                "UPDATE prints SET status = 'CANCELED', reason = $1, updated_at_ms = $2, \
                 lease_token = NULL, lease_until_ms = NULL \
                 WHERE id = $3 AND status = 'QUEUED' AND (lease_until_ms IS NULL OR lease_until_ms < $2)",
                vec![
                    PrintReason::CanceledByOperator.stored(None).into(),
                    now.into(),
                    id.into(),
                ],
            ))
            .await?;
        let print = self.print(id).await?.ok_or(StoreError::NotFound("print"))?;
        if written == 0 {
            return Err(StoreError::Conflict(format!(
                "print {id} is {} and can no longer be canceled",
                print.status
            )));
        }
        Ok(print)
    }

    /// An operator approves a guest's print that waits for review.
    pub async fn approve_print(&self, id: &str, now: EpochMs) -> StoreResult<prints::Model> {
        let written = self
            .write_one(self.sql(
                "UPDATE prints SET awaiting_review = FALSE, reason = NULL, updated_at_ms = $1, \
                 next_attempt_at_ms = $1 WHERE id = $2 AND awaiting_review = TRUE AND status = 'QUEUED'",
                vec![now.into(), id.into()],
            ))
            .await?;
        let print = self.print(id).await?.ok_or(StoreError::NotFound("print"))?;
        if written == 0 {
            return Err(StoreError::Conflict(format!(
                "print {id} does not wait for approval"
            )));
        }
        Ok(print)
    }
}

/// A printer as the API shows it, with its queue.
pub fn printer_json(p: &printers::Model, slugs: &[String], queued: usize) -> Value {
    json!({
        "printer_id": p.id,
        "name": p.name,
        "uri": p.uri,
        "media": p.media,
        "colour": p.colour,
        "experiences": slugs,
        "state": p.state,
        "state_reasons": column_list(&p.state_reasons),
        "formats": column_list(&p.formats),
        "dpi": p.dpi,
        "queued": queued,
        "waiting_because": crate::domain::print::holds_the_queue(&p.state, &column_list(&p.state_reasons))
            .map(|r| Locale::En.text(&r.text_key()).into_owned()),
        "checked_at": p.checked_at_ms.map(crate::clock::rfc3339),
    })
}

/// A print as a guest and an operator see it: its status and, while it
/// waits or after it failed, why, in `locale`.
pub fn print_json(p: &prints::Model, locale: Locale) -> Value {
    let reason = p
        .reason
        .as_deref()
        .and_then(PrintReason::parse_stored)
        .map(|(r, _)| locale.text(&r.text_key()).into_owned());
    json!({
        "print_id": p.id,
        "status": p.status,
        "reason": reason,
        "status_text": locale.text(&format!("print.status.{}", p.status)),
        "awaiting_review": p.awaiting_review,
        "printer_id": p.printer_id,
        "requested_by": p.requested_by,
        "created_at": crate::clock::rfc3339(p.created_at_ms),
    })
}

impl Store {
    /// The printers with their queues, and the open prints: the API's list
    /// and the operators' `print.printers` frame. A printer's queue is the
    /// open prints at it, and those of its experiences not yet at one.
    pub async fn printers_view(&self) -> StoreResult<Value> {
        let printers = self.printers().await?;
        let open = self.open_prints(200).await?;
        // The slugs, only when there is something to name.
        let experiences = if printers.is_empty() && open.is_empty() {
            Vec::new()
        } else {
            self.list_experiences().await?
        };
        let slug_of = |id: &str| {
            experiences
                .iter()
                .find(|e| e.id == id)
                .map_or_else(|| id.to_owned(), |e| e.slug.clone())
        };
        let listed: Vec<Value> = printers
            .iter()
            .map(|p| {
                let serves = column_list(&p.experiences);
                let queued = open
                    .iter()
                    .filter(|j| match &j.printer_id {
                        Some(at) => at == &p.id,
                        None => serves.is_empty() || serves.contains(&j.experience_id),
                    })
                    .count();
                let slugs: Vec<String> = serves.iter().map(|id| slug_of(id)).collect();
                printer_json(p, &slugs, queued)
            })
            .collect();
        let prints: Vec<Value> = open
            .iter()
            .map(|p| {
                let mut shown = print_json(p, Locale::En);
                shown["session_id"] = json!(p.session_id);
                shown["experience"] = json!(slug_of(&p.experience_id));
                shown
            })
            .collect();
        Ok(json!({"printers": listed, "prints": prints}))
    }
}
