//! sea-orm entities, one per table of the `migration` crate's schema. Ids are
//! UUID text, times are `i64` milliseconds since the epoch (`*_ms`), JSON is
//! text.

pub mod ai_calls;
pub mod experiences;
pub mod idempotency_records;
pub mod mail_templates;
pub mod mails;
pub mod photos;
pub mod printers;
pub mod prints;
pub mod results;
pub mod sagas;
pub mod score_attempts;
pub mod sessions;
pub mod terminal_events;
pub mod terminal_presence;
pub mod terminals;
pub mod webhook_deliveries;
pub mod webhooks;

pub mod prelude {
    pub use super::ai_calls::Entity as AiCalls;
    pub use super::experiences::Entity as Experiences;
    pub use super::idempotency_records::Entity as IdempotencyRecords;
    pub use super::photos::Entity as Photos;
    pub use super::printers::Entity as Printers;
    pub use super::prints::Entity as Prints;
    pub use super::results::Entity as Results;
    pub use super::sagas::Entity as Sagas;
    pub use super::score_attempts::Entity as ScoreAttempts;
    pub use super::sessions::Entity as Sessions;
    pub use super::terminal_events::Entity as TerminalEvents;
    pub use super::terminal_presence::Entity as TerminalPresence;
    pub use super::terminals::Entity as Terminals;
    pub use super::webhook_deliveries::Entity as WebhookDeliveries;
    pub use super::webhooks::Entity as Webhooks;
}
