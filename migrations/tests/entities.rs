//! stagehand's sea-orm entities (`src/store/entities`) agree with the schema
//! these migrations build, on SQLite and, when `STAGEHAND_TEST_POSTGRES_URL`
//! is set, on PostgreSQL.
//!
//! The entity files are compiled here by path (they depend on sea-orm only),
//! so a column added to one side and not the other, or a Rust type the
//! database cannot decode (PostgreSQL's `integer` is not an `i64`), fails this
//! test rather than a request at an event. For every table: the entity has as
//! many columns as the table, and a row with every nullable column set and a
//! row with every nullable column empty are written and read back unchanged.

mod common;

#[path = "../../src/store/entities/mod.rs"]
#[allow(dead_code, unused_imports)]
mod entities;

use common::{err, on_postgres, on_sqlite, TestResult};
use entities::{
    experiences, idempotency_records, mail_templates, mails, photos, printers, prints, results,
    sagas, score_attempts, sessions, terminal_events, terminal_presence, terminals,
    webhook_deliveries, webhooks,
};
use migration::{Migrator, MigratorTrait};
use sea_orm::entity::prelude::*;
use sea_orm::{ActiveValue::NotSet, DbBackend, IntoActiveModel, Iterable, Set, Statement};

const T0: i64 = 1_764_500_000_123;

/// Number of columns of `table` in the database.
async fn table_columns(db: &DatabaseConnection, table: &str) -> Result<i64, String> {
    let stmt = match db.get_database_backend() {
        DbBackend::Sqlite => Statement::from_sql_and_values(
            DbBackend::Sqlite,
            "SELECT COUNT(*) AS n FROM pragma_table_info(?)",
            [table.into()],
        ),
        backend => Statement::from_sql_and_values(
            backend,
            "SELECT COUNT(*) AS n FROM information_schema.columns \
             WHERE table_schema = current_schema() AND table_name = $1",
            [table.into()],
        ),
    };
    let row = db
        .query_one_raw(stmt)
        .await
        .map_err(err("count columns"))?
        .ok_or("no count row")?;
    row.try_get("", "n").map_err(err("column count"))
}

/// The entity declares exactly the table's columns (names are checked by the
/// round trips, which write and read every entity column).
async fn same_column_count<E: EntityTrait + Default>(db: &DatabaseConnection) -> TestResult {
    let table = E::default().table_name().to_owned();
    let in_entity = E::Column::iter().count() as i64;
    let in_table = table_columns(db, &table).await?;
    if in_entity != in_table {
        return Err(format!(
            "{table}: entity has {in_entity} columns, table has {in_table}"
        ));
    }
    Ok(())
}

/// Inserts `$model` (all fields set) and reads it back by `$id`.
macro_rules! round_trip {
    ($db:expr, $module:ident, $model:expr, $id:expr) => {{
        let model: $module::Model = $model;
        $module::Entity::insert(model.clone().into_active_model())
            .exec($db)
            .await
            .map_err(err(concat!("insert ", stringify!($module))))?;
        let back = $module::Entity::find_by_id($id)
            .one($db)
            .await
            .map_err(err(concat!("select ", stringify!($module))))?
            .ok_or(concat!(stringify!($module), ": row not found"))?;
        if back != model {
            return Err(format!(
                "{} round trip:\n wrote {model:?}\n read  {back:?}",
                stringify!($module)
            ));
        }
    }};
}

fn uuid(n: u32) -> String {
    format!("00000000-0000-4000-8000-{n:012}")
}

async fn entities_match_schema(db: DatabaseConnection) -> TestResult {
    let db = &db;
    Migrator::up(db, None).await.map_err(err("migrate"))?;

    same_column_count::<experiences::Entity>(db).await?;
    same_column_count::<terminals::Entity>(db).await?;
    same_column_count::<sessions::Entity>(db).await?;
    same_column_count::<sagas::Entity>(db).await?;
    same_column_count::<score_attempts::Entity>(db).await?;
    same_column_count::<results::Entity>(db).await?;
    same_column_count::<terminal_events::Entity>(db).await?;
    same_column_count::<idempotency_records::Entity>(db).await?;
    same_column_count::<terminal_presence::Entity>(db).await?;
    same_column_count::<photos::Entity>(db).await?;
    same_column_count::<printers::Entity>(db).await?;
    same_column_count::<prints::Entity>(db).await?;
    same_column_count::<webhooks::Entity>(db).await?;
    same_column_count::<webhook_deliveries::Entity>(db).await?;
    same_column_count::<mails::Entity>(db).await?;
    same_column_count::<mail_templates::Entity>(db).await?;

    // experiences
    let (exp_full, exp_min) = (uuid(1), uuid(2));
    round_trip!(
        db,
        experiences,
        experiences::Model {
            id: exp_full.clone(),
            slug: "comic-booth".into(),
            title: "Comic booth".into(),
            kind: "comic".into(),
            ai_calls: 4,
            min_success: Some(3),
            max_in_flight: 8,
            credits: Some(5_000_000_000),
            closes_at_ms: Some(T0 + 3_600_000),
            locale: "ko".into(),
            provider: "images".into(),
            weight: 3,
            review: "before_display".into(),
            review_timeout_ms: Some(300_000),
            review_timeout_action: Some("approve".into()),
            created_at_ms: T0,
            input: "photo+prompt".into(),
            photo_max_px: 1024,
            max_photos_per_session: 3,
            gallery: "pin".into(),
            gallery_pin_hash: Some("pbkdf2-sha256$100000$00$00".into()),
            photo_retention_ms: 7_200_000,
            retention_ms: 90 * 86_400_000,
            notice: Some(r#"{"ko":"30일 보관합니다."}"#.into()),
            consent_required: true,
            share_qr_ms: 8_000,
            brand_fit: "fit".into(),
            brand_caption: Some("서울 2026 #stagehand".into()),
            brand_applies_to: "display,print".into(),
            brand_overlay_key: Some("b/e/overlay.png".into()),
            brand_overlay_width: Some(1200),
            brand_overlay_height: Some(1800),
            brand_logo_key: Some("b/e/logo.png".into()),
            brand_version: 7_000_000_000,
            prints_per_guest: 3,
            print_review: true,
            mails_per_guest: 10,
            mail_attach: true,
            mail_consent: Some(r#"{"ko":"결과를 보내 주세요."}"#.into()),
            mail_marketing: Some(r#"{"en":"News, please."}"#.into()),
        },
        exp_full.clone()
    );
    round_trip!(
        db,
        experiences,
        experiences::Model {
            id: exp_min.clone(),
            slug: "score-booth".into(),
            title: "Score booth".into(),
            kind: "score".into(),
            ai_calls: 1,
            min_success: None,
            max_in_flight: 5,
            credits: None,
            closes_at_ms: None,
            locale: "en".into(),
            provider: "default".into(),
            weight: 1,
            review: "off".into(),
            review_timeout_ms: None,
            review_timeout_action: None,
            created_at_ms: T0,
            input: "prompt".into(),
            photo_max_px: 1536,
            max_photos_per_session: 5,
            gallery: "off".into(),
            gallery_pin_hash: None,
            photo_retention_ms: 3_600_000,
            retention_ms: 30 * 86_400_000,
            notice: None,
            consent_required: false,
            share_qr_ms: 0,
            brand_fit: "cover".into(),
            brand_caption: None,
            brand_applies_to: "display,share,print".into(),
            brand_overlay_key: None,
            brand_overlay_width: None,
            brand_overlay_height: None,
            brand_logo_key: None,
            brand_version: 0,
            prints_per_guest: 1,
            print_review: false,
            mails_per_guest: 3,
            mail_attach: false,
            mail_consent: None,
            mail_marketing: None,
        },
        exp_min.clone()
    );

    // terminals
    let terminal = uuid(10);
    round_trip!(
        db,
        terminals,
        terminals::Model {
            id: terminal.clone(),
            experience_id: exp_full.clone(),
            name: "Booth A".into(),
            token_hash: "terminal-secret-hash".into(),
            last_seq: 9_000_000_000,
            acked_seq: 8_999_999_999,
            created_at_ms: T0,
        },
        terminal.clone()
    );

    // sessions
    let (session_full, session_min) = (uuid(20), uuid(21));
    round_trip!(
        db,
        sessions,
        sessions::Model {
            id: session_full.clone(),
            experience_id: exp_full.clone(),
            terminal_id: Some(terminal.clone()),
            nickname: "Ada".into(),
            participant_token_hash: "token-1-hash".into(),
            status: "ABORTED".into(),
            abort_reason: Some("AI_FAILED".into()),
            created_at_ms: T0,
            updated_at_ms: T0 + 1,
            share_id: Some("0123456789abcdef0123456789abcdef".into()),
            in_gallery: false,
            hidden: true,
            consented: true,
            forgotten_at_ms: Some(T0 + 2),
            forgotten_by: Some("participant".into()),
            objects_left: true,
            purge_claim_until_ms: Some(T0 + 60_000),
        },
        session_full.clone()
    );
    round_trip!(
        db,
        sessions,
        sessions::Model {
            id: session_min.clone(),
            experience_id: exp_min.clone(),
            terminal_id: None,
            nickname: "Grace".into(),
            participant_token_hash: "token-2-hash".into(),
            status: "OPEN".into(),
            abort_reason: None,
            created_at_ms: T0,
            updated_at_ms: T0,
            share_id: None,
            in_gallery: true,
            hidden: false,
            consented: false,
            forgotten_at_ms: None,
            forgotten_by: None,
            objects_left: false,
            purge_claim_until_ms: None,
        },
        session_min.clone()
    );

    // sagas
    let (saga_full, saga_min) = (uuid(30), uuid(31));
    round_trip!(
        db,
        sagas,
        sagas::Model {
            id: saga_full.clone(),
            session_id: session_full.clone(),
            experience_id: exp_full.clone(),
            step: "RANKING_DONE".into(),
            prompt: "a cat on the moon, in four panels".into(),
            participant_score: Some(12.25),
            lock_token: Some(uuid(300)),
            locked_until_ms: Some(T0 + 60_000),
            attempts: 2,
            recoveries: 1,
            unavailable_streak: 3,
            next_attempt_at_ms: T0 + 500,
            ai_base_key: uuid(301),
            attempt_offset: 0,
            ai_job_id: Some("job-42".into()),
            ai_submitted_at_ms: Some(T0 + 10),
            content: Some(r#"[{"type":"image","url":"https://x/1.png"}]"#.into()),
            ai_score: Some(0.75),
            score: Some(12.25),
            score_attempt_id: Some(uuid(40)),
            rank: Some(1),
            abort_reason: Some("AI_TIMEOUT".into()),
            aborted_at_step: Some("AI_PENDING".into()),
            abort_detail: Some("attempt 3 timed out".into()),
            deadline_at_ms: T0 + 900_000,
            charged_credits: 4,
            ai_duration_ms: Some(12_345),
            handed_over: false,
            review_since_ms: Some(T0 + 1),
            review_decision: Some("APPROVED".into()),
            trace_context: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            created_at_ms: T0,
            updated_at_ms: T0 + 2,
            photo_id: Some(uuid(60)),
        },
        saga_full.clone()
    );
    round_trip!(
        db,
        sagas,
        sagas::Model {
            id: saga_min.clone(),
            session_id: session_min.clone(),
            experience_id: exp_min.clone(),
            step: "AI_PENDING".into(),
            prompt: "p".into(),
            participant_score: None,
            lock_token: None,
            locked_until_ms: None,
            attempts: 0,
            recoveries: 0,
            unavailable_streak: 0,
            next_attempt_at_ms: T0,
            ai_base_key: uuid(302),
            attempt_offset: 0,
            ai_job_id: None,
            ai_submitted_at_ms: None,
            content: None,
            ai_score: None,
            score: None,
            score_attempt_id: None,
            rank: None,
            abort_reason: None,
            aborted_at_step: None,
            abort_detail: None,
            deadline_at_ms: T0 + 900_000,
            charged_credits: 0,
            ai_duration_ms: None,
            handed_over: true,
            review_since_ms: None,
            review_decision: None,
            trace_context: None,
            created_at_ms: T0,
            updated_at_ms: T0,
            photo_id: None,
        },
        saga_min.clone()
    );

    // score_attempts
    let attempt = uuid(40);
    round_trip!(
        db,
        score_attempts,
        score_attempts::Model {
            id: attempt.clone(),
            experience_id: exp_full.clone(),
            session_id: session_full.clone(),
            saga_id: saga_full.clone(),
            nickname: "Ada".into(),
            score: 12.25,
            hidden: true,
            created_at_ms: T0,
        },
        attempt.clone()
    );
    // One ranking entry per session.
    let second = score_attempts::Model {
        id: uuid(41),
        experience_id: exp_full.clone(),
        session_id: session_full.clone(),
        saga_id: saga_full.clone(),
        nickname: "Ada".into(),
        score: 99.0,
        hidden: false,
        created_at_ms: T0,
    };
    if score_attempts::Entity::insert(second.into_active_model())
        .exec(db)
        .await
        .is_ok()
    {
        return Err("a second ranking entry for the same session was accepted".into());
    }

    // photos
    round_trip!(
        db,
        photos,
        photos::Model {
            id: uuid(60),
            session_id: session_full.clone(),
            object_key: "p/0123456789abcdef0123456789abcdef.jpg".into(),
            content_type: "image/jpeg".into(),
            width: 1152,
            height: 1536,
            bytes: 250_000,
            created_at_ms: T0,
            deleted_at_ms: Some(T0 + 5),
            object_gone: true,
            purge_claim_until_ms: Some(T0 + 60_000),
            swept_at_ms: Some(T0 + 3),
            sha256: Some("9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08".into()),
        },
        uuid(60)
    );
    round_trip!(
        db,
        photos,
        photos::Model {
            id: uuid(61),
            session_id: session_min.clone(),
            object_key: "p/1123456789abcdef0123456789abcdef.jpg".into(),
            content_type: "image/jpeg".into(),
            width: 1,
            height: 1,
            bytes: 1,
            created_at_ms: T0,
            deleted_at_ms: None,
            object_gone: false,
            purge_claim_until_ms: None,
            swept_at_ms: None,
            sha256: None,
        },
        uuid(61)
    );

    // results
    let (result_full, result_min) = (uuid(50), uuid(51));
    round_trip!(
        db,
        results,
        results::Model {
            id: result_full.clone(),
            saga_id: saga_full.clone(),
            session_id: session_full.clone(),
            content: r#"[{"type":"text","text":"hi"}]"#.into(),
            score: Some(12.25),
            rank: Some(1),
            created_at_ms: T0,
        },
        result_full.clone()
    );
    round_trip!(
        db,
        results,
        results::Model {
            id: result_min.clone(),
            saga_id: saga_min.clone(),
            session_id: session_min.clone(),
            content: "[]".into(),
            score: None,
            rank: None,
            created_at_ms: T0,
        },
        result_min.clone()
    );

    // terminal_events: the id comes from the database.
    let mut ids = Vec::new();
    for (seq, saga) in [(1i64, &saga_full), (2, &saga_min)] {
        let event = terminal_events::ActiveModel {
            id: NotSet,
            terminal_id: Set(terminal.clone()),
            seq: Set(Some(seq)),
            session_id: Set(session_full.clone()),
            saga_id: Set(saga.clone()),
            event_type: Set("session.completed".into()),
            payload: Set(r#"{"type":"session.completed"}"#.into()),
            created_at_ms: Set(T0 + seq),
        };
        let inserted = terminal_events::Entity::insert(event)
            .exec(db)
            .await
            .map_err(err("insert terminal event"))?;
        let back = terminal_events::Entity::find_by_id(inserted.last_insert_id)
            .one(db)
            .await
            .map_err(err("select terminal event"))?
            .ok_or("terminal event not found by its generated id")?;
        if back.seq != Some(seq) || back.saga_id != *saga || back.created_at_ms != T0 + seq {
            return Err(format!("terminal event read back wrong: {back:?}"));
        }
        ids.push(inserted.last_insert_id);
    }
    if ids[0] < 1 || ids[1] <= ids[0] {
        return Err(format!("terminal event ids do not increase: {ids:?}"));
    }

    // idempotency_records: composite primary key.
    let scope = "session:token-1".to_owned();
    round_trip!(
        db,
        idempotency_records,
        idempotency_records::Model {
            scope: scope.clone(),
            key: "k".repeat(255),
            request_hash: "ab".repeat(32),
            state: "COMPLETED".into(),
            response_status: Some(202),
            response_body: Some(r#"{"status":"SUBMITTING"}"#.into()),
            created_at_ms: T0,
            expires_at_ms: T0 + 86_400_000,
            owner: None,
            instance_id: None,
            locked_until_ms: None,
        },
        (scope.clone(), "k".repeat(255))
    );
    round_trip!(
        db,
        idempotency_records,
        idempotency_records::Model {
            scope: scope.clone(),
            key: "other".into(),
            request_hash: "cd".repeat(32),
            state: "IN_PROGRESS".into(),
            response_status: None,
            response_body: None,
            created_at_ms: T0,
            expires_at_ms: T0 + 86_400_000,
            owner: Some("request-owner".into()),
            instance_id: None,
            locked_until_ms: Some(T0 + 30_000),
        },
        (scope.clone(), "other".to_owned())
    );

    // printers and prints
    round_trip!(
        db,
        printers,
        printers::Model {
            id: uuid(60),
            name: "Booth A".into(),
            uri: "ipp://192.168.1.40:631/ipp/print".into(),
            media: "na_index-4x6_4x6in".into(),
            colour: true,
            experiences: format!("{exp_full},{exp_min}"),
            state: "idle".into(),
            state_reasons: "media-empty-report".into(),
            formats: "image/jpeg,image/pwg-raster".into(),
            dpi: 300,
            checked_at_ms: Some(T0),
            created_at_ms: T0,
        },
        uuid(60)
    );
    for (n, full) in [(61, true), (62, false)] {
        round_trip!(
            db,
            prints,
            prints::Model {
                id: uuid(n),
                session_id: uuid(70),
                experience_id: exp_full.clone(),
                source_key: "r/00112233445566778899aabbccddeeff.b.jpg".into(),
                requested_by: "guest".into(),
                status: if full { "PRINTING" } else { "QUEUED" }.into(),
                reason: full.then(|| "out_of_paper".into()),
                awaiting_review: !full,
                job_name: format!("stagehand-{}", uuid(n)),
                printer_id: full.then(|| uuid(60)),
                ipp_job_id: full.then_some(2_000_000_000),
                attempts: 2,
                lease_token: full.then(|| "instance:token".into()),
                lease_until_ms: full.then_some(T0 + 60_000),
                next_attempt_at_ms: T0,
                created_at_ms: T0,
                updated_at_ms: T0,
            },
            uuid(n)
        );
    }

    // webhooks, their deliveries, mails and mail templates
    for (n, full) in [(80, true), (81, false)] {
        round_trip!(
            db,
            webhooks,
            webhooks::Model {
                id: uuid(n),
                url: "https://crm.example.com/hook".into(),
                events: "session.completed,email.sent".into(),
                secret: "sealed".into(),
                enabled: !full,
                disabled_reason: full.then(|| "kept failing".into()),
                failing_since_ms: full.then_some(T0),
                created_at_ms: T0,
            },
            uuid(n)
        );
        round_trip!(
            db,
            webhook_deliveries,
            webhook_deliveries::Model {
                id: format!("msg_{n}"),
                webhook_id: uuid(n),
                event_id: uuid(n + 10),
                event: "session.completed".into(),
                session_id: full.then(|| uuid(70)),
                payload: "{}".into(),
                status: "PENDING".into(),
                attempts: 3,
                last_status: full.then_some(503),
                last_error: full.then(|| "answered 503".into()),
                last_latency_ms: full.then_some(2_000_000_000),
                lease_token: full.then(|| "instance:token".into()),
                lease_until_ms: full.then_some(T0 + 60_000),
                next_attempt_at_ms: T0,
                created_at_ms: T0,
                updated_at_ms: T0,
                delivered_at_ms: full.then_some(T0 + 1),
            },
            format!("msg_{n}")
        );
        round_trip!(
            db,
            mails,
            mails::Model {
                id: uuid(n + 20),
                session_id: uuid(70),
                experience_id: exp_full.clone(),
                address: full.then(|| "guest@example.com".into()),
                address_key: full.then(|| "00112233445566778899aabbccddeeff".into()),
                locale: "ko".into(),
                consent_notice: "0011223344556677".into(),
                consent_at_ms: T0,
                marketing: full,
                marketing_at_ms: full.then_some(T0),
                status: if full { "FAILED" } else { "QUEUED" }.into(),
                attempts: 2,
                last_error: full.then(|| "permanent error (550)".into()),
                lease_token: full.then(|| "instance:token".into()),
                lease_until_ms: full.then_some(T0 + 60_000),
                next_attempt_at_ms: T0,
                created_at_ms: T0,
                updated_at_ms: T0,
                sent_at_ms: full.then_some(T0 + 1),
            },
            uuid(n + 20)
        );
    }
    round_trip!(
        db,
        mail_templates,
        mail_templates::Model {
            locale: "ko".into(),
            subject: "{event}에서 만든 사진".into(),
            body: "{link}".into(),
            updated_at_ms: T0,
        },
        "ko".to_owned()
    );

    Ok(())
}

#[tokio::test]
async fn sqlite_entities_match_schema() {
    on_sqlite(entities_match_schema).await;
}

#[tokio::test]
#[cfg_attr(not(pg_tests), ignore = "STAGEHAND_TEST_POSTGRES_URL is not set")]
async fn postgres_entities_match_schema() {
    on_postgres(entities_match_schema).await;
}
