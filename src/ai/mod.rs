//! The AI side of stagehand: clients for the AI provider's job API (submit a
//! job, poll it) and the built-in simulator of that same API, which
//! `stagehand sim-ai` serves, `stagehand serve` starts in-process when no AI URL
//! is configured, and tests use as the fake provider.
//!
//! The second provider, an OpenAI-compatible API (chat completions and image
//! generation with a bearer key), is `openai`; the third, Replicate's
//! predictions API, is `replicate`; [`AiProvider`] is the choice.
//!
//! Every outside error of a provider becomes a
//! [`AiFailure`](crate::domain::failure::AiFailure) in `client` (job API),
//! `openai` or `replicate`, and nowhere else.

pub mod client;
pub mod openai;
pub mod providers;
pub mod replicate;
pub mod simulator;

pub use client::{AiClient, CancelOutcome, JobOrder, JobStatus, JobView};
pub use openai::{ApiKey, OpenAiClient, OpenAiSettings};
pub use replicate::{ReplicateClient, ReplicateSettings};
pub use simulator::{RunningSim, SimConfig, SimControl, SimFaults, SimStats};

/// Which provider `STAGEHAND_AI_PROVIDER` selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProviderKind {
    /// The job API of DESIGN.md (`STAGEHAND_AI_URL`, or the built-in
    /// simulator).
    Jobs,
    /// An OpenAI-compatible API (`STAGEHAND_OPENAI_*`), see [`openai`].
    Openai,
    /// Replicate's predictions API (a providers file's `kind = "replicate"`),
    /// see [`replicate`].
    Replicate,
}

/// The AI provider the AiActor talks to: one submit/poll shape for both.
/// The OpenAI-compatible one answers a submit with a job that is already
/// final, so the saga never polls it.
#[derive(Debug, Clone)]
pub enum AiProvider {
    Jobs(AiClient),
    OpenAi(OpenAiClient),
    Replicate(ReplicateClient),
}

impl AiProvider {
    pub async fn submit(
        &self,
        order: &JobOrder,
    ) -> Result<JobView, crate::domain::failure::AiFailure> {
        match self {
            AiProvider::Jobs(client) => client.submit(order).await,
            AiProvider::OpenAi(client) => client.submit(order).await,
            AiProvider::Replicate(client) => client.submit(order).await,
        }
    }

    pub async fn poll(&self, job_id: &str) -> Result<JobView, crate::domain::failure::AiFailure> {
        match self {
            AiProvider::Jobs(client) => client.poll(job_id).await,
            AiProvider::OpenAi(client) => client.poll(job_id).await,
            AiProvider::Replicate(client) => client.poll(job_id).await,
        }
    }

    /// Asks the provider to stop a job whose saga no longer needs it.
    /// The OpenAI-compatible adapter's jobs are final at submit: there is
    /// nothing to cancel.
    pub async fn cancel(
        &self,
        job_id: &str,
    ) -> Result<CancelOutcome, crate::domain::failure::AiFailure> {
        match self {
            AiProvider::Jobs(client) => client.cancel(job_id).await,
            AiProvider::OpenAi(_) => Ok(CancelOutcome::Unsupported),
            AiProvider::Replicate(client) => client.cancel(job_id).await,
        }
    }

    pub fn kind(&self) -> ProviderKind {
        match self {
            AiProvider::Jobs(_) => ProviderKind::Jobs,
            AiProvider::OpenAi(_) => ProviderKind::Openai,
            AiProvider::Replicate(_) => ProviderKind::Replicate,
        }
    }
}

impl From<AiClient> for AiProvider {
    fn from(client: AiClient) -> Self {
        AiProvider::Jobs(client)
    }
}

impl From<ReplicateClient> for AiProvider {
    fn from(client: ReplicateClient) -> Self {
        AiProvider::Replicate(client)
    }
}

impl From<OpenAiClient> for AiProvider {
    fn from(client: OpenAiClient) -> Self {
        AiProvider::OpenAi(client)
    }
}
