//! One print of a session's result, from the ask to the paper: its
//! status and reason, the printer and job it went to, and the lease of
//! the print actor that holds it.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "prints")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub session_id: String,
    pub experience_id: String,
    /// The kept file it prints (`r/….b.jpg`).
    pub source_key: String,
    /// `guest`, or `operator:<name>`.
    pub requested_by: String,
    /// `QUEUED`, `SENDING`, `PRINTING`, `COMPLETED`, `CANCELED`, `ABORTED`.
    pub status: String,
    pub reason: Option<String>,
    /// A guest's print waits for an operator's approval.
    pub awaiting_review: bool,
    /// Its IPP `job-name`, derived from its id.
    pub job_name: String,
    pub printer_id: Option<String>,
    pub ipp_job_id: Option<i32>,
    pub attempts: i32,
    pub lease_token: Option<String>,
    pub lease_until_ms: Option<i64>,
    pub next_attempt_at_ms: i64,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
