//! One submission's saga: step, lease (`lock_token`, `locked_until_ms`), AI bookkeeping and outcome.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "sagas")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub session_id: String,
    pub experience_id: String,
    pub step: String,
    #[sea_orm(column_type = "Text")]
    pub prompt: String,
    pub participant_score: Option<f64>,
    pub lock_token: Option<String>,
    pub locked_until_ms: Option<i64>,
    pub attempts: i32,
    pub recoveries: i32,
    pub unavailable_streak: i32,
    pub next_attempt_at_ms: i64,
    pub ai_base_key: String,
    /// Where the attempt keys of a single call start (an operator's retry
    /// moves it on; see migration 14).
    pub attempt_offset: i32,
    pub ai_job_id: Option<String>,
    pub ai_submitted_at_ms: Option<i64>,
    #[sea_orm(column_type = "Text")]
    pub content: Option<String>,
    pub ai_score: Option<f64>,
    pub score: Option<f64>,
    pub score_attempt_id: Option<String>,
    pub rank: Option<i32>,
    pub abort_reason: Option<String>,
    /// Where the saga stood when it aborted: an operator's retry resumes there.
    pub aborted_at_step: Option<String>,
    #[sea_orm(column_type = "Text")]
    pub abort_detail: Option<String>,
    pub deadline_at_ms: i64,
    /// Credits this saga holds (taken at its start, 0 once given back).
    pub charged_credits: i64,
    /// How long the AI step of its last run took, submit to AI_DONE.
    pub ai_duration_ms: Option<i64>,
    /// Its instance shut down and handed it over: the lease was cut short
    /// on purpose, so the next claim resumes it at once and counts no
    /// recovery. Every claim sets it back to false.
    pub handed_over: bool,
    /// When its AI result entered IN_REVIEW (the review queue's order, and
    /// where `review_timeout` counts from).
    pub review_since_ms: Option<i64>,
    /// `APPROVED` once an operator (or the timeout) approved it: the fence
    /// of approve and reject. A rejection is the `REVIEW_REJECTED` abort.
    pub review_decision: Option<String>,
    /// Where the next run joins the traces: the submission's W3C
    /// `traceparent`, or `link:<traceparent>` for a run that starts a new
    /// trace linked to it (a resume or a retry); see migration 17.
    #[sea_orm(column_type = "Text")]
    pub trace_context: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// The photo its submission named (`photos.id`), for an experience
    /// whose `input` takes one.
    pub photo_id: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {
    /// The session the saga runs for (read with it when a batch
    /// completes, see `store::transitions`).
    #[sea_orm(
        belongs_to = "super::sessions::Entity",
        from = "Column::SessionId",
        to = "super::sessions::Column::Id"
    )]
    Session,
}

impl Related<super::sessions::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::Session.def()
    }
}

impl ActiveModelBehavior for ActiveModel {}
