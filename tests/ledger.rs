//! The AI account cap (`max_in_flight`) as the provider sees it, black box
//! against the simulator, on SQLite and on PostgreSQL: every job the
//! provider may still be running counts against the cap until the provider
//! says it ended, whatever happened to the saga or the call that made it.
//! Four ways a running job used to be counted nowhere, each played with a
//! provider that has no cancel, so nothing can stop the job early:
//!
//! - a fan-out call that timed out while its saga kept all its slots;
//! - the job of a worker killed with SIGKILL, once its saga's deadline
//!   passed, before the cleanup round ends the saga;
//! - an unclear submit whose retry the provider refused (503);
//! - an operator's cancel that lands after the submit reached the provider
//!   but before the job id was recorded.
//!
//! Each test asserts against the provider's own record (`GET /v1/stats`:
//! `max_concurrent_jobs` is the most jobs it ever ran at once). They were
//! written as regression tests for the fix, and fail on the code before it.

mod support;

use std::cell::RefCell;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stagehand::ai::simulator::{SimConfig, SimFaults, SimStats};
use support::{http_client, Backend, Logs, Server, TestApp, TestDb, OPERATOR};

/// The longest any wait of these tests may take.
const WITHIN: Duration = Duration::from_secs(40);

/// A provider without cancel whose jobs take `latency`.
fn no_cancel(latency: Duration) -> SimConfig {
    SimConfig {
        latency,
        refuse_cancel: true,
        ..support::fast_sim()
    }
}

/// The provider's own record, as `GET /v1/stats` serves it.
async fn provider_stats(http: &reqwest::Client, sim_url: &str) -> SimStats {
    let resp = http
        .get(format!("{sim_url}/v1/stats"))
        .send()
        .await
        .expect("GET /v1/stats");
    assert_eq!(resp.status(), 200, "GET /v1/stats");
    resp.json().await.expect("stats JSON")
}

/// Creates an experience with `ai_calls` calls per submission and a cap
/// of `max_in_flight` jobs.
async fn experience(
    http: &reqwest::Client,
    base: &str,
    ai_calls: i32,
    max_in_flight: i32,
) -> String {
    let slug = format!("ledger-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let resp = http
        .post(format!("{base}/api/experiences"))
        .bearer_auth(OPERATOR)
        .json(&json!({
            "slug": slug, "title": "Ledger", "kind": "comic",
            "ai_calls": ai_calls, "max_in_flight": max_in_flight,
        }))
        .send()
        .await
        .expect("POST /api/experiences");
    assert_eq!(resp.status(), 201, "{:?}", resp.text().await);
    slug
}

/// Submits a prompt and returns the 202's body.
async fn submit(
    http: &reqwest::Client,
    base: &str,
    (sid, token): (&str, &str),
    prompt: &str,
    key: &str,
) -> Value {
    let resp = support::submit(http, base, sid, token, json!({ "prompt": prompt }), key).await;
    assert_eq!(resp.status(), 202, "{:?}", resp.text().await);
    resp.json().await.expect("202 body")
}

fn is_final(session: &Value) -> bool {
    matches!(
        session["status"].as_str(),
        Some("COMPLETED") | Some("ABORTED")
    )
}

/// The most slots in use the server showed for one experience (and for
/// its provider when the provider has a cap) above the cap, with the
/// `GET /api/admin/providers` body that showed it.
#[derive(Default)]
struct ServerView {
    reads: u32,
    worst: Option<(i64, i64, Value)>,
}

impl ServerView {
    fn observe(&mut self, body: &Value, slug: &str) {
        self.reads += 1;
        for provider in body["providers"].as_array().into_iter().flatten() {
            let mut pairs = Vec::new();
            if let Some(cap) = provider["max_in_flight"].as_i64() {
                pairs.push((provider["in_flight"].as_i64().unwrap_or(0), cap));
            }
            for e in provider["experiences"].as_array().into_iter().flatten() {
                if e["slug"] == slug {
                    pairs.push((
                        e["in_flight"].as_i64().unwrap_or(0),
                        e["max_in_flight"].as_i64().unwrap_or(i64::MAX),
                    ));
                }
            }
            for (in_flight, cap) in pairs {
                let over = in_flight - cap;
                if over > 0 && self.worst.as_ref().is_none_or(|(i, c, _)| over > i - c) {
                    self.worst = Some((in_flight, cap, body.clone()));
                }
            }
        }
    }
}

/// A fan-out call whose attempt ran out of `AI_TIMEOUT` (its last one)
/// leaves a job that may still run: that job must keep its slot until the
/// provider says it ended. Experience of 3 calls capped at 2, AI_TIMEOUT
/// 1 s, one attempt, 6 s jobs, no cancel. Before, the timed-out call's job
/// was counted as lingering while the saga kept both its slots too (3 in
/// use against 2 in the operators' view), so the waiting third call
/// started beside the two timed-out jobs still running: the provider ran 3
/// jobs at once against a cap of 2.
async fn a_timed_out_fan_out_call_keeps_its_slot_until_its_job_ends(backend: Backend) {
    const CAP: u64 = 2;
    let app = TestApp::spawn_with(backend, no_cancel(Duration::from_secs(6)), |c| {
        c.ai_timeout = Duration::from_secs(1);
        c.max_attempts = 1;
    })
    .await;
    let sim_url = app.sim.url();
    let slug = experience(&app.http, &app.base, 3, CAP as i32).await;
    let (sid, token) = app.session(&slug, None, "fan").await;
    submit(
        &app.http,
        &app.base,
        (&sid, &token),
        "three opinions",
        "fan-1",
    )
    .await;

    // The operators' view, read all along, until the saga ended and no
    // job of it runs at the provider any more.
    let view = RefCell::new(ServerView::default());
    let ended = support::wait_for(WITHIN, || async {
        let (status, body) = app.operator_get("/api/admin/providers").await;
        assert_eq!(status, 200, "{body}");
        view.borrow_mut().observe(&body, &slug);
        let session = app.status(&sid, &token).await;
        let idle = provider_stats(&app.http, &sim_url).await.running == 0;
        (is_final(&session) && idle).then_some(session)
    })
    .await;
    let stats = provider_stats(&app.http, &sim_url).await;
    let session = ended.unwrap_or_else(|| {
        panic!("the saga did not end with no job running within {WITHIN:?}: {stats:?}")
    });
    let view = view.into_inner();
    eprintln!(
        "[{backend:?}] fan-out of 3, cap {CAP}, calls timed out: provider {stats:?}; \
         operators' view over {} reads, worst in_flight/max_in_flight: {:?}",
        view.reads,
        view.worst.as_ref().map(|(i, c, _)| (i, c))
    );
    assert_eq!(
        session["status"], "ABORTED",
        "the calls time out: {session}"
    );
    assert!(stats.jobs_created >= 2, "{stats:?}");
    let mut broken = Vec::new();
    if stats.max_concurrent_jobs > CAP {
        broken.push(format!(
            "the provider ran {} jobs at once against a cap of {CAP}",
            stats.max_concurrent_jobs
        ));
    }
    if let Some((in_flight, cap, body)) = &view.worst {
        broken.push(format!(
            "GET /api/admin/providers showed in_flight {in_flight} against max_in_flight {cap}: {body}"
        ));
    }
    assert!(broken.is_empty(), "{}; {stats:?}", broken.join("; "));
    app.stop().await;
}
db_test!(a_timed_out_fan_out_call_keeps_its_slot_until_its_job_ends);

/// A worker killed with SIGKILL leaves its job running at the provider:
/// that job must keep its slot until the provider says it ended, also
/// once the saga's deadline has passed and until (and after) a cleanup
/// round ends the saga. Cap 1, MAX_RECOVERIES 0 (the saga is never
/// resumed), saga deadline 8 s, a 16 s job, no cancel, the default
/// cleanup interval (60 s). The server is killed while the job runs and
/// started again on the same database; 3 s after the deadline a second
/// session submits. Before, the dead saga's slot counted only until its
/// deadline and nothing counted its job afterwards: the second session's
/// job started beside it (2 jobs at once against a cap of 1), and its 202
/// said `queue_position` 2, counting ahead of it the dead saga that will
/// never run again (1 is right).
async fn a_dead_workers_job_keeps_its_slot_past_the_saga_deadline(backend: Backend) {
    const DEADLINE: Duration = Duration::from_secs(8);
    let mut logs = Logs::new();
    let http = http_client();
    let db = TestDb::fresh(backend).await;
    let sim = support::start_sim(no_cancel(Duration::from_secs(16))).await;
    let env = [
        ("STAGEHAND_MAX_RECOVERIES", "0"),
        ("STAGEHAND_SAGA_DEADLINE", "8s"),
        // The server's default: 60 s.
        ("STAGEHAND_CLEANUP_INTERVAL", ""),
    ];
    let mut first = Server::start_with(&db.url, &sim.url(), &logs.next(), &http, &env).await;
    let slug = experience(&http, &first.base, 1, 1).await;
    let a = support::create_session(&http, &first.base, &slug, None, "dead").await;
    let b = support::create_session(&http, &first.base, &slug, None, "next").await;
    submit(
        &http,
        &first.base,
        (&a.0, &a.1),
        "a dead worker's job",
        "a-1",
    )
    .await;
    // The saga's deadline is at most DEADLINE after its 202.
    let deadline = Instant::now() + DEADLINE;
    let running = support::wait_for(Duration::from_secs(10), || async {
        (sim.control.stats().running == 1).then_some(())
    })
    .await;
    assert!(
        running.is_some(),
        "the job did not start: {:?}",
        sim.control.stats()
    );
    // The second session's job is short, so that it ends soon once it runs.
    sim.control.set_latency(Duration::from_secs(1));
    first.kill9();
    let second = Server::start_with(&db.url, &sim.url(), &logs.next(), &http, &env).await;

    // The scenario is the time between the deadline and the cleanup round:
    // wait until the deadline has surely passed.
    tokio::time::sleep_until((deadline + Duration::from_secs(3)).into()).await;
    let before = provider_stats(&http, &sim.url()).await;
    assert_eq!(
        (before.jobs_created, before.running),
        (1, 1),
        "the dead worker's job still runs: {before:?}"
    );
    let accepted = submit(&http, &second.base, (&b.0, &b.1), "the next one", "b-1").await;
    let done = support::wait_final(&http, &second.base, &b.0, &b.1, WITHIN).await;
    let stats = provider_stats(&http, &sim.url()).await;
    eprintln!(
        "[{backend:?}] dead worker past its deadline, cap 1: provider {stats:?}; \
         second 202 queue_position {}; second session {}",
        accepted["queue_position"], done["status"]
    );
    let mut broken = Vec::new();
    if stats.max_concurrent_jobs > 1 {
        broken.push(format!(
            "the provider ran {} jobs at once against a cap of 1",
            stats.max_concurrent_jobs
        ));
    }
    if accepted["queue_position"] != 1 {
        broken.push(format!(
            "the second 202 said queue_position {} (1 expected: the dead saga never runs again)",
            accepted["queue_position"]
        ));
    }
    assert!(broken.is_empty(), "{}; {stats:?}", broken.join("; "));
    drop(second);
}
db_test!(a_dead_workers_job_keeps_its_slot_past_the_saga_deadline);

/// A submit whose answer was lost after the provider made the job (the
/// connection dropped) may have a job running: the call must keep its slot
/// while it asks again, also when the retry is refused (503). Cap 1, 5 s
/// jobs, no cancel; the simulator drops the first answer and refuses the
/// next submit; a second session waits behind the first. Before, the
/// refused retry took the call for one with no job (`maybe_running` 0):
/// the saga released its slot to back off, and the second session's job
/// started beside the first one's (2 jobs at once against a cap of 1).
async fn an_unclear_submit_keeps_its_slot_when_its_retry_is_refused(backend: Backend) {
    let faults = SimFaults {
        drop_after_create: 1,
        unavailable_after_unclear: 1,
        ..SimFaults::default()
    };
    let (stats, _) =
        second_session_behind_the_first(backend, faults, "unclear submit then 503", |s| {
            (s.unclear_answers == 1).then_some(())
        })
        .await;
    assert!(
        stats.refused >= 1,
        "the retry of the unclear submit was not refused: {stats:?}"
    );
}
db_test!(an_unclear_submit_keeps_its_slot_when_its_retry_is_refused);

/// An operator's cancel that lands while the submit is out (the provider
/// made the job, its answer has not come back, so no job id is recorded)
/// leaves a job running: it must keep its slot until the provider says it
/// ended. Cap 1, 6 s jobs, no cancel, the first submit answered 3 s after
/// the job was made; the saga is cancelled meanwhile and a second session
/// submits. Before, the cancelled saga had no job id to linger: its job
/// was counted nowhere and the second session's job started beside it (2
/// jobs at once against a cap of 1).
async fn a_cancel_during_the_submit_keeps_the_jobs_slot_until_it_ends(backend: Backend) {
    const SUBMIT_DELAY: Duration = Duration::from_secs(3);
    let app = TestApp::spawn_with(backend, no_cancel(Duration::from_secs(6)), |_| {}).await;
    let sim_url = app.sim.url();
    app.sim.control.set_faults(SimFaults {
        submit_delay: SUBMIT_DELAY,
        ..SimFaults::default()
    });
    let slug = experience(&app.http, &app.base, 1, 1).await;
    let a = app.session(&slug, None, "cancelled").await;
    let b = app.session(&slug, None, "next").await;
    let accepted = submit(&app.http, &app.base, (&a.0, &a.1), "slow answer", "a-1").await;
    let saga_id = accepted["saga_id"].as_str().expect("saga_id").to_owned();
    let made = support::wait_for(Duration::from_secs(10), || async {
        (app.sim.control.stats().jobs_created == 1).then(Instant::now)
    })
    .await
    .unwrap_or_else(|| panic!("no job was made: {:?}", app.sim.control.stats()));
    let (status, _, body) = app
        .operator_post(&format!("/api/admin/sagas/{saga_id}/cancel"), None)
        .await;
    assert_eq!(status, 200, "{body}");
    let cancelled_after = made.elapsed();
    assert!(
        cancelled_after + Duration::from_millis(500) < SUBMIT_DELAY,
        "the cancel came {cancelled_after:?} after the job was made: too late to land \
         before the submit's answer ({SUBMIT_DELAY:?})"
    );
    // Only the first submit is slow.
    app.sim.control.set_faults(SimFaults::default());
    let cancelled = app.wait_final(&a.0, &a.1, Duration::from_secs(10)).await;
    assert_eq!(cancelled["status"], "ABORTED", "{cancelled}");
    submit(&app.http, &app.base, (&b.0, &b.1), "the next one", "b-1").await;
    let done = app.wait_final(&b.0, &b.1, WITHIN).await;
    let stats = provider_stats(&app.http, &sim_url).await;
    eprintln!(
        "[{backend:?}] cancel during the submit, cap 1: provider {stats:?}; second session {}",
        done["status"]
    );
    assert_eq!(stats.jobs_created, 2, "{stats:?}");
    assert!(
        stats.max_concurrent_jobs <= 1,
        "the provider ran {} jobs at once against a cap of 1: {stats:?}",
        stats.max_concurrent_jobs
    );
    app.stop().await;
}
db_test!(a_cancel_during_the_submit_keeps_the_jobs_slot_until_it_ends);

/// A 503 to a create may come from a server that made the job before it
/// failed: not evidence that no job runs. Cap 1, 5 s jobs, no cancel; the
/// first submit makes its job and is answered 503, and so is the next
/// submit (the same key asked again); a second session waits behind the
/// first. Before, the 503 freed the slot as a refusal: the saga backed off
/// without a slot, and the second session's job started beside the first
/// one's (2 jobs at once against a cap of 1).
async fn a_503_after_the_job_was_made_keeps_its_slot(backend: Backend) {
    let faults = SimFaults {
        unavailable_after_create: 1,
        unavailable_after_unclear: 1,
        ..SimFaults::default()
    };
    // Both 503s were answered (the create's, then the same key's) before
    // the second session comes.
    let (stats, finals) =
        second_session_behind_the_first(backend, faults, "503 after the job was made", |s| {
            (s.jobs_created == 1 && s.refused >= 2).then_some(())
        })
        .await;
    assert_eq!(finals[0]["status"], "COMPLETED", "{}", finals[0]);
    assert_eq!(finals[1]["status"], "COMPLETED", "{}", finals[1]);
    assert_eq!(
        stats.jobs_created, 2,
        "one job per session, the 503'd one found again by its key: {stats:?}"
    );
}
db_test!(a_503_after_the_job_was_made_keeps_its_slot);

/// Cap 1, 5 s jobs, no cancel, retries a second or more apart (a second
/// session is claimed meanwhile if the slot is free): the provider gets
/// `faults`, a first session submits, and once the provider's record
/// shows `ready` a second one does. Both end; the provider never ran two
/// jobs at once. The provider's record and the two sessions as they ended.
async fn second_session_behind_the_first(
    backend: Backend,
    faults: SimFaults,
    label: &str,
    ready: impl Fn(&SimStats) -> Option<()>,
) -> (SimStats, Vec<Value>) {
    let app = TestApp::spawn_with(backend, no_cancel(Duration::from_secs(5)), |c| {
        c.backoff_base = Duration::from_secs(1);
        c.backoff_max = Duration::from_secs(4);
    })
    .await;
    let sim_url = app.sim.url();
    app.sim.control.set_faults(faults);
    let slug = experience(&app.http, &app.base, 1, 1).await;
    let a = app.session(&slug, None, "first").await;
    let b = app.session(&slug, None, "waiting").await;
    submit(&app.http, &app.base, (&a.0, &a.1), "the first", "a-1").await;
    let seen = support::wait_for(Duration::from_secs(10), || async {
        ready(&app.sim.control.stats())
    })
    .await;
    assert!(
        seen.is_some(),
        "{label}: the provider's record never showed the fault: {:?}",
        app.sim.control.stats()
    );
    submit(&app.http, &app.base, (&b.0, &b.1), "queued behind", "b-1").await;
    let finals = support::wait_all_final(&app.http, &app.base, &[a, b], WITHIN)
        .await
        .expect("both sessions end");
    let stats = provider_stats(&app.http, &sim_url).await;
    eprintln!(
        "[{backend:?}] {label}, cap 1: provider {stats:?}; sessions {} and {}",
        finals[0]["status"], finals[1]["status"]
    );
    assert!(
        stats.max_concurrent_jobs <= 1,
        "{label}: the provider ran {} jobs at once against a cap of 1: {stats:?}",
        stats.max_concurrent_jobs
    );
    app.stop().await;
    (stats, finals)
}
