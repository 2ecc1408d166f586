//! Prints, as rules: a print's statuses and which are final, the IPP
//! `job-name` derived from its id (how a printer is asked, after a crash,
//! whether it already has the job), which printer states hold a queue,
//! and the reasons a waiting guest reads, as keys of the locale tables
//! (`print.reason.*`), so the phone, the display and /ops say the same
//! thing in the guest's language.

use std::str::FromStr;

/// Where a print is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrintStatus {
    /// Waiting for a printer (or for an operator, with review).
    Queued,
    /// Being sent to a printer: it may or may not have it yet.
    Sending,
    /// The printer has it (an IPP job id).
    Printing,
    Completed,
    /// An operator canceled it.
    Canceled,
    /// It cannot be printed (the reason says why).
    Aborted,
}

impl PrintStatus {
    pub const OPEN: [PrintStatus; 3] = [
        PrintStatus::Queued,
        PrintStatus::Sending,
        PrintStatus::Printing,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PrintStatus::Queued => "QUEUED",
            PrintStatus::Sending => "SENDING",
            PrintStatus::Printing => "PRINTING",
            PrintStatus::Completed => "COMPLETED",
            PrintStatus::Canceled => "CANCELED",
            PrintStatus::Aborted => "ABORTED",
        }
    }

    pub fn is_final(self) -> bool {
        !PrintStatus::OPEN.contains(&self)
    }
}

impl FromStr for PrintStatus {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        [
            PrintStatus::Queued,
            PrintStatus::Sending,
            PrintStatus::Printing,
            PrintStatus::Completed,
            PrintStatus::Canceled,
            PrintStatus::Aborted,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
        .ok_or_else(|| format!("unknown print status {text:?}"))
    }
}

/// The IPP `job-name` of print `print_id`: the printer keeps it with the
/// job, so the print actor finds a job it sent before a crash by it.
pub fn job_name(print_id: &str) -> String {
    format!("stagehand-{print_id}")
}

/// Why a print waits or ended, as a key of the locale tables
/// (`print.reason.<key>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrintReason {
    AwaitingReview,
    NoPrinter,
    OutOfPaper,
    PaperJam,
    Offline,
    Paused,
    Busy,
    OutOfInk,
    Refused,
    NoResult,
    CanceledByOperator,
}

impl PrintReason {
    const ALL: [PrintReason; 11] = [
        PrintReason::AwaitingReview,
        PrintReason::NoPrinter,
        PrintReason::OutOfPaper,
        PrintReason::PaperJam,
        PrintReason::Offline,
        PrintReason::Paused,
        PrintReason::Busy,
        PrintReason::OutOfInk,
        PrintReason::Refused,
        PrintReason::NoResult,
        PrintReason::CanceledByOperator,
    ];

    pub fn key(self) -> &'static str {
        match self {
            PrintReason::AwaitingReview => "awaiting_review",
            PrintReason::NoPrinter => "no_printer",
            PrintReason::OutOfPaper => "out_of_paper",
            PrintReason::PaperJam => "paper_jam",
            PrintReason::Offline => "offline",
            PrintReason::Paused => "paused",
            PrintReason::Busy => "busy",
            PrintReason::OutOfInk => "out_of_ink",
            PrintReason::Refused => "refused",
            PrintReason::NoResult => "no_result",
            PrintReason::CanceledByOperator => "canceled",
        }
    }

    /// The locale tables' key of its text.
    pub fn text_key(self) -> String {
        format!("print.reason.{}", self.key())
    }

    /// The reason as stored (`key`, or `key: detail`).
    pub fn stored(self, detail: Option<&str>) -> String {
        match detail {
            Some(detail) => format!("{}: {detail}", self.key()),
            None => self.key().to_owned(),
        }
    }

    /// A stored reason read back: the reason and its detail.
    pub fn parse_stored(text: &str) -> Option<(PrintReason, Option<&str>)> {
        let (key, detail) = match text.split_once(": ") {
            Some((key, detail)) => (key, Some(detail)),
            None => (text, None),
        };
        PrintReason::ALL
            .into_iter()
            .find(|r| r.key() == key)
            .map(|r| (r, detail))
    }
}

/// Why a printer in this state takes no job now (None: it takes one).
/// The reasons are IPP's `printer-state-reasons` keywords, with or
/// without their `-error`/`-warning`/`-report` suffix: the suffix is the
/// printer's severity, which follows its state (CUPS's reference printer
/// says `media-empty-report` while idle and `media-empty-warning` while a
/// job waits for paper), so a keyword that stops paper holds the queue
/// whatever its suffix. Keywords that stop nothing (`marker-supply-low`,
/// `media-low`) never hold it.
pub fn holds_the_queue(state: &str, reasons: &[String]) -> Option<PrintReason> {
    let blocking = |reason: &str| -> Option<PrintReason> {
        let keyword = ["-error", "-warning", "-report"]
            .iter()
            .find_map(|suffix| reason.strip_suffix(suffix))
            .unwrap_or(reason);
        match keyword {
            "media-empty" | "media-needed" | "input-tray-missing" => Some(PrintReason::OutOfPaper),
            "media-jam" => Some(PrintReason::PaperJam),
            "marker-supply-empty" | "toner-empty" | "marker-waste-full" => {
                Some(PrintReason::OutOfInk)
            }
            "offline" | "shutdown" | "connecting-to-device" => Some(PrintReason::Offline),
            "paused" | "moving-to-paused" => Some(PrintReason::Paused),
            "door-open" | "cover-open" => Some(PrintReason::PaperJam),
            _ => None,
        }
    };
    if let Some(reason) = reasons.iter().find_map(|r| blocking(r)) {
        return Some(reason);
    }
    match state {
        "stopped" => Some(PrintReason::Paused),
        "unreachable" | "unknown" => Some(PrintReason::Offline),
        _ => None,
    }
}

/// The displays' frame when an experience's prints wait for a printer that
/// holds its queue: how many wait, and why (a [`PrintReason::key`], which
/// the display says in its language).
pub fn print_waiting_frame(waiting: usize, reason: PrintReason) -> String {
    serde_json::json!({"type": "print.waiting", "waiting": waiting, "reason": reason.key()})
        .to_string()
}

/// The displays' frame once no print waits for a held printer any more.
pub const PRINTS_GO_ON_FRAME: &str = r#"{"type":"print.waiting","waiting":0,"reason":null}"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn reasons(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn statuses_read_back_and_know_when_they_end() {
        for status in PrintStatus::OPEN {
            assert_eq!(status.as_str().parse::<PrintStatus>(), Ok(status));
            assert!(!status.is_final());
        }
        assert!(PrintStatus::Completed.is_final() && PrintStatus::Aborted.is_final());
        assert!("DONE".parse::<PrintStatus>().is_err());
    }

    #[test]
    fn out_of_paper_and_a_stopped_printer_hold_the_queue_a_low_supply_does_not() {
        assert_eq!(holds_the_queue("idle", &reasons(&["none"])), None);
        assert_eq!(
            holds_the_queue("idle", &reasons(&["media-empty-error"])),
            Some(PrintReason::OutOfPaper)
        );
        assert_eq!(
            holds_the_queue("processing", &reasons(&["media-needed"])),
            Some(PrintReason::OutOfPaper)
        );
        assert_eq!(
            holds_the_queue("idle", &reasons(&["marker-supply-low-warning"])),
            None
        );
        assert_eq!(
            holds_the_queue("idle", &reasons(&["media-empty-report"])),
            Some(PrintReason::OutOfPaper)
        );
        assert_eq!(
            holds_the_queue("processing", &reasons(&["media-needed-warning"])),
            Some(PrintReason::OutOfPaper)
        );
        assert_eq!(holds_the_queue("stopped", &[]), Some(PrintReason::Paused));
        assert_eq!(
            holds_the_queue("unreachable", &[]),
            Some(PrintReason::Offline)
        );
        assert_eq!(
            holds_the_queue("idle", &reasons(&["media-jam"])),
            Some(PrintReason::PaperJam)
        );
    }

    #[test]
    fn a_stored_reason_reads_back_with_its_detail() {
        let stored =
            PrintReason::Refused.stored(Some("client-error-document-format-not-supported"));
        assert_eq!(
            PrintReason::parse_stored(&stored),
            Some((
                PrintReason::Refused,
                Some("client-error-document-format-not-supported")
            ))
        );
        assert_eq!(
            PrintReason::parse_stored("out_of_paper"),
            Some((PrintReason::OutOfPaper, None))
        );
        assert_eq!(job_name("abc"), "stagehand-abc");
    }
}
