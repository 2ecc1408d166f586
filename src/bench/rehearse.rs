//! `stagehand rehearse`: replays a synthetic event day against a server and
//! prints the figures an event team needs before doors open.
//! (Being written: see issue 9.)

/// Flags of `stagehand rehearse`.
#[derive(Debug, Clone, clap::Args)]
pub struct RehearseArgs {}

pub async fn run(_args: RehearseArgs) -> Result<(), String> {
    Err("rehearse is not built yet".into())
}
