//! AiActor: the only place that talks to an AI provider (one actor per
//! provider). Every outside failure arrives here already translated into
//! an [`AiFailure`] by the client. It reads and writes the database only
//! through the provider's shared guards: a wait the provider named holds
//! back every request until it is over (never sent: the saga sees it as a
//! throttle), the rate limit takes a request (one statement) before each
//! call, and the breaker writes its row when its state changes. Each call's outcome goes to the provider's
//! circuit breaker ([`ProviderBreaker::record`], with what the request
//! was: a submit and when it was sent, which may be the breaker's probe,
//! or a request about an existing job, which never is), which writes the
//! shared state after the call when it changes, and to the metrics: each request's
//! latency by outcome ([`metrics::ai_request`]) and each job's time from
//! submit to final status ([`AiJobTimes`]). A request refused by our own
//! rate limit is never sent, so it is not timed.
//!
//! An unclear submit (the answer lost after the request went out) to a
//! provider whose key finds the job it made (the job API) is asked again
//! with the same key at once, and the breaker hears only what that second
//! ask got: a provider that loses answers but keeps its jobs is not down,
//! and its breaker's probe is settled by the retry rather than failed by
//! the lost answer (the probe otherwise waits out another cool-down for
//! each lost answer). Providers without such a key (OpenAI, Replicate)
//! leave an unclear submit to the saga, which looks for the job before it
//! makes another.

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;

use super::breaker::{ProviderBreaker, ProviderRate, Request};
use crate::ai::{AiProvider, CancelOutcome, JobOrder, JobView};
use crate::domain::failure::AiFailure;
use crate::metrics::{self, AiJobTimes, AiRequest};

/// Submit a job (idempotent through the order's key).
#[derive(Message)]
#[rtype(result = "Result<JobView, AiFailure>")]
pub struct SubmitJob(pub JobOrder);

/// Read a job's status.
#[derive(Message)]
#[rtype(result = "Result<JobView, AiFailure>")]
pub struct PollJob(pub String);

/// Ask the provider to stop a job nobody needs any more (see
/// [`CancelOutcome`]).
#[derive(Message)]
#[rtype(result = "Result<CancelOutcome, AiFailure>")]
pub struct CancelJob(pub String);

pub struct AiActor {
    /// The job API client or the OpenAI-compatible adapter.
    client: AiProvider,
    breaker: Option<Arc<ProviderBreaker>>,
    rate: Option<Arc<ProviderRate>>,
    /// When this process submitted each job still running.
    jobs: Arc<AiJobTimes>,
}

impl AiActor {
    pub fn new(client: impl Into<AiProvider>) -> Self {
        AiActor {
            client: client.into(),
            breaker: None,
            rate: None,
            jobs: Arc::default(),
        }
    }

    /// Takes a request of `rate` before every call.
    pub fn with_rate_limit(mut self, rate: Option<Arc<ProviderRate>>) -> Self {
        self.rate = rate;
        self
    }

    /// Reports every call's outcome to `breaker`.
    pub fn with_breaker(mut self, breaker: Arc<ProviderBreaker>) -> Self {
        self.breaker = Some(breaker);
        self
    }
}

impl Actor for AiActor {
    type Context = Context<Self>;
}

/// The answer of one request to the provider.
type Answer = Result<JobView, AiFailure>;

impl AiActor {
    /// One request: waits for the shared rate limit, sends it with `send`,
    /// then reports its outcome to the metrics (`request`, and the job
    /// timings through `timed`) and to the breaker.
    fn request<Send, Sent>(
        &self,
        request: AiRequest,
        send: Send,
        timed: impl FnOnce(&AiJobTimes, &Answer, Instant) + 'static,
    ) -> ResponseFuture<Answer>
    where
        Send: Fn(AiProvider) -> Sent + 'static,
        Sent: std::future::Future<Output = Answer> + 'static,
    {
        let (client, breaker, rate, jobs) = (
            self.client.clone(),
            self.breaker.clone(),
            self.rate.clone(),
            self.jobs.clone(),
        );
        Box::pin(async move {
            held_back(breaker.as_deref())?;
            if let Some(rate) = rate {
                rate.take().await?;
            }
            let sent_at = Instant::now();
            let asked = match (&breaker, request) {
                (Some(breaker), AiRequest::Submit) => breaker.submit_sent(),
                _ => Request::OfAJob,
            };
            let mut outcome = send(client.clone()).await;
            metrics::ai_request(request, &outcome, sent_at.elapsed());
            // What the breaker hears: the second ask's outcome, when there
            // is one.
            let mut heard = None;
            if settled_by_its_key(&client, request, &outcome) {
                tracing::info!(provider = ?client.kind(), failure = ?outcome.as_ref().err(), "an unclear submit: asking again with its key before it counts");
                let again = Instant::now();
                let second = send(client).await;
                metrics::ai_request(request, &second, again.elapsed());
                // The saga gets the second answer only when the provider
                // answered the key; otherwise the job may exist still, and
                // the first (unclear) outcome stands.
                if provider_answered(&second) {
                    outcome = second;
                } else {
                    heard = Some(second);
                }
            }
            if let (
                Ok(JobView {
                    lookup: Some(lookup),
                    ..
                }),
                Some(breaker),
            ) = (&outcome, &breaker)
            {
                metrics::unclear_create(breaker.provider(), *lookup);
            }
            timed(&jobs, &outcome, sent_at);
            if let Some(breaker) = breaker {
                breaker.record(asked, heard.as_ref().unwrap_or(&outcome));
            }
            outcome
        })
    }
}

impl Handler<SubmitJob> for AiActor {
    type Result = ResponseFuture<Answer>;

    fn handle(&mut self, msg: SubmitJob, _: &mut Context<Self>) -> Self::Result {
        crate::metrics::actor_message("AiActor");
        let order = std::rc::Rc::new(msg.0);
        // A saga sending again a key whose outcome was unclear waits in
        // place holding its slot: it passes the breaker here, not at a claim.
        let resend = order.maybe_made.as_ref().is_some_and(|m| !m.look_only);
        let breaker = self.breaker.clone();
        let sent = self.request(
            AiRequest::Submit,
            move |client| {
                let order = order.clone();
                async move { client.submit(&order).await }
            },
            |jobs, outcome, sent_at| jobs.submitted(outcome, sent_at),
        );
        Box::pin(async move {
            if let (true, Some(breaker)) = (resend, &breaker) {
                if let Err(wait) = breaker.resend_admission().await {
                    return Err(AiFailure::Throttled {
                        retry_after_ms: wait,
                        detail: "the AI provider's circuit breaker is open: the unclear submit is asked again when it may be".to_owned(),
                    });
                }
            }
            sent.await
        })
    }
}

impl Handler<PollJob> for AiActor {
    type Result = ResponseFuture<Answer>;

    fn handle(&mut self, msg: PollJob, _: &mut Context<Self>) -> Self::Result {
        crate::metrics::actor_message("AiActor");
        let job_id = msg.0;
        let polled = job_id.clone();
        self.request(
            AiRequest::Poll,
            move |client| {
                let job_id = job_id.clone();
                async move { client.poll(&job_id).await }
            },
            move |jobs, outcome, _| jobs.polled(&polled, outcome),
        )
    }
}

impl Handler<CancelJob> for AiActor {
    type Result = ResponseFuture<Result<CancelOutcome, AiFailure>>;

    /// Under the same pause and rate limit as every other request; not
    /// timed as a job request. Its outcome never counts in the breaker: a
    /// cancel the provider refuses (a final job, a job it does not know)
    /// is not the provider being down, and polls and submits measure that.
    /// A wait it names holds back every request, like any other's.
    fn handle(&mut self, msg: CancelJob, _: &mut Context<Self>) -> Self::Result {
        crate::metrics::actor_message("AiActor");
        let (client, breaker, rate) =
            (self.client.clone(), self.breaker.clone(), self.rate.clone());
        Box::pin(async move {
            held_back(breaker.as_deref())?;
            if let Some(rate) = rate {
                rate.take().await?;
            }
            let outcome = client.cancel(&msg.0).await;
            // A wait it names is still the whole provider's.
            if let (Err(AiFailure::Throttled { retry_after_ms, .. }), Some(breaker)) =
                (&outcome, &breaker)
            {
                breaker.pause_for(*retry_after_ms);
            }
            outcome
        })
    }
}

/// Whether `outcome` of `request` is an unclear submit that the provider
/// settles when its key is asked again: the job API returns the job a key
/// made, and makes none twice.
fn settled_by_its_key(client: &AiProvider, request: AiRequest, outcome: &Answer) -> bool {
    request == AiRequest::Submit
        && client.kind() == crate::ai::ProviderKind::Jobs
        && matches!(outcome, Err(AiFailure::Unclear(_)))
}

/// Whether the provider answered a submit's key: with its job, or by a
/// refusal it made looking at the request (a 4xx, moderation, a failed
/// job). Anything else (unavailable, throttled, unclear again) says
/// nothing of a job an earlier send of the key may have made.
fn provider_answered(outcome: &Answer) -> bool {
    matches!(
        outcome,
        Ok(_)
            | Err(AiFailure::RequestRejected(_))
            | Err(AiFailure::ContentRejected(_))
            | Err(AiFailure::JobFailed(_))
    )
}

/// A request held back because the provider named a wait that is not over:
/// never sent, so neither timed nor counted by the breaker.
fn held_back(breaker: Option<&ProviderBreaker>) -> Result<(), AiFailure> {
    match breaker.and_then(ProviderBreaker::paused_for) {
        Some(left) => Err(AiFailure::Throttled {
            retry_after_ms: left,
            detail: "the AI provider asked every request to wait".to_owned(),
        }),
        None => Ok(()),
    }
}
