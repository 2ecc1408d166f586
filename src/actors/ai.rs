//! AiActor: the only place that talks to the AI provider. It has no database
//! access; every outside failure arrives here already translated into an
//! [`AiFailure`] by the client.

use actix::prelude::*;

use crate::ai::{AiClient, JobOrder, JobView};
use crate::domain::failure::AiFailure;

/// Submit a job (idempotent through the order's key).
#[derive(Message)]
#[rtype(result = "Result<JobView, AiFailure>")]
pub struct SubmitJob(pub JobOrder);

/// Read a job's status.
#[derive(Message)]
#[rtype(result = "Result<JobView, AiFailure>")]
pub struct PollJob(pub String);

pub struct AiActor {
    client: AiClient,
}

impl AiActor {
    pub fn new(client: AiClient) -> Self {
        AiActor { client }
    }
}

impl Actor for AiActor {
    type Context = Context<Self>;
}

impl Handler<SubmitJob> for AiActor {
    type Result = ResponseFuture<Result<JobView, AiFailure>>;

    fn handle(&mut self, msg: SubmitJob, _: &mut Context<Self>) -> Self::Result {
        let client = self.client.clone();
        Box::pin(async move { client.submit(&msg.0).await })
    }
}

impl Handler<PollJob> for AiActor {
    type Result = ResponseFuture<Result<JobView, AiFailure>>;

    fn handle(&mut self, msg: PollJob, _: &mut Context<Self>) -> Self::Result {
        let client = self.client.clone();
        Box::pin(async move { client.poll(&msg.0).await })
    }
}
