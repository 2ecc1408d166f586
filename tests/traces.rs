//! Traces over OTLP: real `stagehand serve` processes (each its own
//! global subscriber) sending to a small OTLP/HTTP receiver in the test
//! (`POST /v1/traces`, protobuf decoded with `opentelemetry-proto`). On
//! SQLite and on PostgreSQL.
//!
//! - One trace per submission: the saga's span is a child of the
//!   submission's request span (its context stored with the saga), and the
//!   step spans and AI request spans hang under it with the saga's
//!   attributes; the spans are sent at shutdown (flush).
//! - A saga resumed after its worker died, one handed over at shutdown,
//!   and one an operator retried, start a new trace linked to the
//!   submission's.
//! - A collector that is down costs nothing: side by side with a server
//!   without traces, the 202 and the saga's end take as long, and the
//!   failure is logged once.

mod support;

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpResponse, HttpServer};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message;
use serde_json::{json, Value};
use support::{Backend, Logs, Server, TestDb};

/// One span as the receiver got it (ids in hex; empty parent: a root).
#[derive(Debug, Clone)]
struct Got {
    trace: String,
    id: String,
    parent: String,
    name: String,
    attrs: HashMap<String, String>,
    /// (trace id, span id) of each link.
    links: Vec<(String, String)>,
}

impl Got {
    fn attr(&self, key: &str) -> Option<&str> {
        self.attrs.get(key).map(String::as_str)
    }
}

/// The OTLP/HTTP receiver: every span of every request, and how many
/// requests came.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Got>>>,
    url: String,
}

impl Receiver {
    fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the receiver");
        let port = listener.local_addr().unwrap().port();
        let receiver = Receiver {
            spans: Arc::default(),
            url: format!("http://127.0.0.1:{port}"),
        };
        let spans = receiver.spans.clone();
        let server = HttpServer::new(move || {
            let spans = spans.clone();
            App::new().route(
                "/v1/traces",
                web::post().to(move |body: web::Bytes| {
                    let spans = spans.clone();
                    async move {
                        let Ok(request) = ExportTraceServiceRequest::decode(body) else {
                            return HttpResponse::BadRequest().finish();
                        };
                        let mut got = spans.lock().unwrap();
                        for resource in request.resource_spans {
                            for scope in resource.scope_spans {
                                got.extend(scope.spans.into_iter().map(|s| {
                                    Got {
                                        trace: hex::encode(&s.trace_id),
                                        id: hex::encode(&s.span_id),
                                        parent: hex::encode(&s.parent_span_id),
                                        name: s.name,
                                        attrs: s
                                            .attributes
                                            .into_iter()
                                            .map(|kv| {
                                                (kv.key, text(kv.value.and_then(|v| v.value)))
                                            })
                                            .collect(),
                                        links: s
                                            .links
                                            .into_iter()
                                            .map(|l| {
                                                (hex::encode(l.trace_id), hex::encode(l.span_id))
                                            })
                                            .collect(),
                                    }
                                }));
                            }
                        }
                        HttpResponse::Ok()
                            .content_type("application/x-protobuf")
                            .finish()
                    }
                }),
            )
        })
        .listen(listener)
        .expect("receiver listens")
        .workers(1)
        .disable_signals()
        .run();
        actix_web::rt::spawn(server);
        receiver
    }

    fn spans(&self) -> Vec<Got> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits until `find` finds what it looks for in the spans received.
    async fn wait_for<T>(&self, within: Duration, find: impl Fn(&[Got]) -> Option<T>) -> T {
        let found = support::wait_for(within, || {
            let got = find(&self.spans());
            async move { got }
        })
        .await;
        found.unwrap_or_else(|| {
            let names: Vec<String> = self
                .spans()
                .iter()
                .map(|s| format!("{} [{}] {:?}", s.name, s.trace, s.attrs.get("saga.id")))
                .collect();
            panic!("not received within {within:?}; spans: {names:#?}")
        })
    }
}

fn text(value: Option<AnyValue>) -> String {
    match value {
        Some(AnyValue::StringValue(s)) => s,
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        Some(AnyValue::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

/// The span of a name in `trace` (None when it is not there).
fn named<'a>(spans: &'a [Got], trace: &str, name: &str) -> Option<&'a Got> {
    spans.iter().find(|s| s.trace == trace && s.name == name)
}

/// A server with traces to `endpoint` (None: traces off), and its log.
async fn server_logged(
    db: &TestDb,
    ai_url: &str,
    logs: &mut Logs,
    endpoint: Option<&str>,
    batch_delay: &str,
) -> (Server, PathBuf) {
    server_with(db, ai_url, logs, endpoint, batch_delay, &[]).await
}

async fn server_with(
    db: &TestDb,
    ai_url: &str,
    logs: &mut Logs,
    endpoint: Option<&str>,
    batch_delay: &str,
    more: &[(&str, &str)],
) -> (Server, PathBuf) {
    let http = support::http_client();
    let mut env = vec![("STAGEHAND_OTLP_BATCH_DELAY", batch_delay)];
    env.extend_from_slice(more);
    if let Some(endpoint) = endpoint {
        env.push(("STAGEHAND_OTLP_ENDPOINT", endpoint));
    }
    let log = logs.next();
    (
        Server::start_with(&db.url, ai_url, &log, &http, &env).await,
        log,
    )
}

async fn server(
    db: &TestDb,
    ai_url: &str,
    logs: &mut Logs,
    endpoint: Option<&str>,
    batch_delay: &str,
) -> Server {
    server_logged(db, ai_url, logs, endpoint, batch_delay)
        .await
        .0
}

/// A session on a new experience of `base`: (session id, token).
async fn session(http: &reqwest::Client, base: &str) -> (String, String) {
    let slug = support::create_experience(http, base, 10).await;
    support::create_session(http, base, &slug, None, "ada").await
}

/// Submits and returns the saga id of the 202.
async fn submit(http: &reqwest::Client, base: &str, sid: &str, token: &str) -> String {
    let resp = support::submit(http, base, sid, token, json!({"prompt": "a cat"}), "k1").await;
    assert_eq!(resp.status(), 202);
    let body: Value = resp.json().await.unwrap();
    body["saga_id"].as_str().unwrap().to_owned()
}

const SUBMISSION: &str = "POST /api/sessions/{id}/submission";

/// The spans of one run of a saga: its `saga` span and the step spans
/// under it, checked for their parents and attributes. Returns the `saga`
/// span.
fn check_run<'a>(spans: &'a [Got], saga: &'a Got, saga_id: &str, session_id: &str) -> &'a Got {
    assert_eq!(saga.attr("saga.id"), Some(saga_id), "{saga:?}");
    assert_eq!(saga.attr("session.id"), Some(session_id), "{saga:?}");
    let steps: Vec<&Got> = spans
        .iter()
        .filter(|s| s.parent == saga.id && s.name.starts_with("saga step "))
        .collect();
    for step in &steps {
        assert_eq!(step.trace, saga.trace, "{step:?}");
        assert_eq!(step.attr("saga.id"), Some(saga_id), "{step:?}");
        assert_eq!(step.attr("session.id"), Some(session_id), "{step:?}");
        assert_eq!(step.attr("ai.provider"), Some("default"), "{step:?}");
        assert!(step.attr("experience").is_some(), "{step:?}");
        assert_eq!(
            step.attr("step"),
            step.name.strip_prefix("saga step "),
            "{step:?}"
        );
    }
    saga
}

/// Every step of a completed saga under its run's span, and the AI
/// requests (a submit unless the run adopted the job, polls) under its AI
/// step, all with the job's id.
fn check_completed_run(
    spans: &[Got],
    saga: &Got,
    saga_id: &str,
    session_id: &str,
    submitted: bool,
) {
    check_run(spans, saga, saga_id, session_id);
    let step = |name: &str| {
        spans
            .iter()
            .find(|s| s.parent == saga.id && s.name == name)
            .unwrap_or_else(|| panic!("no {name} under {saga:?}"))
    };
    let ai = step("saga step AI_PENDING");
    step("saga step AI_DONE");
    step("saga step RANKING_DONE");
    let job_id = ai.attr("ai.job_id").expect("the AI step has the job id");
    let requests: Vec<&Got> = spans.iter().filter(|s| s.parent == ai.id).collect();
    assert_eq!(
        requests.iter().any(|s| s.name == "AI submit"),
        submitted,
        "{requests:?}"
    );
    assert!(requests.iter().any(|s| s.name == "AI poll"), "{requests:?}");
    for request in requests {
        assert_eq!(request.trace, saga.trace);
        assert_eq!(request.attr("ai.job_id"), Some(job_id), "{request:?}");
        assert_eq!(request.attr("saga.id"), Some(saga_id), "{request:?}");
        assert_eq!(request.attr("ai.provider"), Some("default"), "{request:?}");
    }
}

async fn one_trace_per_submission(backend: Backend) {
    let receiver = Receiver::start();
    let sim = support::start_sim(support::fast_sim()).await;
    let db = TestDb::fresh(backend).await;
    let mut logs = Logs::new();
    let http = support::http_client();
    // Batches wait an hour: only the flush at shutdown sends them.
    let mut server = server(&db, &sim.url(), &mut logs, Some(&receiver.url), "1h").await;
    let (sid, token) = session(&http, &server.base).await;
    let saga_id = submit(&http, &server.base, &sid, &token).await;
    let done =
        support::wait_final(&http, &server.base, &sid, &token, Duration::from_secs(20)).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    server.sigterm();
    assert!(server.exited(Duration::from_secs(30)).await.is_some());

    let spans = receiver.spans();
    let request = spans
        .iter()
        .find(|s| s.name == SUBMISSION)
        .unwrap_or_else(|| panic!("no submission span in {spans:#?}"));
    assert_eq!(request.parent, "", "the request is the root of its trace");
    let saga = named(&spans, &request.trace, "saga").expect("the saga's span in the trace");
    assert_eq!(
        saga.parent, request.id,
        "the saga is a child of its request"
    );
    check_completed_run(&spans, saga, &saga_id, &sid, true);
    let runs = spans.iter().filter(|s| s.name == "saga").count();
    assert_eq!(runs, 1, "one run");
}
db_test!(one_trace_per_submission);

/// A saga whose worker died (kill -9) mid-AI-step is resumed by another
/// server after its lease: a new trace, linked to the submission's. Then
/// an operator's retry of a saga that failed: a new trace again, linked to
/// the trace it ran in.
async fn resumed_and_retried_sagas_get_linked_traces(backend: Backend) {
    let receiver = Receiver::start();
    let sim = support::start_sim(support::fast_sim()).await;
    let db = TestDb::fresh(backend).await;
    let mut logs = Logs::new();
    let http = support::http_client();
    let mut first = server(&db, &sim.url(), &mut logs, Some(&receiver.url), "50ms").await;
    // A job that outlives the first server (its result is ready for the
    // second one).
    sim.control.set_latency(Duration::from_secs(5));
    let (sid, token) = session(&http, &first.base).await;
    let saga_id = submit(&http, &first.base, &sid, &token).await;
    let request = receiver
        .wait_for(Duration::from_secs(20), |spans| {
            spans.iter().find(|s| s.name == SUBMISSION).cloned()
        })
        .await;
    let store = db.store().await;
    let submitted = support::wait_for(Duration::from_secs(20), || {
        let store = store.clone();
        let saga_id = saga_id.clone();
        async move {
            store
                .saga(&saga_id)
                .await
                .unwrap()
                .filter(|s| s.ai_job_id.is_some())
        }
    })
    .await
    .expect("the first server submitted the AI job");
    assert_eq!(
        submitted.trace_context,
        Some(format!("00-{}-{}-01", request.trace, request.id)),
        "the saga stores its request's traceparent"
    );
    first.kill9();
    sim.control.set_latency(Duration::from_millis(100));
    let second = server(&db, &sim.url(), &mut logs, Some(&receiver.url), "50ms").await;
    let done =
        support::wait_final(&http, &second.base, &sid, &token, Duration::from_secs(30)).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    let resumed = receiver
        .wait_for(Duration::from_secs(20), |spans| {
            spans
                .iter()
                .find(|s| s.name == "saga" && s.attr("saga.id") == Some(saga_id.as_str()))
                .filter(|s| {
                    named(spans, &s.trace, "saga step RANKING_DONE").is_some()
                        && named(spans, &s.trace, "AI poll").is_some()
                })
                .cloned()
        })
        .await;
    let spans = receiver.spans();
    assert_ne!(resumed.trace, request.trace, "a new trace");
    assert_eq!(resumed.parent, "", "the resumed run is its trace's root");
    assert_eq!(resumed.attr("saga.recoveries"), Some("1"));
    assert_eq!(
        resumed.links,
        vec![(request.trace.clone(), request.id.clone())],
        "linked to the submission's request"
    );
    check_completed_run(&spans, &resumed, &saga_id, &sid, false);
    let after = store.saga(&saga_id).await.unwrap().unwrap();
    assert_eq!(
        after.trace_context,
        Some(format!("00-{}-{}-01", resumed.trace, resumed.id)),
        "later runs join the resumed run's trace"
    );

    // A saga that fails for good, then is retried by an operator.
    sim.control.fail_next(3);
    let (sid, token) = session(&http, &second.base).await;
    let saga_id = submit(&http, &second.base, &sid, &token).await;
    let done =
        support::wait_final(&http, &second.base, &sid, &token, Duration::from_secs(30)).await;
    assert_eq!(done["status"], "ABORTED", "{done}");
    let request = receiver
        .wait_for(Duration::from_secs(20), |spans| {
            let saga = spans
                .iter()
                .find(|s| s.name == "saga" && s.attr("saga.id") == Some(saga_id.as_str()))?;
            spans
                .iter()
                .find(|s| s.name == SUBMISSION && s.id == saga.parent)
                .cloned()
        })
        .await;
    let resp = http
        .post(format!("{}/api/admin/sagas/{saga_id}/retry", second.base))
        .bearer_auth(support::OPERATOR)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    let done =
        support::wait_final(&http, &second.base, &sid, &token, Duration::from_secs(30)).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    let retried = receiver
        .wait_for(Duration::from_secs(20), |spans| {
            spans
                .iter()
                .find(|s| {
                    s.name == "saga"
                        && s.attr("saga.id") == Some(saga_id.as_str())
                        && s.trace != request.trace
                })
                .filter(|s| named(spans, &s.trace, "saga step RANKING_DONE").is_some())
                .cloned()
        })
        .await;
    let spans = receiver.spans();
    // Its failed attempts, each a run after a backoff, stayed in the
    // submission's trace.
    let first_runs = spans
        .iter()
        .filter(|s| s.name == "saga" && s.trace == request.trace)
        .count();
    assert!(
        first_runs >= 2,
        "{first_runs} runs in the submission's trace"
    );
    assert_eq!(retried.parent, "");
    assert_eq!(
        retried.links,
        vec![(request.trace.clone(), request.id.clone())],
        "the retry's trace is linked to the submission's"
    );
    check_completed_run(&spans, &retried, &saga_id, &sid, true);
}
db_test!(resumed_and_retried_sagas_get_linked_traces);

/// A saga handed over at shutdown (SIGTERM while its AI job runs) is
/// resumed by the next server at once, without a recovery: a new trace
/// linked to the submission's, while the run before the hand-over stayed
/// in the submission's trace (its spans sent by the flush at shutdown).
async fn a_handed_over_saga_gets_a_linked_trace(backend: Backend) {
    let receiver = Receiver::start();
    let sim = support::start_sim(support::fast_sim()).await;
    let db = TestDb::fresh(backend).await;
    let mut logs = Logs::new();
    let http = support::http_client();
    let quick_stop = [("STAGEHAND_SHUTDOWN_GRACE", "100ms")];
    let (mut first, _) = server_with(
        &db,
        &sim.url(),
        &mut logs,
        Some(&receiver.url),
        "1h",
        &quick_stop,
    )
    .await;
    sim.control.set_latency(Duration::from_secs(3));
    let (sid, token) = session(&http, &first.base).await;
    let saga_id = submit(&http, &first.base, &sid, &token).await;
    let store = db.store().await;
    support::wait_for(Duration::from_secs(20), || {
        let store = store.clone();
        let saga_id = saga_id.clone();
        async move {
            store
                .saga(&saga_id)
                .await
                .unwrap()
                .filter(|s| s.ai_job_id.is_some())
        }
    })
    .await
    .expect("the first server submitted the AI job");
    first.sigterm();
    assert!(first.exited(Duration::from_secs(30)).await.is_some());
    let handed = store.saga(&saga_id).await.unwrap().unwrap();
    assert!(handed.handed_over, "{handed:?}");
    let spans = receiver.spans();
    let request = spans
        .iter()
        .find(|s| s.name == SUBMISSION)
        .cloned()
        .expect("the request's span, sent at shutdown");
    let before =
        named(&spans, &request.trace, "saga").expect("the first run, in the request's trace");
    assert_eq!(before.parent, request.id);

    let (second, _) = server_with(
        &db,
        &sim.url(),
        &mut logs,
        Some(&receiver.url),
        "50ms",
        &quick_stop,
    )
    .await;
    let done =
        support::wait_final(&http, &second.base, &sid, &token, Duration::from_secs(30)).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    let resumed = receiver
        .wait_for(Duration::from_secs(20), |spans| {
            spans
                .iter()
                .find(|s| s.name == "saga" && s.trace != request.trace)
                .filter(|s| named(spans, &s.trace, "saga step RANKING_DONE").is_some())
                .cloned()
        })
        .await;
    assert_eq!(resumed.attr("saga.id"), Some(saga_id.as_str()));
    assert_eq!(resumed.parent, "");
    assert_eq!(
        resumed.attr("saga.recoveries"),
        Some("0"),
        "no recovery used"
    );
    assert_eq!(
        resumed.links,
        vec![(request.trace.clone(), request.id.clone())],
        "linked to the submission's request"
    );
    check_completed_run(&receiver.spans(), &resumed, &saga_id, &sid, false);
}
db_test!(a_handed_over_saga_gets_a_linked_trace);

/// The median of some durations.
fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// A collector that is down (a closed port): side by side with a server
/// without traces, submissions are answered as fast and sagas end as
/// fast, the failure is logged once, and the server still stops promptly.
async fn a_collector_that_is_down_costs_nothing(backend: Backend) {
    let sim = support::start_sim(support::fast_sim()).await;
    let (db_off, db_down) = (TestDb::fresh(backend).await, TestDb::fresh(backend).await);
    let mut logs = Logs::new();
    let http = support::http_client();
    let closed = format!("http://127.0.0.1:{}", support::free_port());
    let off = server(&db_off, &sim.url(), &mut logs, None, "10ms").await;
    let (mut down, down_log) =
        server_logged(&db_down, &sim.url(), &mut logs, Some(&closed), "10ms").await;
    const ROUNDS: usize = 12;
    let mut answer: [Vec<Duration>; 2] = Default::default();
    let mut end: [Vec<Duration>; 2] = Default::default();
    for round in 0..ROUNDS {
        // Alternate which goes first, so neither always meets a warmer
        // machine.
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for which in order {
            let base = [&off.base, &down.base][which];
            let (sid, token) = session(&http, base).await;
            let started = Instant::now();
            submit(&http, base, &sid, &token).await;
            answer[which].push(started.elapsed());
            let done =
                support::wait_final(&http, base, &sid, &token, Duration::from_secs(20)).await;
            assert_eq!(done["status"], "COMPLETED", "{done}");
            end[which].push(started.elapsed());
        }
    }
    let [answer_off, answer_down] = answer.map(median);
    let [end_off, end_down] = end.map(median);
    eprintln!(
        "median 202: {answer_off:?} off, {answer_down:?} collector down; \
         median saga end: {end_off:?} off, {end_down:?} collector down"
    );
    assert!(
        answer_down <= answer_off * 2 + Duration::from_millis(50),
        "the 202 took {answer_down:?} with the collector down, {answer_off:?} without traces"
    );
    assert!(
        end_down <= end_off * 3 / 2 + Duration::from_millis(200),
        "the saga took {end_down:?} with the collector down, {end_off:?} without traces"
    );
    let stopping = Instant::now();
    down.sigterm();
    assert!(
        down.exited(Duration::from_secs(30)).await.is_some(),
        "the server stops"
    );
    // The drain's grace is 10 s at most (nothing runs); the flush is
    // bounded by 5 s.
    assert!(
        stopping.elapsed() < Duration::from_secs(10),
        "stopping took {:?}",
        stopping.elapsed()
    );
    let log = std::fs::read_to_string(&down_log).unwrap();
    let failures = log.matches("OTLP export failed").count();
    assert_eq!(failures, 1, "said once:\n{log}");
    let about_export: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .filter(|l| {
            let l = l.to_lowercase();
            l.contains("otlp") || l.contains("opentelemetry") || l.contains("export")
        })
        .collect();
    assert_eq!(
        about_export.len(),
        1,
        "nothing else about it: {about_export:#?}"
    );
}
db_test!(a_collector_that_is_down_costs_nothing);
