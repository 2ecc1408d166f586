//! Mail's way out: a room of its own, as media and print are. A [`Mailer`]
//! holds the SMTP connection settings (from the environment only: the
//! URL, the user name and the password are never stored or logged), makes
//! a guest's mail ([`Letter`]: a plain-text part, an HTML part with the
//! picture inline, and the full file attached when the experience says
//! so) and sends it with `lettre`, saying whether a failure is temporary
//! (a 4xx, or no answer: try again) or permanent (a 5xx). Nothing here
//! touches the database; the mail sender (`crate::actors::mail_sender`)
//! does.

use std::time::Duration;

use lettre::message::header::ContentType;
use lettre::message::{Attachment, Mailbox, MultiPart};
use lettre::transport::smtp::authentication::Credentials;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

/// The longest one SMTP command may wait for its answer.
pub const SMTP_TIMEOUT: Duration = Duration::from_secs(30);

/// Where mail goes, as the configuration says.
#[derive(Clone)]
pub struct MailSettings {
    /// `smtp://host:port`, `smtp://host:587?tls=required`, `smtps://host`.
    pub url: String,
    pub username: Option<String>,
    pub password: Option<String>,
    /// The sender: `Name <address>` or an address.
    pub from: String,
}

/// Why the mail settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum MailSetupError {
    #[error("STAGEHAND_SMTP_URL is not an SMTP URL (smtp://host:port or smtps://host:port)")]
    Url,
    #[error("STAGEHAND_MAIL_FROM is needed with STAGEHAND_SMTP_URL")]
    NoSender,
    #[error("STAGEHAND_MAIL_FROM is not an address: {0}")]
    Sender(String),
}

/// How one attempt ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendFailure {
    /// A 4xx, a dropped connection, no answer: the mail may be sent again.
    #[error("{0}")]
    Temporary(String),
    /// A 5xx, or a mail the server will never take: it has failed.
    #[error("{0}")]
    Permanent(String),
}

/// A file in a mail.
#[derive(Debug, Clone)]
pub struct Part {
    pub bytes: Vec<u8>,
    pub content_type: String,
    pub filename: String,
}

/// One guest's mail, in words and files.
#[derive(Debug, Clone)]
pub struct Letter {
    pub to: String,
    /// `<id@domain>` ([`crate::domain::mail::message_id`]).
    pub message_id: String,
    pub subject: String,
    pub text: String,
    pub html: String,
    /// The picture shown in the HTML part (`cid:` [`IMAGE_CID`]).
    pub image: Option<Part>,
    /// The full file, when the experience attaches it.
    pub attachment: Option<Part>,
}

/// The Content-ID of the picture in the HTML part.
pub const IMAGE_CID: &str = "result";

/// Sends guests' mail; one per process, cheap to clone (its connections
/// are pooled).
#[derive(Clone)]
pub struct Mailer {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    /// `host:port`, for the logs (never the credentials).
    server: String,
}

impl Mailer {
    pub fn new(settings: &MailSettings) -> Result<Mailer, MailSetupError> {
        let url = reqwest::Url::parse(&settings.url).map_err(|_| MailSetupError::Url)?;
        if !matches!(url.scheme(), "smtp" | "smtps") || url.host_str().is_none() {
            return Err(MailSetupError::Url);
        }
        let server = format!(
            "{}:{}",
            url.host_str().unwrap_or_default(),
            url.port()
                .unwrap_or(if url.scheme() == "smtps" { 465 } else { 25 })
        );
        let mut builder = AsyncSmtpTransport::<Tokio1Executor>::from_url(&settings.url)
            .map_err(|_| MailSetupError::Url)?
            .timeout(Some(SMTP_TIMEOUT));
        if let (Some(user), Some(password)) = (&settings.username, &settings.password) {
            builder = builder.credentials(Credentials::new(user.clone(), password.clone()));
        }
        if settings.from.trim().is_empty() {
            return Err(MailSetupError::NoSender);
        }
        let from: Mailbox = settings
            .from
            .parse()
            .map_err(|e: lettre::address::AddressError| MailSetupError::Sender(e.to_string()))?;
        Ok(Mailer {
            transport: builder.build(),
            from,
            server,
        })
    }

    /// The sender's domain: the right part of every `Message-ID`.
    pub fn domain(&self) -> &str {
        self.from.email.domain()
    }

    /// `host:port` of the SMTP server.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Whether lettre takes `address` as a recipient (after
    /// [`crate::domain::mail::check_address`] did).
    pub fn takes(address: &str) -> bool {
        address.parse::<lettre::Address>().is_ok()
    }

    /// The mail `letter` makes: `multipart/mixed` (when a file is attached)
    /// of `multipart/related` (the text and HTML alternatives, and the
    /// picture inline).
    pub fn compose(&self, letter: Letter) -> Result<Message, SendFailure> {
        let to: Mailbox = letter
            .to
            .parse()
            .map_err(|e| SendFailure::Permanent(format!("the address is not taken: {e}")))?;
        let alternative = MultiPart::alternative_plain_html(letter.text, letter.html);
        let shown = match letter.image {
            Some(image) => MultiPart::related().multipart(alternative).singlepart(
                Attachment::new_inline(IMAGE_CID.to_owned())
                    .body(image.bytes, content_type(&image.content_type)),
            ),
            None => alternative,
        };
        let body = match letter.attachment {
            Some(file) => MultiPart::mixed().multipart(shown).singlepart(
                Attachment::new(file.filename).body(file.bytes, content_type(&file.content_type)),
            ),
            None => shown,
        };
        Message::builder()
            .from(self.from.clone())
            .to(to)
            .subject(letter.subject)
            .message_id(Some(letter.message_id))
            .multipart(body)
            .map_err(|e| SendFailure::Permanent(format!("the mail could not be made: {e}")))
    }

    /// One attempt at sending `message`.
    pub async fn send(&self, message: &Message) -> Result<(), SendFailure> {
        match self.transport.send(message.clone()).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_permanent() => Err(SendFailure::Permanent(answer_of(&e))),
            Err(e) => Err(SendFailure::Temporary(answer_of(&e))),
        }
    }
}

/// What the server answered, in one line without the client's details.
fn answer_of(error: &lettre::transport::smtp::Error) -> String {
    let text = error.to_string().replace(['\r', '\n'], " ");
    let text: String = text.chars().take(300).collect();
    // lettre's text of an answer names its code ("permanent error (550):
    // 5.1.1 …").
    match error.status() {
        Some(_) => text,
        None if error.is_timeout() => format!("no answer in {} s", SMTP_TIMEOUT.as_secs()),
        None => format!("not reached: {text}"),
    }
}

fn content_type(text: &str) -> ContentType {
    ContentType::parse(text)
        .or_else(|_| ContentType::parse("application/octet-stream"))
        .unwrap_or(ContentType::TEXT_PLAIN)
}
