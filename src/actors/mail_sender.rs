//! MailSender: sends the guests' mails of the mail outbox over SMTP, at
//! least once, each with the `Message-ID` of its row.
//!
//! Each round (at once when a guest asks, else at least every [`ROUND`]):
//! when a queued mail is due, up to the free places ([`IN_FLIGHT`] at
//! once) are claimed ([`Store::claim_mails`], a lease under this actor's
//! token: no other instance sends them meanwhile) and each is sent on a
//! task of its own:
//! 1. its words and pictures are gathered: the experience's name, the
//!    operators' template in the mail's language (or the built-in one),
//!    the share link, the display-size picture (inline) and, when the
//!    experience attaches it, the full file;
//! 2. the mail is made and sent ([`Mailer`]);
//! 3. the outcome is written fenced on the lease: sent; a temporary
//!    failure (4xx, no answer) tried again after [`retry_after_ms`]; a
//!    permanent one (5xx) failed, with the server's answer for /ops (the
//!    address masked in it).
//!
//! A sender that dies mid-send leaves its lease: when it ends, any
//! instance claims the mail and sends it again, with the same
//! `Message-ID`, so a receiver that got both sees one message twice.
//! Nothing here holds a database connection while the SMTP server is
//! asked, and no saga waits for a mail.
//!
//! When full: at most [`IN_FLIGHT`] mails are in flight per instance; the
//! rest wait in the table, oldest due first (nothing is dropped).

use std::time::Duration;

use actix::prelude::*;
use serde_json::Value;
use tokio::task::JoinSet;

use super::run_on_runtime;
use super::wakeups::Wakeups;
use crate::clock::SharedClock;
use crate::domain::guests::share_path;
use crate::domain::locale::Locale;
use crate::domain::mail::{html_body, masked, message_id, retry_after_ms, Template};
use crate::domain::saga::Step;
use crate::mail::{Letter, Mailer, Part, SendFailure, IMAGE_CID};
use crate::media::MediaStore;
use crate::store::entities::mails;
use crate::store::mails::MailOutcome;
use crate::store::Store;

/// The longest a round waits.
pub const ROUND: Duration = Duration::from_secs(1);
/// Mails in flight from one instance at once.
pub const IN_FLIGHT: usize = 4;
/// The largest file attached; a larger one is left to the link.
pub const MAX_ATTACHMENT: usize = 15 * 1024 * 1024;

/// What the sender needs.
#[derive(Clone)]
pub struct MailDeps {
    pub store: Store,
    pub clock: SharedClock,
    pub wakeups: Wakeups,
    pub media: MediaStore,
    pub mailer: Mailer,
    pub instance_id: String,
    /// How long a claim holds a mail: longer than one attempt.
    pub lease_ms: i64,
}

pub struct MailSender {
    deps: MailDeps,
    running: Option<tokio::task::AbortHandle>,
}

impl MailSender {
    pub fn new(deps: MailDeps) -> MailSender {
        MailSender {
            deps,
            running: None,
        }
    }
}

impl Actor for MailSender {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let deps = self.deps.clone();
        self.running = Some(run_on_runtime(ctx, rounds(deps)));
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        if let Some(running) = self.running.take() {
            running.abort();
        }
    }
}

async fn rounds(deps: MailDeps) {
    let token = format!("{}:{}", deps.instance_id, uuid::Uuid::new_v4().simple());
    let mut sending: JoinSet<()> = JoinSet::new();
    loop {
        if let Err(e) = send_due(&deps, &token, &mut sending).await {
            tracing::warn!(error = %e, "mail round failed; the next round tries again");
        }
        tokio::select! {
            Some(_) = sending.join_next() => {}
            _ = deps.wakeups.mail.rung() => {}
            _ = tokio::time::sleep(ROUND) => {}
        }
    }
}

/// Claims and starts the due mails, up to the free places.
async fn send_due(
    deps: &MailDeps,
    token: &str,
    sending: &mut JoinSet<()>,
) -> Result<(), crate::store::StoreError> {
    let free = IN_FLIGHT.saturating_sub(sending.len());
    if free == 0 {
        return Ok(());
    }
    let now = deps.clock.now_ms();
    if deps.store.next_mail_due().await?.is_none_or(|at| at > now) {
        return Ok(());
    }
    for mail in deps
        .store
        .claim_mails(token, now, deps.lease_ms, free as i64)
        .await?
    {
        let (deps, token) = (deps.clone(), token.to_owned());
        crate::metrics::task_spawned("mail_sender.send");
        sending.spawn(async move { send_one(&deps, &token, &mail).await });
    }
    Ok(())
}

/// One attempt of `mail`, and its outcome written.
async fn send_one(deps: &MailDeps, token: &str, mail: &mails::Model) {
    // An attempt ends well inside its lease, so no other instance claims
    // the mail while this one may still be sending it.
    let bound = Duration::from_millis((deps.lease_ms.max(1) as u64) * 3 / 4);
    let attempt = match tokio::time::timeout(bound, attempt(deps, mail)).await {
        Ok(attempt) => attempt,
        Err(_) => Err(SendFailure::Temporary(format!(
            "not finished in {} ms",
            bound.as_millis()
        ))),
    };
    let now = deps.clock.now_ms();
    let address = mail.address.as_deref().unwrap_or_default();
    let (error, retry_at_ms, outcome) = match attempt {
        Ok(()) => (None, None, "sent"),
        Err(SendFailure::Permanent(why)) => (Some(hide(&why, address)), None, "failed"),
        Err(SendFailure::Temporary(why)) => {
            let retry = retry_after_ms(mail.attempts + 1).map(|after| now + after);
            let why = hide(&why, address);
            match retry {
                Some(at) => (Some(why), Some(at), "retry"),
                None => (
                    Some(format!(
                        "gave up after {} attempts: {why}",
                        mail.attempts + 1
                    )),
                    None,
                    "failed",
                ),
            }
        }
    };
    metrics::counter!(crate::metrics::MAILS, "outcome" => outcome).increment(1);
    match &error {
        None => tracing::info!(email_id = %mail.id, attempt = mail.attempts + 1, "mail sent"),
        Some(error) => {
            tracing::warn!(email_id = %mail.id, attempt = mail.attempts + 1, outcome, %error, "mail not sent")
        }
    }
    let written = MailOutcome { error, retry_at_ms };
    match deps.store.mail_answered(mail, token, &written, now).await {
        Ok(_) => deps.wakeups.stats.ring(),
        Err(e) => {
            tracing::warn!(email_id = %mail.id, error = %e, "the mail's outcome was not written; it is sent again after its lease")
        }
    }
}

/// The mail made and sent once.
async fn attempt(deps: &MailDeps, mail: &mails::Model) -> Result<(), SendFailure> {
    let letter = gather(deps, mail).await?;
    let message = deps.mailer.compose(letter)?;
    deps.mailer.send(&message).await
}

/// The SMTP answer with the address (which servers quote) masked.
fn hide(text: &str, address: &str) -> String {
    if address.is_empty() {
        return text.to_owned();
    }
    text.replace(address, &masked(address))
}

/// The mail's words and pictures: the experience's name and template, the
/// share link, the picture inline, the file attached when asked.
async fn gather(deps: &MailDeps, mail: &mails::Model) -> Result<Letter, SendFailure> {
    let store = &deps.store;
    let unread = |e: crate::store::StoreError| SendFailure::Temporary(format!("not read: {e}"));
    let to = mail
        .address
        .clone()
        .ok_or_else(|| SendFailure::Permanent("the address was erased".into()))?;
    let session = store
        .session(&mail.session_id)
        .await
        .map_err(unread)?
        .filter(|s| s.forgotten_at_ms.is_none())
        .ok_or_else(|| SendFailure::Permanent("the session was erased".into()))?;
    let experience = store
        .experience_by_id(&mail.experience_id)
        .await
        .map_err(unread)?
        .ok_or_else(|| SendFailure::Permanent("the experience was deleted".into()))?;
    let share_id = session
        .share_id
        .as_deref()
        .ok_or_else(|| SendFailure::Permanent("the session has no result link".into()))?;
    let items = result_items(store, &session.id).await.map_err(unread)?;
    let locale = Locale::of(&mail.locale);
    let template = match store.mail_template(locale.as_str()).await.map_err(unread)? {
        Some(saved) => Template {
            subject: saved.subject,
            body: saved.body,
        },
        None => Template::built_in(locale),
    };
    let link = store.hooks().link(&share_path(share_id));
    let (subject, text) = template.render(&experience.title, &link);
    let image = read_part(&deps.media, &items, "thumb_url", "result").await?;
    let attachment = if experience.mail_attach {
        read_part(&deps.media, &items, "url", "result")
            .await?
            .filter(|file| {
                let fits = file.bytes.len() <= MAX_ATTACHMENT;
                if !fits {
                    tracing::info!(email_id = %mail.id, bytes = file.bytes.len(), "the result is too large to attach; the mail carries its link");
                }
                fits
            })
    } else {
        None
    };
    let alt = locale.text("mail.image_alt");
    let html = html_body(
        &text,
        &link,
        image.as_ref().map(|_| IMAGE_CID),
        &alt,
        locale,
    );
    Ok(Letter {
        to,
        message_id: message_id(&mail.id, deps.mailer.domain()),
        subject,
        text,
        html,
        image,
        attachment,
    })
}

/// The content items of the session's completed result.
async fn result_items(
    store: &Store,
    session_id: &str,
) -> Result<Vec<Value>, crate::store::StoreError> {
    let saga = store
        .latest_saga_of_session(session_id)
        .await?
        .filter(|s| s.step == Step::Completed.as_str());
    Ok(saga
        .and_then(|s| s.content)
        .and_then(|c| serde_json::from_str::<Value>(&c).ok())
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default())
}

/// The kept file that the first image item's `field` names
/// (`/media/r/…`), as a part named `{stem}.{ext}`.
async fn read_part(
    media: &MediaStore,
    items: &[Value],
    field: &str,
    stem: &str,
) -> Result<Option<Part>, SendFailure> {
    let Some(key) = items
        .iter()
        .filter(|item| item["type"] == "image")
        .find_map(|item| item[field].as_str())
        .and_then(|url| url.strip_prefix("/media/"))
        .filter(|key| key.starts_with("r/"))
    else {
        return Ok(None);
    };
    let bytes = match media.get(key).await {
        Ok(bytes) => bytes,
        Err(crate::media::MediaError::NotFound(_)) => return Ok(None),
        Err(e) => {
            return Err(SendFailure::Temporary(format!(
                "the picture was not read: {e}"
            )))
        }
    };
    let ext = key.rsplit('.').next().unwrap_or("jpg").to_ascii_lowercase();
    let content_type = match ext.as_str() {
        "png" => "image/png",
        "webp" => "image/webp",
        "gif" => "image/gif",
        _ => "image/jpeg",
    };
    Ok(Some(Part {
        bytes: bytes.to_vec(),
        content_type: content_type.to_owned(),
        filename: format!("{stem}.{ext}"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_that_quotes_the_address_is_kept_with_it_masked() {
        let answer = "permanent error (550): 5.1.1 <guest@example.com>: Recipient address rejected";
        let kept = hide(answer, "guest@example.com");
        assert!(!kept.contains("guest@example.com"), "{kept}");
        assert!(kept.contains("g…@example.com"), "{kept}");
        assert_eq!(hide("451 try later", ""), "451 try later");
    }
}
