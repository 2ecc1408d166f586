//! Participant sessions and the submission transaction that turns a session
//! into a runnable saga.

use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter,
};

use super::entities::{sagas, sessions};
use super::outbox::aborted_payload;
use super::{new_id, Store, StoreError, StoreResult, WriteTx};
use crate::domain::guests::share_id;
use crate::domain::keys::token_hash;
use crate::domain::policy::EpochMs;
use crate::domain::saga::AbortReason;
use crate::domain::session::SessionStatus;
use sea_orm::sea_query::Expr;

impl Store {
    pub async fn create_session(
        &self,
        experience_id: &str,
        terminal_id: Option<String>,
        nickname: &str,
        participant_token: &str,
        now: EpochMs,
    ) -> StoreResult<sessions::Model> {
        let tx = self.write_tx().await?;
        let model = sessions::ActiveModel {
            id: Set(new_id()),
            experience_id: Set(experience_id.to_owned()),
            terminal_id: Set(terminal_id),
            nickname: Set(nickname.to_owned()),
            participant_token_hash: Set(token_hash(participant_token)),
            status: Set(SessionStatus::Open.as_str().to_owned()),
            abort_reason: Set(None),
            created_at_ms: Set(now),
            updated_at_ms: Set(now),
            share_id: Set(Some(share_id(rand::random()))),
            in_gallery: Set(true),
            hidden: Set(false),
            consented: Set(false),
            forgotten_at_ms: Set(None),
            forgotten_by: Set(None),
            objects_left: Set(false),
            purge_claim_until_ms: Set(None),
        }
        .insert(&*tx)
        .await?;
        tx.commit().await?;
        Ok(model)
    }

    pub async fn session(&self, id: &str) -> StoreResult<Option<sessions::Model>> {
        Ok(sessions::Entity::find_by_id(id.to_owned())
            .one(self.db())
            .await?)
    }

    /// The newest saga of a session, if it ever submitted.
    pub async fn latest_saga_of_session(
        &self,
        session_id: &str,
    ) -> StoreResult<Option<sagas::Model>> {
        use sea_orm::QueryOrder;
        Ok(sagas::Entity::find()
            .filter(sagas::Column::SessionId.eq(session_id))
            .order_by_desc(sagas::Column::CreatedAtMs)
            .one(self.db())
            .await?)
    }

    /// Sessions stuck in SUBMITTING with no unfinished saga (one waiting
    /// in review counts, though it holds no lease) (a crash between the two
    /// writes cannot happen, they share a transaction, but a hand-edited or
    /// restored database can): the ids, oldest first.
    pub async fn submitting_without_saga(
        &self,
        older_than: EpochMs,
        limit: i64,
    ) -> StoreResult<Vec<String>> {
        let rows = self
            .db()
            .query_all_raw(self.sql(
                "SELECT s.id FROM sessions s WHERE s.status = 'SUBMITTING' AND s.updated_at_ms < $1 \
                 AND NOT EXISTS (SELECT 1 FROM sagas g WHERE g.session_id = s.id \
                 AND g.step IN ('AI_PENDING', 'AI_DONE', 'IN_REVIEW', 'RANKING_DONE')) \
                 ORDER BY s.updated_at_ms LIMIT $2",
                vec![older_than.into(), limit.into()],
            ))
            .await?;
        rows.iter()
            .map(|r| r.try_get_by_index::<String>(0))
            .collect::<Result<_, _>>()
            .map_err(Into::into)
    }

    /// Ends a session stuck in SUBMITTING without a running saga: ABORTED
    /// with ORPHANED, and the terminal is told (true when an outbox event was
    /// appended), in one transaction. No saga ended, so the outbox row's
    /// `saga_id` is a fresh id of this abort alone: it never repeats, so a
    /// session may end this way any number of times (it resubmits, sticks
    /// again, is aborted again), each time with one event of its own. (It
    /// used to carry the session id, the same on every abort, which the
    /// unique `idx_terminal_events_saga` of the first schema refused the
    /// second time.)
    pub async fn abort_stuck_session(&self, session_id: &str, now: EpochMs) -> StoreResult<bool> {
        let reason = AbortReason::Orphaned;
        let tx = self.write_tx().await?;
        let moved = set_session_status(
            &tx,
            session_id,
            SessionStatus::Aborted,
            Some(reason),
            Some(SessionStatus::Submitting),
            now,
        )
        .await?;
        if moved == 0 {
            return Ok(false);
        }
        let session = sessions::Entity::find_by_id(session_id.to_owned())
            .one(&*tx)
            .await?
            .ok_or(StoreError::NotFound("session"))?;
        let appended = Self::announce(
            &tx,
            &session,
            &new_id(),
            aborted_payload(
                &session,
                reason,
                None,
                super::experiences::locale_of(&*tx, &session.experience_id).await?,
            ),
            now,
        )
        .await?;
        tx.commit().await?;
        Ok(appended)
    }
}

/// Sets a session's status (and abort reason) inside the caller's
/// transaction; with `only_from`, only while the session is in that status
/// (and to SUBMITTING only while its data is not forgotten).
/// Returns the rows changed (0 or 1).
pub(crate) async fn set_session_status(
    tx: &WriteTx,
    session_id: &str,
    status: SessionStatus,
    reason: Option<AbortReason>,
    only_from: Option<SessionStatus>,
    now: EpochMs,
) -> StoreResult<u64> {
    let mut update = sessions::Entity::update_many()
        .col_expr(sessions::Column::Status, Expr::value(status.as_str()))
        .col_expr(
            sessions::Column::AbortReason,
            Expr::value(reason.map(|r| r.as_str())),
        )
        .col_expr(sessions::Column::UpdatedAtMs, Expr::value(now))
        .filter(sessions::Column::Id.eq(session_id));
    if let Some(from) = only_from {
        update = update.filter(sessions::Column::Status.eq(from.as_str()));
    }
    if status == SessionStatus::Submitting {
        // An erased or expired session never runs again.
        update = update.filter(sessions::Column::ForgottenAtMs.is_null());
    }
    Ok(update.exec(&**tx).await?.rows_affected)
}
