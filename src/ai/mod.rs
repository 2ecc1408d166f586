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

pub use client::{
    AiClient, CancelOutcome, InputPhoto, JobOrder, JobStatus, JobView, Lookup, MaybeMade,
    PhotoPrint,
};
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

    /// Before serving: the models this provider is configured to use, as
    /// its vendor lists them. `Err`: the start stops, saying what to change
    /// (a model the vendor shut down or does not have, a refused key). The
    /// job API has nothing to check.
    pub async fn check_models(&self, today: chrono::NaiveDate) -> Result<Vec<ModelNotice>, String> {
        match self {
            AiProvider::Jobs(_) => Ok(Vec::new()),
            AiProvider::OpenAi(client) => client.check_models(today).await,
            AiProvider::Replicate(client) => client.check_model().await,
        }
    }

    /// The base URL requests go to: its origin is where result files may
    /// always be fetched from.
    pub fn base_url(&self) -> &str {
        match self {
            AiProvider::Jobs(client) => client.base_url(),
            AiProvider::OpenAi(client) => client.base_url(),
            AiProvider::Replicate(client) => client.base_url(),
        }
    }

    /// The origins the vendor documents its output files on, besides its
    /// API's own: Replicate's file delivery host, OpenAI's image URLs.
    /// (`*.` covers every subdomain.)
    pub fn documented_result_origins(&self) -> &'static [&'static str] {
        match self {
            AiProvider::Jobs(_) => &[],
            AiProvider::OpenAi(_) => &["https://oaidalleapiprodscus.blob.core.windows.net"],
            AiProvider::Replicate(_) => {
                &["https://replicate.delivery", "https://*.replicate.delivery"]
            }
        }
    }

    /// How long after the last send under a key no job made by it can
    /// still run, when the provider promises such a bound: Replicate ends
    /// every prediction at its `Cancel-After` deadline, and an OpenAI call
    /// is over when its request is. None: the job API's jobs have no
    /// deadline, and its key always finds the job.
    pub fn jobs_end_within_ms(&self) -> Option<i64> {
        match self {
            AiProvider::Jobs(_) => None,
            AiProvider::OpenAi(client) => Some(client.jobs_end_within_ms()),
            AiProvider::Replicate(client) => Some(client.jobs_end_within_ms()),
        }
    }

    /// Whether a job can be looked for by its order without making one
    /// (OpenAI's calls cannot: sending one again is a new generation).
    pub fn can_look(&self) -> bool {
        !matches!(self, AiProvider::OpenAi(_))
    }

    pub fn kind(&self) -> ProviderKind {
        match self {
            AiProvider::Jobs(_) => ProviderKind::Jobs,
            AiProvider::OpenAi(_) => ProviderKind::Openai,
            AiProvider::Replicate(_) => ProviderKind::Replicate,
        }
    }
}

/// A model a provider is configured to use, as its vendor listed it at
/// start: shown in the providers view and on /ops, so an announced
/// shutdown is seen before the doors open.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct ModelNotice {
    /// What it is used for: `chat` or `image` (OpenAI), `model` or
    /// `version` (Replicate).
    #[serde(rename = "use")]
    pub used_for: String,
    pub model: String,
    /// `YYYY-MM-DD`: the vendor announced that the model shuts down then.
    pub shutdown_date: Option<String>,
}

impl ModelNotice {
    pub fn new(used_for: &str, model: &str) -> ModelNotice {
        ModelNotice {
            used_for: used_for.to_owned(),
            model: model.to_owned(),
            shutdown_date: None,
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
