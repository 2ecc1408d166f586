//! `GET /api/admin/experiences/{slug}/export`: a ZIP of every kept result
//! file of the experience, `results.csv` and `audit.csv` (what operators
//! did to it, newest first), written as it streams.
//!
//! Memory stays flat whatever the size: the ZIP is written on a blocking
//! thread (`zip`'s stream writer never seeks back) into a bounded channel
//! of [`CHUNK`]-sized pieces ([`QUEUED_CHUNKS`] of them at most: when the
//! client reads slowly the writer waits, nothing piles up), the results
//! are read a page at a time, and one result file is in memory at a time.
//! `results.csv` comes first (its file names follow from the stored
//! contents, no file needs reading for it), then the files. What the ZIP
//! keeps of each entry for its central directory (name, size, CRC) is the
//! one thing that grows, about 100 bytes a file.

use std::io::Write;

use actix_web::{web, HttpRequest, HttpResponse};
use bytes::Bytes;
use tokio::sync::mpsc;

use super::auth::signed_in;
use super::error::ApiError;
use super::AppState;
use crate::clock::rfc3339;
use crate::domain::audit::{AuditAction, AuditEntry};
use crate::domain::guests::{export_name, shared_keys};
use crate::media::MediaStore;
use crate::store::audit::{AuditCursor, AuditFilter};
use crate::store::guests::{ResultCursor, SharedResult};
use crate::store::Store;

/// Bytes sent to the client at a time.
const CHUNK: usize = 64 * 1024;
/// Chunks waiting for the client at most.
const QUEUED_CHUNKS: usize = 8;
/// Results read from the database at a time.
const PAGE: u64 = 200;

/// The file names of a result in the export: the full files it shares
/// (the branded rendition where the brand applies to sharing; not the
/// display-size thumbnails), each under `files/`.
fn files_of(result: &SharedResult) -> Vec<(String, String)> {
    shared_keys(&result.content)
        .into_iter()
        .map(|key| {
            let name = format!("files/{}", export_name(&key));
            (key, name)
        })
        .collect()
}

/// A `Write` that hands what it is given to the response in [`CHUNK`]s,
/// waiting (on its blocking thread) while the channel is full.
struct ChunkSender {
    buffer: Vec<u8>,
    to_client: mpsc::Sender<Result<Bytes, std::io::Error>>,
}

impl ChunkSender {
    fn send_buffer(&mut self) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(
            &mut self.buffer,
            Vec::with_capacity(CHUNK),
        ));
        self.to_client
            .blocking_send(Ok(chunk))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client left"))
    }
}

impl Write for ChunkSender {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let room = CHUNK - self.buffer.len();
        let taken = data.len().min(room);
        self.buffer.extend_from_slice(&data[..taken]);
        if self.buffer.len() >= CHUNK {
            self.send_buffer()?;
        }
        Ok(taken)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send_buffer()
    }
}

/// Why an export stopped early.
#[derive(Debug, thiserror::Error)]
enum ExportError {
    #[error("writing the ZIP: {0}")]
    Zip(#[from] zip::result::ZipError),
    #[error("writing the ZIP: {0}")]
    Io(#[from] std::io::Error),
    #[error("writing results.csv: {0}")]
    Csv(#[from] csv::Error),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// What the writer thread needs.
struct ExportJob {
    store: Store,
    media: MediaStore,
    experience_id: String,
    runtime: tokio::runtime::Handle,
}

impl ExportJob {
    /// Every page of the experience's results, oldest first, each handed
    /// to `each` as it is read.
    fn for_each_page(
        &self,
        mut each: impl FnMut(&[SharedResult]) -> Result<(), ExportError>,
    ) -> Result<(), ExportError> {
        let mut after: Option<ResultCursor> = None;
        loop {
            let page = self.runtime.block_on(self.store.export_page(
                &self.experience_id,
                PAGE,
                after.as_ref(),
            ))?;
            each(&page)?;
            match page.last() {
                Some(last) if page.len() as u64 == PAGE => {
                    after = Some(ResultCursor {
                        completed_at_ms: last.completed_at_ms,
                        session_id: last.session_id.clone(),
                    })
                }
                _ => return Ok(()),
            }
        }
    }

    /// The experience's audit records, newest first, as CSV, a page at a
    /// time.
    fn write_audit(&self, out: impl Write) -> Result<(), ExportError> {
        let mut csv = csv::Writer::from_writer(out);
        csv.write_record([
            "at",
            "operator",
            "operator_id",
            "action",
            "target",
            "detail",
        ])?;
        let filter = AuditFilter {
            experience_id: Some(self.experience_id.clone()),
            ..AuditFilter::default()
        };
        let mut after: Option<AuditCursor> = None;
        loop {
            let (records, next) =
                self.runtime
                    .block_on(self.store.audit_page(&filter, after.as_ref(), PAGE))?;
            for r in &records {
                csv.write_record([
                    rfc3339(r.at_ms).as_str(),
                    &spreadsheet_safe(&r.operator_name),
                    r.operator_id.as_deref().unwrap_or(""),
                    &r.action,
                    &r.target,
                    &spreadsheet_safe(&r.detail),
                ])?;
            }
            match next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        csv.flush()?;
        Ok(())
    }

    /// Writes the whole ZIP; returns the files written and those missing
    /// from the media store.
    fn write(&self, out: ChunkSender) -> Result<(usize, usize), ExportError> {
        use zip::write::SimpleFileOptions;
        // Result files are compressed already; large_file for a video
        // past 4 GiB is not needed (kept files are capped far below).
        let options =
            SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
        let mut zip = zip::ZipWriter::new_stream(out);
        zip.start_file("results.csv", options)?;
        {
            let mut csv = csv::Writer::from_writer(&mut zip);
            csv.write_record([
                "session_id",
                "nickname",
                "score",
                "rank",
                "completed_at",
                "files",
            ])?;
            self.for_each_page(|page| {
                for result in page {
                    let names: Vec<String> =
                        files_of(result).into_iter().map(|(_, name)| name).collect();
                    csv.write_record([
                        result.session_id.as_str(),
                        &spreadsheet_safe(&result.nickname),
                        &result.score.map(|s| s.to_string()).unwrap_or_default(),
                        &result.rank.map(|r| r.to_string()).unwrap_or_default(),
                        &rfc3339(result.completed_at_ms),
                        &names.join(" "),
                    ])?;
                }
                Ok(())
            })?;
            csv.flush()?;
        }
        zip.start_file("audit.csv", options)?;
        self.write_audit(&mut zip)?;
        let (mut written, mut missing) = (0, 0);
        self.for_each_page(|page| {
            for result in page {
                for (key, name) in files_of(result) {
                    match self.runtime.block_on(self.media.get(&key)) {
                        Ok(bytes) => {
                            zip.start_file(name, options)?;
                            zip.write_all(&bytes)?;
                            written += 1;
                        }
                        Err(e) => {
                            missing += 1;
                            tracing::warn!(key, error = %e, "export: a kept file could not be read; left out");
                        }
                    }
                }
            }
            Ok(())
        })?;
        let mut out = zip.finish()?.into_inner();
        out.flush()?;
        Ok((written, missing))
    }
}

/// A nickname a spreadsheet will not run as a formula (`=`, `+`, `-`,
/// `@` first get a `'`).
fn spreadsheet_safe(text: &str) -> String {
    if text.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{text}")
    } else {
        text.to_owned()
    }
}

/// `GET /api/admin/experiences/{slug}/export`
#[utoipa::path(
    get,
    path = "/api/admin/experiences/{slug}/export",
    tag = "admin",
    summary = "Export an experience's kept results: a ZIP of the files and results.csv, streamed.",
    security(("operator" = [])),
    params(("slug" = String, Path, description = "The experience's slug.")),
    responses(
        (status = 200, description = "The ZIP (`Content-Disposition: attachment`), written as it streams.", content_type = "application/zip", body = Vec<u8>),
        (status = 401, description = "`unauthorized`: the operator token is missing or wrong.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such experience.", body = super::schema::ErrorBody),
    )
)]
pub async fn export(
    state: web::Data<AppState>,
    req: HttpRequest,
    slug: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let operator = signed_in(&req)?;
    let experience = state.experience(&slug).await?;
    let client = state.client_address(&req);
    // Recorded before the first byte goes out: an export that breaks part
    // way has still handed out what it sent.
    let audit = AuditEntry::new(
        &operator,
        AuditAction::ExperienceExport,
        format!("experience:{}", experience.slug),
    )
    .of_experience(Some(experience.id.clone()))
    .detail(format!("from {client}"));
    state
        .store
        .record_audit(&audit, state.clock.now_ms())
        .await?;
    tracing::info!(experience = %experience.slug, operator = %operator.name, %client, "export started");
    let (to_client, from_writer) = mpsc::channel(QUEUED_CHUNKS);
    let job = ExportJob {
        store: state.store.clone(),
        media: state.media.clone(),
        experience_id: experience.id.clone(),
        runtime: tokio::runtime::Handle::current(),
    };
    let slug = experience.slug.clone();
    let errors = to_client.clone();
    tokio::task::spawn_blocking(move || {
        let out = ChunkSender {
            buffer: Vec::with_capacity(CHUNK),
            to_client,
        };
        match job.write(out) {
            Ok((files, missing)) => {
                tracing::info!(experience = %slug, files, missing, "export finished")
            }
            Err(ExportError::Io(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                tracing::info!(experience = %slug, "export: the client left before the end")
            }
            Err(e) => {
                tracing::error!(experience = %slug, error = %e, "export failed part way");
                // The client sees a broken download, never a short ZIP
                // that looks whole.
                let _ = errors.blocking_send(Err(std::io::Error::other(e.to_string())));
            }
        }
    });
    let body = futures_util::stream::unfold(from_writer, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Ok(HttpResponse::Ok()
        .content_type("application/zip")
        .insert_header((
            "Content-Disposition",
            format!("attachment; filename=\"{}-export.zip\"", experience.slug),
        ))
        .insert_header(("Cache-Control", "no-store"))
        .streaming(body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_result_exports_its_full_files_not_its_thumbnails() {
        let result = SharedResult {
            session_id: "s1".into(),
            nickname: "=cmd".into(),
            content: json!([{"type": "image", "url": "/media/r/abc.png", "thumb_url": "/media/r/abc.t.jpg"}]),
            score: None,
            rank: None,
            completed_at_ms: 0,
        };
        assert_eq!(
            files_of(&result),
            vec![("r/abc.png".to_owned(), "files/abc.png".to_owned())]
        );
        assert_eq!(spreadsheet_safe(&result.nickname), "'=cmd");
        assert_eq!(spreadsheet_safe("kim"), "kim");
    }

    #[test]
    fn the_sender_hands_over_whole_chunks_and_the_rest_on_flush() {
        let (tx, mut rx) = mpsc::channel(QUEUED_CHUNKS);
        let mut out = ChunkSender {
            buffer: Vec::new(),
            to_client: tx,
        };
        out.write_all(&vec![7u8; CHUNK + 10]).expect("written");
        out.flush().expect("flushed");
        drop(out);
        let mut sizes = Vec::new();
        while let Ok(Ok(chunk)) = rx.try_recv() {
            sizes.push(chunk.len());
        }
        assert_eq!(sizes, vec![CHUNK, 10]);
    }
}
