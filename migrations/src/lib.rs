//! Database migrations for stagehand.
//!
//! The same migrations run on SQLite (the embedded default) and on PostgreSQL
//! (production), so they are written with the portable sea-query schema
//! builder, except where a backend has no portable form (changing a column's
//! nullability), which is spelled out per backend. `Migrator::up` brings a
//! database to the current schema; `Migrator::down` removes everything the
//! migrations created.

pub use sea_orm_migration::prelude::*;

mod m20261130_000001_init;
mod m20261201_000002_reactive_delivery;
mod m20261202_000003_peoples_side;
mod m20261203_000004_operator_views;
mod m20261204_000005_credits;
mod m20261204_000006_idempotency_lease;
mod m20261205_000008_breaker;
mod m20261206_000009_fan_out;
mod m20261207_000010_handover;
mod m20261207_000011_outbox_autovacuum;
mod m20261208_000012_providers;
mod m20261209_000013_sealed_replays;
mod m20261209_000014_attempt_offset;
mod m20261209_000015_instances;
mod m20261210_000016_review;
mod m20261210_000017_traces;
mod m20261211_000018_slot_ledger;
mod m20261212_000019_provider_states;
mod m20261213_000020_media;
mod m20261214_000021_guests_data;
mod m20261215_000022_operators_audit;
mod m20261216_000023_upload_bounds;
mod m20261216_000025_complete_erasure;
mod m20261216_000026_gallery_guard;
mod m20261217_000027_slot_evidence;
mod m20261218_000028_lean_indexes;
mod m20261219_000029_brand;
mod m20261219_000030_prints;
mod m20261220_000031_webhooks;
mod m20261221_000032_mail;

/// Every migration of the project, oldest first.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261130_000001_init::Migration),
            Box::new(m20261201_000002_reactive_delivery::Migration),
            Box::new(m20261202_000003_peoples_side::Migration),
            Box::new(m20261203_000004_operator_views::Migration),
            Box::new(m20261204_000005_credits::Migration),
            Box::new(m20261204_000006_idempotency_lease::Migration),
            Box::new(m20261205_000008_breaker::Migration),
            Box::new(m20261206_000009_fan_out::Migration),
            Box::new(m20261207_000010_handover::Migration),
            Box::new(m20261207_000011_outbox_autovacuum::Migration),
            Box::new(m20261208_000012_providers::Migration),
            Box::new(m20261209_000013_sealed_replays::Migration),
            Box::new(m20261209_000014_attempt_offset::Migration),
            Box::new(m20261209_000015_instances::Migration),
            Box::new(m20261210_000016_review::Migration),
            Box::new(m20261210_000017_traces::Migration),
            Box::new(m20261211_000018_slot_ledger::Migration),
            Box::new(m20261212_000019_provider_states::Migration),
            Box::new(m20261213_000020_media::Migration),
            Box::new(m20261214_000021_guests_data::Migration),
            Box::new(m20261215_000022_operators_audit::Migration),
            Box::new(m20261216_000023_upload_bounds::Migration),
            Box::new(m20261216_000025_complete_erasure::Migration),
            Box::new(m20261216_000026_gallery_guard::Migration),
            Box::new(m20261217_000027_slot_evidence::Migration),
            Box::new(m20261218_000028_lean_indexes::Migration),
            Box::new(m20261219_000029_brand::Migration),
            Box::new(m20261219_000030_prints::Migration),
            Box::new(m20261220_000031_webhooks::Migration),
            Box::new(m20261221_000032_mail::Migration),
        ]
    }
}
