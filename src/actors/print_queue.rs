//! PrintQueue: sends prints to the printers, follows them to the paper,
//! and keeps each printer's state fresh for /ops.
//!
//! - **Printers asked** (every [`PRINTER_CHECK`], on a task of their own,
//!   all at once, so a printer that does not answer holds up no print of
//!   another): Get-Printer-Attributes of each; a changed state or reason is
//!   written and the operators are told (their socket's `print.printers`
//!   frame).
//! - **Prints claimed** ([`Store::claim_prints`], a lease under this
//!   actor's token) in rounds, and each moved on by its status. The next
//!   round comes when the earliest print written is due (at most
//!   [`ROUND`] later, at once when this instance's [`Wakeups::prints`]
//!   rings, when a claim was full, or when a print left its printer: then
//!   the queued prints are made due, [`Store::hurry_queued_prints`], so the
//!   next goes to the free printer at once):
//!    - `QUEUED`: to a printer of its experience that takes a job now (no
//!      reason that holds the queue: out of paper, jam, offline, paused;
//!      and none of our prints at it already), else back with the reason.
//!      `SENDING` with the printer is written *before* Print-Job.
//!    - `SENDING` (a send whose answer was lost: a crash, a timeout): the
//!      printer is asked for a job of the print's `job-name` (Get-Jobs)
//!      before anything is sent again, so a print is never printed twice.
//!    - `PRINTING`: Get-Job-Attributes every [`FOLLOW_MS`] until the job
//!      ends.
//!
//! After each printer check, the displays of each experience with a
//! display on this instance are told what its prints wait for (a
//! `print.waiting` frame through the [`TerminalHub`]: how many wait for a
//! printer that holds its queue, and why), and when that is over.
//!
//! While a printer is busy, the print-ready documents of the prints that
//! wait for it are made ahead ([`Ahead`], at most [`AHEAD`]), so the next
//! print is sent the moment the printer is free.
//!
//! Nothing here holds a database connection while a printer is asked; no
//! HTTP worker ever talks to a printer. A print never blocks a saga: it is
//! asked for after the saga completed, and only reads its kept file.
//!
//! When full: the claim takes at most [`CLAIM`] prints a round; the rest
//! wait in the table (nothing is dropped), oldest first, and the next
//! round follows at once. Documents made ahead are at most [`AHEAD`]; past
//! that a print's document is made when it is sent.

use std::collections::HashMap;
use std::time::Duration;

use actix::prelude::*;
use bytes::Bytes;

use super::run_on_runtime;
use super::terminal_hub::{PrintingChanged, TerminalHub, WatchedExperiences};
use super::wakeups::Wakeups;
use crate::clock::SharedClock;
use crate::domain::policy::EpochMs;
use crate::domain::print::{holds_the_queue, print_waiting_frame, PrintReason, PrintStatus};
use crate::media::photo::{decode_rgb, jpeg_of, PhotoLimits};
use crate::media::pool::PhotoPool;
use crate::media::MediaStore;
use crate::print::ipp::{Capabilities, IppError, IppPrinter, JobState, PrinterState};
use crate::print::prepare::{
    choose_format, encode_pwg_raster, media_size, pixels_at, print_ready, PWG_RASTER,
};
use crate::store::entities::{printers, prints};
use crate::store::prints::{column_list, PrintChange, PrinterSaid};
use crate::store::Store;

/// The longest a round waits for a ring.
pub const ROUND: Duration = Duration::from_secs(1);
/// How often a print at its printer is asked about.
pub const FOLLOW_MS: i64 = 200;
/// Print-ready documents made ahead for prints waiting for a busy printer.
const AHEAD: usize = 4;
/// How often each printer is asked how it is.
pub const PRINTER_CHECK: Duration = Duration::from_secs(3);
/// Prints claimed a round, and queued prints made due when a printer's
/// place comes free.
const CLAIM: i64 = 32;
/// JPEG quality of a print.
const PRINT_QUALITY: u8 = 92;

/// What the print actor needs.
#[derive(Clone)]
pub struct PrintDeps {
    pub store: Store,
    pub clock: SharedClock,
    pub media: MediaStore,
    pub pool: PhotoPool,
    pub wakeups: Wakeups,
    /// This instance's displays (told what their prints wait for).
    pub hub: Addr<TerminalHub>,
    /// This instance's id: the lease token's prefix.
    pub instance_id: String,
    /// How long a claim holds a print (`--lease`): a print whose holder
    /// died is taken up again after it. Longer than a send may take (the
    /// IPP request's 30 s timeout) on a real event.
    pub lease_ms: i64,
}

pub struct PrintQueue {
    deps: PrintDeps,
    running: Option<tokio::task::AbortHandle>,
}

impl PrintQueue {
    pub fn new(deps: PrintDeps) -> PrintQueue {
        PrintQueue {
            deps,
            running: None,
        }
    }
}

impl Actor for PrintQueue {
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

/// The printers as this actor last saw them, by id.
type Seen = HashMap<String, printers::Model>;

async fn seen_printers(store: &Store) -> Result<Seen, crate::store::StoreError> {
    Ok(store
        .printers()
        .await?
        .into_iter()
        .map(|p| (p.id.clone(), p))
        .collect())
}

async fn rounds(deps: PrintDeps) {
    let token = format!("{}:{}", deps.instance_id, uuid::Uuid::new_v4().simple());
    // Dropped (the actor stopped) with this loop: the watcher is aborted.
    let mut watcher = tokio::task::JoinSet::new();
    crate::metrics::task_spawned("print_queue.watch_printers");
    watcher.spawn(watch_printers(deps.clone()));
    let mut ahead = Ahead::default();
    loop {
        let next = match work_prints(&deps, &token, &mut ahead).await {
            Ok(next) => next,
            Err(e) => {
                tracing::warn!(error = %e, "print round failed; the next round tries again");
                None
            }
        };
        let wait = next.map_or(ROUND, |at| {
            let ms = (at - deps.clock.now_ms()).clamp(0, ROUND.as_millis() as i64);
            Duration::from_millis(ms as u64)
        });
        if !wait.is_zero() {
            let _ = tokio::time::timeout(wait, deps.wakeups.prints.rung()).await;
        }
    }
}

/// Asks the printers every [`PRINTER_CHECK`], and tells the displays what
/// their prints wait for, for as long as the actor runs.
async fn watch_printers(deps: PrintDeps) {
    loop {
        ask_printers(&deps).await;
        if let Err(e) = tell_displays(&deps).await {
            tracing::warn!(error = %e, "the displays could not be told what their prints wait for");
        }
        tokio::time::sleep(PRINTER_CHECK).await;
    }
}

/// Sends each experience with a display here what its prints wait for
/// (the hub passes on only what changed).
async fn tell_displays(deps: &PrintDeps) -> Result<(), crate::store::StoreError> {
    let Ok(watched) = deps.hub.send(WatchedExperiences).await else {
        return Ok(());
    };
    if watched.is_empty() {
        return Ok(());
    }
    let printers = seen_printers(&deps.store).await?;
    let open = deps.store.open_prints(1_000).await?;
    for experience_id in watched {
        let frame = held_prints(&experience_id, &open, &printers)
            .map(|(waiting, reason)| std::sync::Arc::from(print_waiting_frame(waiting, reason)));
        if deps
            .hub
            .send(PrintingChanged {
                experience_id,
                frame,
            })
            .await
            .is_err()
        {
            return Ok(()); // the hub is gone: the server is stopping
        }
    }
    Ok(())
}

/// How many of the experience's open prints wait for a printer that holds
/// its queue (out of paper, jammed, off, paused; not one that is only
/// busy), and the reason of the oldest; None when none does.
fn held_prints(
    experience_id: &str,
    open: &[prints::Model],
    printers: &Seen,
) -> Option<(usize, PrintReason)> {
    let free = HashMap::new();
    let held = open
        .iter()
        .filter(|p| p.experience_id == experience_id && !p.awaiting_review)
        .filter_map(|p| match p.status.as_str() {
            "QUEUED" => match pick_printer(p, printers, &free) {
                Err(PrintReason::Busy) | Ok(_) => None,
                Err(reason) => Some(reason),
            },
            _ => p
                .printer_id
                .as_ref()
                .and_then(|id| printers.get(id))
                .and_then(|printer| {
                    holds_the_queue(&printer.state, &column_list(&printer.state_reasons))
                }),
        });
    let mut reasons = held.peekable();
    let first = *reasons.peek()?;
    Some((reasons.count(), first))
}

/// Asks every printer how it is and writes what changed.
async fn ask_printers(deps: &PrintDeps) {
    let Ok(printers) = deps.store.printers().await else {
        return;
    };
    let answers = futures_util::future::join_all(printers.iter().map(|printer| async move {
        match IppPrinter::new(&printer.uri) {
            Ok(ipp) => ipp.capabilities().await,
            Err(e) => Err(e),
        }
    }))
    .await;
    let mut changed = false;
    for (printer, answer) in printers.into_iter().zip(answers) {
        let said = match answer {
            Ok(capabilities) => printer_said(&printer.media, capabilities),
            Err(e) => unreachable(&printer, &e),
        };
        match deps
            .store
            .printer_said(&printer.id, &said, deps.clock.now_ms())
            .await
        {
            Ok(true) => {
                changed = true;
                tracing::info!(printer = %printer.name, state = %said.state, reasons = ?said.state_reasons, "printer state changed");
                metrics::gauge!(crate::metrics::PRINTER_UP, "printer" => printer.name.clone()).set(
                    f64::from(u8::from(
                        holds_the_queue(&said.state, &said.state_reasons).is_none(),
                    )),
                );
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "the printer's state could not be written"),
        }
    }
    if changed {
        deps.wakeups.stats.ring();
        deps.wakeups.prints.ring();
    }
}

/// What a printer's answer says, as stored, for a printer of `media`.
/// Media not loaded (the printer's `media-ready` lacks ours) counts as
/// out of paper.
pub fn printer_said(media: &str, capabilities: Capabilities) -> PrinterSaid {
    let state = match capabilities.state {
        PrinterState::Idle => "idle",
        PrinterState::Processing => "processing",
        PrinterState::Stopped => "stopped",
    };
    let mut reasons = capabilities.state_reasons;
    if !capabilities.media_ready.iter().any(|m| m == media)
        && !reasons
            .iter()
            .any(|r| r.starts_with("media-empty") || r.starts_with("media-needed"))
    {
        reasons.push("media-needed".to_owned());
    }
    if !capabilities.accepting && !reasons.iter().any(|r| r.starts_with("paused")) {
        reasons.push("paused".to_owned());
    }
    PrinterSaid {
        state: state.to_owned(),
        state_reasons: reasons,
        formats: capabilities.formats,
        dpi: best_dpi(&capabilities.resolutions),
    }
}

/// The resolution a print is made at: 300 dpi when the printer takes it,
/// else the highest it lists up to 600, else 300.
pub fn best_dpi(resolutions: &[(u32, u32)]) -> i32 {
    if resolutions.iter().any(|&(x, _)| x == 300) {
        return 300;
    }
    resolutions
        .iter()
        .map(|&(x, _)| x)
        .filter(|&x| x <= 600)
        .max()
        .map_or(300, |x| x as i32)
}

fn unreachable(printer: &printers::Model, e: &IppError) -> PrinterSaid {
    tracing::debug!(printer = %printer.name, error = %e, "printer not answering");
    PrinterSaid {
        state: "unreachable".to_owned(),
        state_reasons: Vec::new(),
        formats: column_list(&printer.formats),
        dpi: printer.dpi,
    }
}

/// Claims the prints whose time has come and moves each on. When the next
/// round is due: the earliest look written, or now (a full claim, a place
/// at a printer come free); `None` when nothing was claimed.
async fn work_prints(
    deps: &PrintDeps,
    token: &str,
    ahead: &mut Ahead,
) -> Result<Option<EpochMs>, crate::store::StoreError> {
    let claimed = deps
        .store
        .claim_prints(token, deps.clock.now_ms(), deps.lease_ms, CLAIM)
        .await?;
    if claimed.is_empty() {
        return Ok(None);
    }
    let full = claimed.len() as i64 >= CLAIM;
    let printers = seen_printers(&deps.store).await?;
    let open = deps.store.open_prints(1_000).await?;
    ahead.keep_only_queued(&open);
    let mut at_printer = places_taken(&open);
    let mut next: Option<EpochMs> = None;
    let mut freed = 0;
    let mut waiting_turn = Vec::new();
    for print in claimed {
        let status = print.status.parse().unwrap_or(PrintStatus::Queued);
        let change = match status {
            PrintStatus::Queued => {
                send(deps, token, &print, &printers, &mut at_printer, ahead).await
            }
            PrintStatus::Sending => {
                recover(deps, token, &print, &printers, &mut at_printer, ahead).await
            }
            _ => follow(deps, &print, &printers).await,
        };
        if let Err(e) = deps
            .store
            .write_print(
                &print.id,
                token,
                &change,
                deps.clock.now_ms(),
                deps.lease_ms,
            )
            .await
        {
            tracing::warn!(print_id = %print.id, error = %e, "the print's change was not written");
            continue;
        }
        if change.status.is_final() {
            let was_at = change.printer_id.as_ref().or(print.printer_id.as_ref());
            if let Some(count) = was_at.and_then(|id| at_printer.get_mut(id)) {
                *count = count.saturating_sub(1);
                freed += 1;
            }
        } else {
            next = Some(next.map_or(change.next_attempt_at_ms, |n| {
                n.min(change.next_attempt_at_ms)
            }));
        }
        if change.status == PrintStatus::Queued
            && change.reason.as_deref() == Some(PrintReason::Busy.key())
        {
            waiting_turn.push(print.clone());
        }
        told(deps, &print, &change);
    }
    ahead.make(deps, &waiting_turn, &printers);
    let now = deps.clock.now_ms();
    if freed > 0 {
        deps.store.hurry_queued_prints(now, CLAIM).await?;
        return Ok(Some(now));
    }
    Ok(if full { Some(now) } else { next })
}

/// The places taken at each printer: our prints being sent to it or at it.
fn places_taken(open: &[prints::Model]) -> HashMap<String, usize> {
    let mut at_printer: HashMap<String, usize> = HashMap::new();
    for print in open {
        if matches!(print.status.as_str(), "SENDING" | "PRINTING") {
            if let Some(id) = &print.printer_id {
                *at_printer.entry(id.clone()).or_default() += 1;
            }
        }
    }
    at_printer
}

/// Logs, counts and tells the operators a print's change of status or
/// reason.
fn told(deps: &PrintDeps, print: &prints::Model, change: &PrintChange) {
    if change.status.as_str() != print.status || change.reason != print.reason {
        tracing::info!(print_id = %print.id, status = change.status.as_str(), reason = ?change.reason, "print moved on");
        metrics::counter!(crate::metrics::PRINTS, "status" => change.status.as_str()).increment(1);
        deps.wakeups.stats.ring();
    }
}

/// Print-ready documents being made ahead, by print id, each for the media
/// and resolution of the printer it was made for. At most [`AHEAD`]; a
/// print that left the queue (sent elsewhere, canceled) loses its own.
#[derive(Default)]
struct Ahead(HashMap<String, MadeAhead>);

struct MadeAhead {
    /// The media and dpi it fits.
    fits: (String, i32),
    task: tokio::task::JoinHandle<Result<Document, Prepared>>,
}

impl Ahead {
    /// Starts the documents of prints waiting for a busy printer, oldest
    /// first, for the first healthy printer that serves each.
    fn make(&mut self, deps: &PrintDeps, waiting: &[prints::Model], printers: &Seen) {
        for print in waiting {
            if self.0.len() >= AHEAD {
                return;
            }
            if self.0.contains_key(&print.id) {
                continue;
            }
            let Some(printer) = healthy_serving(print, printers).into_iter().next() else {
                continue;
            };
            let (deps, owned, printer) = (deps.clone(), print.clone(), printer.clone());
            let fits = (printer.media.clone(), printer.dpi);
            crate::metrics::task_spawned("print_queue.prepare_ahead");
            let task = tokio::spawn(async move { prepare(&deps, &owned, &printer).await });
            self.0.insert(print.id.clone(), MadeAhead { fits, task });
        }
    }

    /// The document made ahead for `print_id` if it fits `printer`.
    fn take(
        &mut self,
        print_id: &str,
        printer: &printers::Model,
    ) -> Option<tokio::task::JoinHandle<Result<Document, Prepared>>> {
        let made = self.0.remove(print_id)?;
        if made.fits == (printer.media.clone(), printer.dpi) {
            return Some(made.task);
        }
        made.task.abort();
        None
    }

    /// Drops the documents of prints no longer queued.
    fn keep_only_queued(&mut self, open: &[prints::Model]) {
        self.0.retain(|id, made| {
            let queued = open.iter().any(|p| &p.id == id && p.status == "QUEUED");
            if !queued {
                made.task.abort();
            }
            queued
        });
    }
}

/// The change that leaves `print` as it is, with a reason, for a look in
/// `after_ms`.
fn wait(
    print: &prints::Model,
    status: PrintStatus,
    reason: Option<PrintReason>,
    after_ms: i64,
    now: EpochMs,
) -> PrintChange {
    PrintChange {
        status,
        reason: reason.map(|r| r.stored(None)),
        printer_id: print.printer_id.clone(),
        ipp_job_id: print.ipp_job_id,
        attempts: print.attempts,
        next_attempt_at_ms: now + after_ms,
        keep_lease: false,
    }
}

/// The printers that serve `print`'s experience, oldest first.
fn serving<'a>(print: &prints::Model, printers: &'a Seen) -> Vec<&'a printers::Model> {
    let mut serving: Vec<&printers::Model> = printers
        .values()
        .filter(|p| {
            let list = column_list(&p.experiences);
            list.is_empty() || list.contains(&print.experience_id)
        })
        .collect();
    serving.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
    serving
}

/// Of the printers that serve `print`, those whose state holds no queue.
fn healthy_serving<'a>(print: &prints::Model, printers: &'a Seen) -> Vec<&'a printers::Model> {
    serving(print, printers)
        .into_iter()
        .filter(|p| holds_the_queue(&p.state, &column_list(&p.state_reasons)).is_none())
        .collect()
}

/// The printer a queued print goes to now, or why it waits.
fn pick_printer<'a>(
    print: &prints::Model,
    printers: &'a Seen,
    at_printer: &HashMap<String, usize>,
) -> Result<&'a printers::Model, PrintReason> {
    let serving = serving(print, printers);
    let Some(first) = serving.first() else {
        return Err(PrintReason::NoPrinter);
    };
    let healthy = healthy_serving(print, printers);
    if healthy.is_empty() {
        return Err(
            holds_the_queue(&first.state, &column_list(&first.state_reasons))
                .unwrap_or(PrintReason::Offline),
        );
    }
    healthy
        .into_iter()
        .find(|p| at_printer.get(&p.id).copied().unwrap_or(0) == 0)
        .ok_or(PrintReason::Busy)
}

/// Sends a queued print to a printer that takes it now.
async fn send(
    deps: &PrintDeps,
    token: &str,
    print: &prints::Model,
    printers: &Seen,
    at_printer: &mut HashMap<String, usize>,
    ahead: &mut Ahead,
) -> PrintChange {
    let now = deps.clock.now_ms();
    let printer = match pick_printer(print, printers, at_printer) {
        Ok(printer) => printer,
        Err(reason) => return wait(print, PrintStatus::Queued, Some(reason), 1_000, now),
    };
    // Sending, with the printer, is on record before the printer is asked:
    // a crash from here on is recovered by asking it (see `recover`).
    let sending = PrintChange {
        status: PrintStatus::Sending,
        reason: None,
        printer_id: Some(printer.id.clone()),
        ipp_job_id: None,
        attempts: print.attempts + 1,
        next_attempt_at_ms: now + deps.lease_ms,
        keep_lease: true,
    };
    if let Err(e) = deps
        .store
        .write_print(&print.id, token, &sending, now, deps.lease_ms)
        .await
    {
        tracing::warn!(print_id = %print.id, error = %e, "the print could not be marked as sending; not sent");
        return wait(print, PrintStatus::Queued, None, 1_000, now);
    }
    *at_printer.entry(printer.id.clone()).or_default() += 1;
    let print = prints::Model {
        status: PrintStatus::Sending.as_str().to_owned(),
        printer_id: Some(printer.id.clone()),
        attempts: print.attempts + 1,
        ..print.clone()
    };
    deliver(deps, &print, printer, ahead).await
}

/// Prepares the print-ready image and sends it with Print-Job.
async fn deliver(
    deps: &PrintDeps,
    print: &prints::Model,
    printer: &printers::Model,
    ahead: &mut Ahead,
) -> PrintChange {
    let now = || deps.clock.now_ms();
    let made = match ahead.take(&print.id, printer) {
        Some(task) => task
            .await
            .unwrap_or_else(|e| Err(Prepared::Later(format!("made ahead: {e}")))),
        None => prepare(deps, print, printer).await,
    };
    let document = match made {
        Ok(document) => document,
        Err(Prepared::Later(detail)) => {
            tracing::warn!(print_id = %print.id, %detail, "the print cannot be prepared now");
            return wait(print, PrintStatus::Queued, None, 2_000, now());
        }
        Err(Prepared::Never(reason, detail)) => {
            return ended(print, PrintStatus::Aborted, reason, Some(&detail), now())
        }
    };
    let started = std::time::Instant::now();
    let answer = match IppPrinter::new(&printer.uri) {
        Ok(ipp) => {
            ipp.print_job(
                &print.job_name,
                &printer.media,
                printer.colour,
                document.format,
                document.bytes,
            )
            .await
        }
        Err(e) => Err(e),
    };
    match answer {
        Ok(job_id) => {
            tracing::info!(print_id = %print.id, printer = %printer.name, job_id, send_ms = started.elapsed().as_millis() as u64, "print sent");
            PrintChange {
                status: PrintStatus::Printing,
                reason: None,
                printer_id: Some(printer.id.clone()),
                ipp_job_id: Some(job_id),
                attempts: print.attempts,
                next_attempt_at_ms: now() + FOLLOW_MS,
                keep_lease: false,
            }
        }
        Err(IppError::Busy(detail)) => {
            tracing::info!(print_id = %print.id, printer = %printer.name, %detail, "printer busy; the print waits its turn");
            PrintChange {
                printer_id: None,
                ..wait(
                    print,
                    PrintStatus::Queued,
                    Some(PrintReason::Busy),
                    1_000,
                    now(),
                )
            }
        }
        // Nothing reached the printer: the print waits for it, as queued.
        Err(IppError::NotConnected(detail)) => {
            tracing::info!(print_id = %print.id, printer = %printer.name, %detail, "printer not reached; the print waits for it");
            PrintChange {
                printer_id: None,
                ..wait(
                    print,
                    PrintStatus::Queued,
                    Some(PrintReason::Offline),
                    2_000,
                    now(),
                )
            }
        }
        // No answer: the printer may have it. It is asked before any resend.
        Err(IppError::Unreachable(detail)) | Err(IppError::Malformed(detail)) => {
            tracing::warn!(print_id = %print.id, printer = %printer.name, %detail, "the print's send had no clear answer; the printer is asked before sending again");
            wait(
                print,
                PrintStatus::Sending,
                Some(PrintReason::Offline),
                2_000,
                now(),
            )
        }
        Err(IppError::Refused(detail)) => ended(
            print,
            PrintStatus::Aborted,
            PrintReason::Refused,
            Some(&detail),
            now(),
        ),
    }
}

enum Prepared {
    Later(String),
    Never(PrintReason, String),
}

/// A print-ready document and its format.
struct Document {
    format: &'static str,
    bytes: Bytes,
}

/// The print's kept file, fitted to the printer's media at its
/// resolution, in the first format the printer takes of JPEG and PWG
/// raster (on the photo pool).
async fn prepare(
    deps: &PrintDeps,
    print: &prints::Model,
    printer: &printers::Model,
) -> Result<Document, Prepared> {
    let size = media_size(&printer.media).ok_or_else(|| {
        Prepared::Never(
            PrintReason::Refused,
            format!("media {} names no size", printer.media),
        )
    })?;
    let format = choose_format(&column_list(&printer.formats)).ok_or_else(|| {
        Prepared::Never(
            PrintReason::Refused,
            format!(
                "the printer takes neither image/jpeg nor image/pwg-raster; it takes {}",
                printer.formats
            ),
        )
    })?;
    let dpi = printer.dpi.max(72) as u32;
    let target = pixels_at(&size, dpi);
    let bytes = match deps.media.get(&print.source_key).await {
        Ok(bytes) => bytes,
        Err(crate::media::MediaError::NotFound(_)) => {
            return Err(Prepared::Never(
                PrintReason::NoResult,
                "the kept file is gone".into(),
            ))
        }
        Err(e) => return Err(Prepared::Later(e.to_string())),
    };
    let started = std::time::Instant::now();
    let media = printer.media.clone();
    let made = deps
        .pool
        .run_keep(move |memory| {
            let decoded = decode_rgb(&bytes, &PhotoLimits::default(), memory)?;
            let page = print_ready(&decoded.image, target);
            Ok::<_, crate::media::photo::PhotoError>(if format == PWG_RASTER {
                encode_pwg_raster(&page, dpi, &media)
            } else {
                jpeg_of(&page, PRINT_QUALITY)?.bytes
            })
        })
        .await
        .map_err(|full| Prepared::Later(full.to_string()))?
        .map_err(|e| Prepared::Never(PrintReason::Refused, e.to_string()))?;
    metrics::histogram!(crate::metrics::PRINT_PREPARE_DURATION)
        .record(started.elapsed().as_secs_f64());
    Ok(Document {
        format,
        bytes: Bytes::from(made),
    })
}

fn ended(
    print: &prints::Model,
    status: PrintStatus,
    reason: PrintReason,
    detail: Option<&str>,
    now: EpochMs,
) -> PrintChange {
    tracing::warn!(print_id = %print.id, status = status.as_str(), reason = reason.key(), detail, "print ended without paper");
    PrintChange {
        reason: Some(reason.stored(detail)),
        ..wait(print, status, None, 0, now)
    }
}

/// A print whose send had no clear answer: the printer is asked for a
/// job of its name; one that is there (and not aborted) is followed,
/// otherwise it is sent again.
async fn recover(
    deps: &PrintDeps,
    token: &str,
    print: &prints::Model,
    printers: &Seen,
    at_printer: &mut HashMap<String, usize>,
    ahead: &mut Ahead,
) -> PrintChange {
    let now = deps.clock.now_ms();
    let Some(printer) = print.printer_id.as_ref().and_then(|id| printers.get(id)) else {
        // Its printer was removed: it goes to another.
        let queued = prints::Model {
            printer_id: None,
            ..print.clone()
        };
        return send(deps, token, &queued, printers, at_printer, ahead).await;
    };
    let found = match IppPrinter::new(&printer.uri) {
        Ok(ipp) => ipp.jobs_named(&print.job_name).await,
        Err(e) => Err(e),
    };
    match found {
        Ok(jobs) => match jobs
            .into_iter()
            .rev()
            .find(|j| j.state != JobState::Aborted && j.state != JobState::Canceled)
        {
            Some(job) => {
                tracing::info!(print_id = %print.id, printer = %printer.name, job_id = job.job_id, "the printer has the print already; it is followed, not sent again");
                PrintChange {
                    status: PrintStatus::Printing,
                    reason: None,
                    printer_id: print.printer_id.clone(),
                    ipp_job_id: Some(job.job_id),
                    attempts: print.attempts,
                    next_attempt_at_ms: now,
                    keep_lease: false,
                }
            }
            None => {
                // Not at the printer: its place there is free again.
                if let Some(count) = at_printer.get_mut(&printer.id) {
                    *count = count.saturating_sub(1);
                }
                let queued = prints::Model {
                    status: PrintStatus::Queued.as_str().to_owned(),
                    ..print.clone()
                };
                send(deps, token, &queued, printers, at_printer, ahead).await
            }
        },
        Err(e) => {
            tracing::info!(print_id = %print.id, printer = %printer.name, error = %e, "the printer cannot say yet whether it has the print; asked again soon");
            wait(
                print,
                PrintStatus::Sending,
                Some(PrintReason::Offline),
                2_000,
                now,
            )
        }
    }
}

/// A print at its printer: its job asked until it ends; while it waits,
/// the printer's reason (out of paper, …) is the print's.
async fn follow(deps: &PrintDeps, print: &prints::Model, printers: &Seen) -> PrintChange {
    let now = deps.clock.now_ms();
    let (Some(printer), Some(job_id)) = (
        print.printer_id.as_ref().and_then(|id| printers.get(id)),
        print.ipp_job_id,
    ) else {
        return ended(
            print,
            PrintStatus::Aborted,
            PrintReason::NoPrinter,
            Some("its printer was removed"),
            now,
        );
    };
    let answer = match IppPrinter::new(&printer.uri) {
        Ok(ipp) => ipp.job(job_id).await,
        Err(e) => Err(e),
    };
    let held = holds_the_queue(&printer.state, &column_list(&printer.state_reasons));
    match answer {
        Ok(job) => match job.state {
            JobState::Completed => PrintChange {
                reason: None,
                ..wait(print, PrintStatus::Completed, None, 0, now)
            },
            JobState::Canceled => ended(
                print,
                PrintStatus::Canceled,
                PrintReason::CanceledByOperator,
                Some("canceled at the printer"),
                now,
            ),
            JobState::Aborted => ended(
                print,
                PrintStatus::Aborted,
                PrintReason::Refused,
                Some(&job.reasons.join(", ")),
                now,
            ),
            _ => wait(print, PrintStatus::Printing, held, FOLLOW_MS, now),
        },
        Err(e) if e.is_not_found() => ended(
            print,
            PrintStatus::Aborted,
            PrintReason::Refused,
            Some("the printer no longer knows the job"),
            now,
        ),
        Err(_) => wait(
            print,
            PrintStatus::Printing,
            Some(PrintReason::Offline),
            2_000,
            now,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_hundred_dpi_when_the_printer_takes_it() {
        assert_eq!(best_dpi(&[(600, 600), (300, 300)]), 300);
        assert_eq!(best_dpi(&[(203, 203), (406, 406), (1200, 1200)]), 406);
        assert_eq!(best_dpi(&[]), 300);
    }
}
