//! The IPP client of the print stations: one printer, named by its `ipp://`
//! or `ipps://` URI, asked what it can do and what state it is in
//! (Get-Printer-Attributes), given a photo (Print-Job), and asked about its
//! jobs (Get-Job-Attributes, Get-Jobs, Cancel-Job).
//!
//! The `ipp` crate only encodes the requests and decodes the answers; this
//! module sends them itself, as `POST` with `Content-Type: application/ipp`
//! over reqwest (`ipp://host:port/path` is `http://host:port/path`, port 631
//! when none is given; `ipps://` is `https://`), with no proxy and with
//! timeouts (5 s to connect, 30 s for a whole exchange). Every failure is
//! sorted into [`IppError`]: worth trying again later
//! ([`IppError::Unreachable`], [`IppError::Busy`]) or not
//! ([`IppError::Refused`], [`IppError::Malformed`]).

use std::fmt;
use std::io::Cursor;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ipp::attribute::{IppAttribute, IppAttributeGroup, IppAttributeName};
use ipp::model::{DelimiterTag, IppVersion, Operation};
use ipp::parser::IppParser;
use ipp::prelude::Uri;
use ipp::request::IppRequestResponse;
use ipp::value::IppValue;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// IPP's port, for `ipp://` and `ipps://` alike (RFC 8010, RFC 7472).
const DEFAULT_PORT: u16 = 631;
/// `requesting-user-name` of every request.
const USER_NAME: &str = "stagehand";

/// The attributes [`IppPrinter::capabilities`] asks for.
const PRINTER_ATTRIBUTES: [&str; 8] = [
    "printer-state",
    "printer-state-reasons",
    "document-format-supported",
    "media-supported",
    "media-ready",
    "printer-resolution-supported",
    "color-supported",
    "printer-is-accepting-jobs",
];

/// The attributes asked for about a job.
const JOB_ATTRIBUTES: [&str; 4] = ["job-id", "job-name", "job-state", "job-state-reasons"];

/// Why a request to a printer failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IppError {
    /// No answer: connection refused or timed out, or an HTTP 5xx. Try again later.
    #[error("printer unreachable: {0}")]
    Unreachable(String),
    /// No connection was made: the request never reached the printer (it
    /// is off, or not at that address). Try again later; nothing was sent.
    #[error("printer not reached: {0}")]
    NotConnected(String),
    /// The printer answered that it cannot take this now (`server-error-busy`,
    /// `server-error-not-accepting-jobs`, `server-error-temporary-error`,
    /// `server-error-service-unavailable`). Try again later.
    #[error("printer busy: {0}")]
    Busy(String),
    /// Any other error status, or an HTTP 4xx: trying again will not help.
    /// Starts with the IPP status name (`client-error-not-found: ...`).
    #[error("printer refused: {0}")]
    Refused(String),
    /// The answer could not be read as IPP, or lacked what it must carry.
    #[error("printer answer malformed: {0}")]
    Malformed(String),
}

impl IppError {
    /// Whether the same request may succeed later ([`IppError::Unreachable`], [`IppError::Busy`]).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            IppError::Unreachable(_) | IppError::NotConnected(_) | IppError::Busy(_)
        )
    }

    /// Whether the printer said the job (or printer) does not exist
    /// (`client-error-not-found`): a printer forgets finished jobs after a while.
    pub fn is_not_found(&self) -> bool {
        matches!(self, IppError::Refused(m) if m.starts_with("client-error-not-found"))
    }
}

/// `printer-state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrinterState {
    Idle,
    Processing,
    Stopped,
}

/// `job-state` (3..9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    Pending,
    Held,
    Processing,
    Stopped,
    Canceled,
    Aborted,
    Completed,
}

impl JobState {
    /// Canceled, aborted or completed: the job will not change any more.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Canceled | JobState::Aborted | JobState::Completed
        )
    }

    fn from_ipp(value: i32) -> Option<JobState> {
        Some(match value {
            3 => JobState::Pending,
            4 => JobState::Held,
            5 => JobState::Processing,
            6 => JobState::Stopped,
            7 => JobState::Canceled,
            8 => JobState::Aborted,
            9 => JobState::Completed,
            _ => return None,
        })
    }
}

/// What a printer can do and what state it is in (Get-Printer-Attributes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    pub state: PrinterState,
    /// `printer-state-reasons` as sent, "none" dropped: "media-empty",
    /// "media-needed", "paused", "offline-report", ...
    pub state_reasons: Vec<String>,
    /// `document-format-supported` (MIME types).
    pub formats: Vec<String>,
    /// `media-supported` (PWG 5101.1 names such as "na_index-4x6_4x6in").
    pub media_supported: Vec<String>,
    /// `media-ready`: what is loaded now; empty when nothing is.
    pub media_ready: Vec<String>,
    /// `printer-resolution-supported` as (cross-feed, feed) dots per inch.
    pub resolutions: Vec<(u32, u32)>,
    /// `color-supported`.
    pub color: bool,
    /// `printer-is-accepting-jobs`.
    pub accepting: bool,
}

impl Capabilities {
    /// Whether `printer-state-reasons` holds `reason`, with or without the
    /// severity suffix a printer may add ("media-empty" matches
    /// "media-empty-error").
    pub fn has_reason(&self, reason: &str) -> bool {
        self.state_reasons.iter().any(|r| {
            r == reason
                || ["-report", "-warning", "-error"]
                    .iter()
                    .any(|suffix| r.strip_suffix(suffix) == Some(reason))
        })
    }
}

/// A job as the printer reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobStatus {
    pub job_id: i32,
    pub state: JobState,
    /// `job-state-reasons`, "none" dropped.
    pub reasons: Vec<String>,
    pub name: Option<String>,
}

/// One printer, by its `ipp://` or `ipps://` URI. Cheap to clone.
#[derive(Clone)]
pub struct IppPrinter {
    /// The URI as given: the `printer-uri` of every request.
    uri: String,
    /// Where the requests are posted (`http://` or `https://`).
    endpoint: String,
    client: reqwest::Client,
}

impl fmt::Debug for IppPrinter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IppPrinter")
            .field("uri", &self.uri)
            .finish()
    }
}

impl IppPrinter {
    /// A printer by its URI; refuses anything but `ipp://` and `ipps://`.
    ///
    /// An `ipps://` printer's certificate is not verified: printers on a
    /// LAN present self-signed certificates, and the photo booth has no
    /// way to pin them. TLS there protects against reading on the wire,
    /// not against a printer impersonated on the LAN. (Not loading the
    /// system's roots also makes this cheap, about 30 µs, so a printer may
    /// be made for each exchange; an `ipp://` printer never uses TLS, as
    /// redirects are not followed.)
    pub fn new(uri: &str) -> Result<IppPrinter, IppError> {
        let uri = uri.trim();
        let endpoint = http_endpoint(uri)?;
        crate::ai::client::ensure_crypto_provider();
        let client = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .tls_danger_accept_invalid_certs(true)
            .build()
            .map_err(|err| {
                IppError::Refused(format!("cannot make an HTTP client: {}", chain(&err)))
            })?;
        Ok(IppPrinter {
            uri: uri.to_owned(),
            endpoint,
            client,
        })
    }

    /// The URI the printer was made with.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// Get-Printer-Attributes: state, loaded media, formats, resolutions.
    pub async fn capabilities(&self) -> Result<Capabilities, IppError> {
        let mut request = self.request(Operation::GetPrinterAttributes)?;
        add_operation(
            &mut request,
            IppAttributeName::REQUESTED_ATTRIBUTES,
            keywords(&PRINTER_ATTRIBUTES)?,
        );
        let response = self.send(request, None).await?;
        let group = response
            .attributes()
            .first_of(DelimiterTag::PrinterAttributes)
            .ok_or_else(|| IppError::Malformed("no printer attributes in the answer".into()))?;
        capabilities_from(group)
    }

    /// Print-Job: one document, `format` its MIME type, `media` a PWG media
    /// name (job template attribute `media`). Returns the job-id.
    pub async fn print_job(
        &self,
        job_name: &str,
        media: &str,
        colour: bool,
        format: &str,
        document: Bytes,
    ) -> Result<i32, IppError> {
        let mut request = self.request(Operation::PrintJob)?;
        add_operation(&mut request, IppAttributeName::JOB_NAME, name(job_name)?);
        add_operation(
            &mut request,
            IppAttributeName::DOCUMENT_FORMAT,
            IppValue::new_mime_media_type(format).map_err(|e| invalid("document-format", e))?,
        );
        request.attributes_mut().add(
            DelimiterTag::JobAttributes,
            IppAttribute::new(IppAttributeName::MEDIA, keyword(media)?),
        );
        request.attributes_mut().add(
            DelimiterTag::JobAttributes,
            IppAttribute::new(
                IppAttributeName::const_new("print-color-mode"),
                keyword(if colour { "color" } else { "monochrome" })?,
            ),
        );
        let response = self.send(request, Some(document)).await?;
        let group = response
            .attributes()
            .first_of(DelimiterTag::JobAttributes)
            .ok_or_else(|| {
                IppError::Malformed("no job attributes in the Print-Job answer".into())
            })?;
        integer(group, "job-id")
            .ok_or_else(|| IppError::Malformed("no job-id in the Print-Job answer".into()))
    }

    /// Get-Job-Attributes of one job.
    pub async fn job(&self, job_id: i32) -> Result<JobStatus, IppError> {
        let mut request = self.request(Operation::GetJobAttributes)?;
        add_operation(
            &mut request,
            IppAttributeName::JOB_ID,
            IppValue::Integer(job_id),
        );
        add_operation(
            &mut request,
            IppAttributeName::REQUESTED_ATTRIBUTES,
            keywords(&JOB_ATTRIBUTES)?,
        );
        let response = self.send(request, None).await?;
        let group = response
            .attributes()
            .first_of(DelimiterTag::JobAttributes)
            .ok_or_else(|| {
                IppError::Malformed(format!("no attributes for job {job_id} in the answer"))
            })?;
        job_from(group)
    }

    /// Get-Jobs (`which-jobs=all`): the jobs the printer still knows whose
    /// job-name is `job_name`, compared without case (ippeveprinter keeps
    /// names as sent, but its spool files are lower-cased, and other printers
    /// may fold). Oldest first, as the printer lists them.
    pub async fn jobs_named(&self, job_name: &str) -> Result<Vec<JobStatus>, IppError> {
        let mut request = self.request(Operation::GetJobs)?;
        add_operation(&mut request, IppAttributeName::WHICH_JOBS, keyword("all")?);
        add_operation(
            &mut request,
            IppAttributeName::REQUESTED_ATTRIBUTES,
            keywords(&JOB_ATTRIBUTES)?,
        );
        let response = self.send(request, None).await?;
        let mut jobs = Vec::new();
        for group in response.attributes().groups_of(DelimiterTag::JobAttributes) {
            let job = job_from(group)?;
            if job
                .name
                .as_deref()
                .is_some_and(|n| n.eq_ignore_ascii_case(job_name))
            {
                jobs.push(job);
            }
        }
        Ok(jobs)
    }

    /// Cancel-Job.
    pub async fn cancel_job(&self, job_id: i32) -> Result<(), IppError> {
        let mut request = self.request(Operation::CancelJob)?;
        add_operation(
            &mut request,
            IppAttributeName::JOB_ID,
            IppValue::Integer(job_id),
        );
        self.send(request, None).await.map(|_| ())
    }

    /// A request with the operation attributes every request carries:
    /// charset, language, `printer-uri`, `requesting-user-name`.
    fn request(&self, operation: Operation) -> Result<IppRequestResponse, IppError> {
        let mut request = IppRequestResponse::new(IppVersion::v1_1(), operation, None)
            .map_err(|e| IppError::Malformed(format!("cannot encode the request: {e}")))?;
        request.header_mut().request_id = next_request_id();
        let uri = IppValue::new_uri(self.uri.as_str()).map_err(|e| invalid("printer-uri", e))?;
        add_operation(&mut request, IppAttributeName::PRINTER_URI, uri);
        add_operation(
            &mut request,
            IppAttributeName::REQUESTING_USER_NAME,
            name(USER_NAME)?,
        );
        Ok(request)
    }

    /// Posts the request (and the document after it) and reads the answer;
    /// an error status is an error.
    async fn send(
        &self,
        request: IppRequestResponse,
        document: Option<Bytes>,
    ) -> Result<IppRequestResponse, IppError> {
        let head = request.to_bytes();
        let body = match document {
            None => head,
            Some(document) => {
                let mut body = BytesMut::with_capacity(head.len() + document.len());
                body.extend_from_slice(&head);
                body.extend_from_slice(&document);
                body.freeze()
            }
        };
        let unreachable = |err: reqwest::Error| {
            let detail = format!("{}: {}", self.uri, chain(&err));
            if err.is_connect() {
                IppError::NotConnected(detail)
            } else {
                IppError::Unreachable(detail)
            }
        };
        let answer = self
            .client
            .post(&self.endpoint)
            .header(reqwest::header::CONTENT_TYPE, "application/ipp")
            .body(body)
            .send()
            .await
            .map_err(unreachable)?;
        let status = answer.status();
        if status.is_server_error() {
            return Err(IppError::Unreachable(format!(
                "{}: HTTP {status}",
                self.uri
            )));
        }
        if !status.is_success() {
            return Err(IppError::Refused(format!("{}: HTTP {status}", self.uri)));
        }
        let bytes = answer.bytes().await.map_err(unreachable)?;
        let response = parse_response(bytes)?;
        check_status(
            response.header().operation_or_status as u16,
            status_message(&response).as_deref(),
        )?;
        Ok(response)
    }
}

/// The HTTP URL an `ipp://` or `ipps://` URI is reached at.
fn http_endpoint(uri: &str) -> Result<String, IppError> {
    let refuse = |why: &str| {
        IppError::Refused(format!(
            "not a printer URI ({why}): {uri:?}; expected ipp://host[:port]/path or ipps://..."
        ))
    };
    let parsed: Uri = uri.parse().map_err(|_| refuse("unparsable"))?;
    let tls = match parsed.scheme_str().map(str::to_ascii_lowercase).as_deref() {
        Some("ipp") => false,
        Some("ipps") => true,
        _ => return Err(refuse("the scheme must be ipp or ipps")),
    };
    let authority = parsed.authority().ok_or_else(|| refuse("no host"))?;
    if authority.host().is_empty() {
        return Err(refuse("no host"));
    }
    if authority.as_str().contains('@') {
        return Err(refuse("user info is not supported"));
    }
    let port = authority.port_u16().unwrap_or(DEFAULT_PORT);
    let path = parsed.path_and_query().map_or("/", |p| p.as_str());
    let path = if path.is_empty() { "/" } else { path };
    let scheme = if tls { "https" } else { "http" };
    Ok(format!("{scheme}://{}:{port}{path}", authority.host()))
}

/// A non-zero request-id, different for each request of this process.
fn next_request_id() -> i32 {
    static NEXT: AtomicI32 = AtomicI32::new(1);
    (NEXT.fetch_add(1, Ordering::Relaxed) & 0x7fff_ffff).max(1)
}

fn add_operation(request: &mut IppRequestResponse, name: IppAttributeName, value: IppValue) {
    request.attributes_mut().add(
        DelimiterTag::OperationAttributes,
        IppAttribute::new(name, value),
    );
}

fn invalid(what: &str, err: impl fmt::Display) -> IppError {
    IppError::Refused(format!("{what} cannot be sent: {err}"))
}

fn keyword(value: &str) -> Result<IppValue, IppError> {
    IppValue::new_keyword(value).map_err(|e| invalid("keyword", e))
}

fn keywords(values: &[&str]) -> Result<IppValue, IppError> {
    Ok(IppValue::Array(
        values
            .iter()
            .map(|v| keyword(v))
            .collect::<Result<_, _>>()?,
    ))
}

fn name(value: &str) -> Result<IppValue, IppError> {
    IppValue::new_name_without_language(value).map_err(|e| invalid("name", e))
}

fn parse_response(bytes: Bytes) -> Result<IppRequestResponse, IppError> {
    IppParser::new(Cursor::new(bytes))
        .parse()
        .map_err(|e| IppError::Malformed(format!("not an IPP answer: {e}")))
}

fn status_message(response: &IppRequestResponse) -> Option<String> {
    response
        .attributes()
        .first_of(DelimiterTag::OperationAttributes)
        .and_then(|group| strings(group, "status-message").into_iter().next())
}

/// Ok for a successful status; otherwise [`IppError::Busy`] for the
/// try-again-later statuses and [`IppError::Refused`] for the rest.
fn check_status(status: u16, message: Option<&str>) -> Result<(), IppError> {
    if status <= 0x00ff {
        return Ok(());
    }
    let text = match message {
        Some(message) if !message.is_empty() => format!("{}: {message}", status_name(status)),
        _ => status_name(status),
    };
    match status {
        // service-unavailable, temporary-error, not-accepting-jobs, busy
        0x0502 | 0x0505 | 0x0506 | 0x0507 => Err(IppError::Busy(text)),
        _ => Err(IppError::Refused(text)),
    }
}

/// The keyword of an IPP status code (RFC 8011 and its extensions).
fn status_name(status: u16) -> String {
    let name = match status {
        0x0000 => "successful-ok",
        0x0001 => "successful-ok-ignored-or-substituted-attributes",
        0x0002 => "successful-ok-conflicting-attributes",
        0x0400 => "client-error-bad-request",
        0x0401 => "client-error-forbidden",
        0x0402 => "client-error-not-authenticated",
        0x0403 => "client-error-not-authorized",
        0x0404 => "client-error-not-possible",
        0x0405 => "client-error-timeout",
        0x0406 => "client-error-not-found",
        0x0407 => "client-error-gone",
        0x0408 => "client-error-request-entity-too-large",
        0x0409 => "client-error-request-value-too-long",
        0x040a => "client-error-document-format-not-supported",
        0x040b => "client-error-attributes-or-values-not-supported",
        0x040c => "client-error-uri-scheme-not-supported",
        0x040d => "client-error-charset-not-supported",
        0x040e => "client-error-conflicting-attributes",
        0x040f => "client-error-compression-not-supported",
        0x0410 => "client-error-compression-error",
        0x0411 => "client-error-document-format-error",
        0x0412 => "client-error-document-access-error",
        0x0500 => "server-error-internal-error",
        0x0501 => "server-error-operation-not-supported",
        0x0502 => "server-error-service-unavailable",
        0x0503 => "server-error-version-not-supported",
        0x0504 => "server-error-device-error",
        0x0505 => "server-error-temporary-error",
        0x0506 => "server-error-not-accepting-jobs",
        0x0507 => "server-error-busy",
        0x0508 => "server-error-job-canceled",
        0x0509 => "server-error-multiple-document-jobs-not-supported",
        _ => return format!("ipp-status-0x{status:04x}"),
    };
    name.to_owned()
}

fn capabilities_from(group: &IppAttributeGroup) -> Result<Capabilities, IppError> {
    let state = match enum_value(group, "printer-state") {
        Some(3) => PrinterState::Idle,
        Some(4) => PrinterState::Processing,
        Some(5) => PrinterState::Stopped,
        other => return Err(IppError::Malformed(format!("printer-state is {other:?}"))),
    };
    let mut resolutions = Vec::new();
    for value in values(group, "printer-resolution-supported") {
        if let IppValue::Resolution {
            cross_feed,
            feed,
            units,
        } = value
        {
            if let (Some(x), Some(y)) = (to_dpi(*cross_feed, *units), to_dpi(*feed, *units)) {
                if !resolutions.contains(&(x, y)) {
                    resolutions.push((x, y));
                }
            }
        }
    }
    Ok(Capabilities {
        state,
        state_reasons: without_none(strings(group, "printer-state-reasons")),
        formats: strings(group, "document-format-supported"),
        media_supported: strings(group, "media-supported"),
        media_ready: strings(group, "media-ready"),
        resolutions,
        color: boolean(group, "color-supported").unwrap_or(false),
        accepting: boolean(group, "printer-is-accepting-jobs").unwrap_or(false),
    })
}

fn job_from(group: &IppAttributeGroup) -> Result<JobStatus, IppError> {
    let job_id = integer(group, "job-id")
        .ok_or_else(|| IppError::Malformed("a job without job-id".into()))?;
    let state = enum_value(group, "job-state")
        .and_then(JobState::from_ipp)
        .ok_or_else(|| IppError::Malformed(format!("job {job_id} has no valid job-state")))?;
    Ok(JobStatus {
        job_id,
        state,
        reasons: without_none(strings(group, "job-state-reasons")),
        name: strings(group, "job-name").into_iter().next(),
    })
}

/// A resolution in dots per inch: units 3 is dots per inch, 4 dots per cm.
fn to_dpi(value: i32, units: i8) -> Option<u32> {
    let value = u32::try_from(value).ok()?;
    match units {
        3 => Some(value),
        4 => Some((f64::from(value) * 2.54).round() as u32),
        _ => None,
    }
}

fn without_none(mut reasons: Vec<String>) -> Vec<String> {
    reasons.retain(|r| r != "none");
    reasons
}

/// The values of an attribute (one, or each of a 1setOf); none when absent.
fn values<'a>(group: &'a IppAttributeGroup, name: &str) -> Vec<&'a IppValue> {
    group
        .get(name)
        .map(|a| a.value().into_iter().collect())
        .unwrap_or_default()
}

/// The string values of an attribute (keywords, names, texts, MIME types, URIs).
fn strings(group: &IppAttributeGroup, name: &str) -> Vec<String> {
    values(group, name)
        .into_iter()
        .filter_map(|value| match value {
            IppValue::Keyword(s)
            | IppValue::NameWithoutLanguage(s)
            | IppValue::MimeMediaType(s) => Some(s.to_string()),
            IppValue::NameWithLanguage { name, .. } => Some(name.to_string()),
            IppValue::TextWithoutLanguage(text) | IppValue::TextWithLanguage { text, .. } => {
                Some(text.as_ref().to_owned())
            }
            IppValue::Uri(s) => Some(s.to_string()),
            _ => None,
        })
        .collect()
}

fn integer(group: &IppAttributeGroup, name: &str) -> Option<i32> {
    match values(group, name).first() {
        Some(IppValue::Integer(i)) => Some(*i),
        _ => None,
    }
}

fn enum_value(group: &IppAttributeGroup, name: &str) -> Option<i32> {
    match values(group, name).first() {
        Some(IppValue::Enum(i)) | Some(IppValue::Integer(i)) => Some(*i),
        _ => None,
    }
}

fn boolean(group: &IppAttributeGroup, name: &str) -> Option<bool> {
    match values(group, name).first() {
        Some(IppValue::Boolean(b)) => Some(*b),
        _ => None,
    }
}

/// An error and its sources, one after the other (reqwest's own text
/// leaves out why: "connection refused", "operation timed out").
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;

    #[test]
    fn ipp_uris_map_to_http_on_the_same_port() {
        assert_eq!(
            http_endpoint("ipp://127.0.0.1:8631/ipp/print").unwrap(),
            "http://127.0.0.1:8631/ipp/print".to_owned()
        );
        assert_eq!(
            http_endpoint("ipp://printer.local/ipp/print").unwrap(),
            "http://printer.local:631/ipp/print".to_owned()
        );
        assert_eq!(
            http_endpoint("ipps://printer.local/ipp/print").unwrap(),
            "https://printer.local:631/ipp/print".to_owned()
        );
        assert_eq!(
            http_endpoint("IPPS://printer.local:443/printers/booth").unwrap(),
            "https://printer.local:443/printers/booth".to_owned()
        );
        assert_eq!(
            http_endpoint("ipp://[::1]:8631/ipp/print").unwrap(),
            "http://[::1]:8631/ipp/print".to_owned()
        );
        assert_eq!(
            http_endpoint("ipp://printer").unwrap(),
            "http://printer:631/".to_owned()
        );
    }

    #[test]
    fn other_uris_are_refused() {
        for uri in [
            "http://printer:631/ipp/print",
            "socket://printer:9100",
            "printer",
            "",
            "ipp:///ipp/print",
            "ipp://u:p@printer/",
        ] {
            match IppPrinter::new(uri) {
                Err(IppError::Refused(message)) => assert!(message.contains("ipp://"), "{message}"),
                other => panic!("{uri:?} gave {other:?}"),
            }
        }
        assert_eq!(
            IppPrinter::new(" ipp://printer/ipp/print ").unwrap().uri(),
            "ipp://printer/ipp/print"
        );
    }

    #[test]
    fn resolutions_convert_to_dots_per_inch() {
        assert_eq!(to_dpi(600, 3), Some(600));
        assert_eq!(to_dpi(118, 4), Some(300)); // 299.72
        assert_eq!(to_dpi(236, 4), Some(599)); // 599.44
        assert_eq!(to_dpi(300, 7), None);
        assert_eq!(to_dpi(-1, 3), None);
    }

    #[test]
    fn statuses_map_to_errors() {
        assert_eq!(check_status(0x0000, None), Ok(()));
        assert_eq!(check_status(0x0001, Some("media substituted")), Ok(()));
        assert_eq!(
            check_status(0x0507, Some("Currently printing another job.")),
            Err(IppError::Busy(
                "server-error-busy: Currently printing another job.".into()
            ))
        );
        assert!(
            matches!(check_status(0x0506, None), Err(IppError::Busy(m)) if m == "server-error-not-accepting-jobs")
        );
        assert!(matches!(check_status(0x0505, None), Err(IppError::Busy(_))));
        assert!(matches!(check_status(0x0502, None), Err(IppError::Busy(_))));
        let not_found = check_status(0x0406, Some("Job #7 does not exist.")).unwrap_err();
        assert_eq!(
            not_found,
            IppError::Refused("client-error-not-found: Job #7 does not exist.".into())
        );
        assert!(not_found.is_not_found() && !not_found.is_transient());
        assert!(
            matches!(check_status(0x040a, Some("")), Err(IppError::Refused(m)) if m == "client-error-document-format-not-supported")
        );
        assert!(matches!(
            check_status(0x0504, None),
            Err(IppError::Refused(_))
        ));
        assert!(
            matches!(check_status(0x0999, None), Err(IppError::Refused(m)) if m == "ipp-status-0x0999")
        );
    }

    /// An answer as a printer sends it, bytes by hand.
    fn answer(status: u16, attrs: &[(u8, u8, &str, &[u8])]) -> Bytes {
        let mut b = BytesMut::new();
        b.put_u16(0x0101);
        b.put_u16(status);
        b.put_i32(1);
        for &(group, tag, name, value) in attrs {
            if group != 0 {
                b.put_u8(group);
            }
            b.put_u8(tag);
            b.put_u16(name.len() as u16);
            b.put_slice(name.as_bytes());
            b.put_u16(value.len() as u16);
            b.put_slice(value);
        }
        b.put_u8(0x03);
        b.freeze()
    }

    #[test]
    fn printer_attributes_are_read() {
        let res_600 = [0, 0, 2, 0x58, 0, 0, 2, 0x58, 3];
        let res_118 = [0, 0, 0, 118, 0, 0, 0, 118, 4];
        let bytes = answer(
            0,
            &[
                (1, 0x47, "attributes-charset", b"utf-8"),
                (4, 0x23, "printer-state", &[0, 0, 0, 5]),
                (0, 0x44, "printer-state-reasons", b"media-empty-error"),
                (0, 0x44, "", b"paused"),
                (0, 0x49, "document-format-supported", b"image/jpeg"),
                (0, 0x13, "media-ready", b""),
                (0, 0x32, "printer-resolution-supported", &res_600),
                (0, 0x32, "", &res_118),
                (0, 0x22, "color-supported", &[1]),
            ],
        );
        let response = parse_response(bytes).unwrap();
        let caps = capabilities_from(
            response
                .attributes()
                .first_of(DelimiterTag::PrinterAttributes)
                .unwrap(),
        )
        .unwrap();
        assert_eq!(caps.state, PrinterState::Stopped);
        assert_eq!(caps.state_reasons, ["media-empty-error", "paused"]);
        assert!(
            caps.has_reason("media-empty")
                && caps.has_reason("paused")
                && !caps.has_reason("media")
        );
        assert_eq!(caps.formats, ["image/jpeg"]);
        assert!(caps.media_ready.is_empty());
        assert_eq!(caps.resolutions, [(600, 600), (300, 300)]);
        assert!(caps.color && !caps.accepting);
    }

    #[test]
    fn error_answers_carry_the_status_message() {
        let bytes = answer(
            0x0507,
            &[
                (1, 0x47, "attributes-charset", b"utf-8"),
                (
                    0,
                    0x41,
                    "status-message",
                    b"Currently printing another job.",
                ),
            ],
        );
        let response = parse_response(bytes).unwrap();
        assert_eq!(
            check_status(
                response.header().operation_or_status as u16,
                status_message(&response).as_deref()
            ),
            Err(IppError::Busy(
                "server-error-busy: Currently printing another job.".into()
            ))
        );
        assert!(matches!(
            parse_response(Bytes::from_static(b"<html>")),
            Err(IppError::Malformed(_))
        ));
    }

    #[test]
    fn job_states_map() {
        assert_eq!(JobState::from_ipp(3), Some(JobState::Pending));
        assert_eq!(JobState::from_ipp(9), Some(JobState::Completed));
        assert_eq!(JobState::from_ipp(2), None);
        assert!(JobState::Aborted.is_terminal() && !JobState::Stopped.is_terminal());
    }

    #[tokio::test]
    async fn a_closed_port_is_not_reached() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let printer = IppPrinter::new(&format!("ipp://127.0.0.1:{port}/ipp/print")).unwrap();
        match printer.capabilities().await {
            Err(IppError::NotConnected(message)) => {
                assert!(message.contains("127.0.0.1"), "{message}")
            }
            other => panic!("{other:?}"),
        }
    }
}
