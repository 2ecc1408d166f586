//! The printed result: a header line, one markdown-style table (a column per
//! backend, plus the ratio to pgbench for PostgreSQL), and notes on the
//! server logs.

use super::load::{Backend, Figures, ScenarioResult};
use super::pgbench::{Pgbench, DESCRIPTION};

/// The lines above the table.
pub fn header(
    sessions: usize,
    concurrency: usize,
    sync_commit: Option<&str>,
    pgbench: Option<&Pgbench>,
    server_args: &[String],
) -> String {
    let mut line = format!(
        "stagehand bench: {sessions} sagas per scenario, {concurrency} submitters, simulator at 0 ms"
    );
    if let Some(sc) = sync_commit {
        line.push_str(&format!(", synchronous_commit={sc}"));
    }
    if !server_args.is_empty() {
        line.push_str(&format!(", serve {}", server_args.join(" ")));
    }
    match pgbench {
        Some(Pgbench::Tps(tps)) => {
            line.push_str(&format!("\npgbench ({DESCRIPTION}): {tps:.0} tps"))
        }
        Some(Pgbench::NotInstalled) => {
            line.push_str("\npgbench: not on PATH, so no ratios to pgbench")
        }
        Some(Pgbench::Failed(e)) => line.push_str(&format!("\npgbench: FAILED ({e})")),
        None => {}
    }
    line.push('\n');
    line
}

/// One row: its label, how to show a scenario, whether a ratio to pgbench
/// makes sense.
struct Row {
    label: &'static str,
    terminals: usize,
    show: fn(&Figures) -> String,
    rate: Option<fn(&Figures) -> f64>,
}

/// The table.
pub fn render(results: &[ScenarioResult], pgbench: Option<&Pgbench>) -> String {
    let rows = [
        Row {
            label: "accepted submissions/s, 1 terminal",
            terminals: 1,
            show: |f| rate(f.accepted_per_s),
            rate: Some(|f| f.accepted_per_s),
        },
        Row {
            label: "accepted submissions/s, 50 terminals",
            terminals: 50,
            show: |f| rate(f.accepted_per_s),
            rate: Some(|f| f.accepted_per_s),
        },
        Row {
            label: "end-to-end sagas/s, 1 terminal",
            terminals: 1,
            show: |f| rate(f.sagas_per_s),
            rate: Some(|f| f.sagas_per_s),
        },
        Row {
            label: "end-to-end sagas/s, 50 terminals",
            terminals: 50,
            show: |f| rate(f.sagas_per_s),
            rate: Some(|f| f.sagas_per_s),
        },
        Row {
            label: "submit latency p50 / p99 (ms), 1 terminal",
            terminals: 1,
            show: |f| format!("{} / {}", millis(f.submit_p50_ms), millis(f.submit_p99_ms)),
            rate: None,
        },
        Row {
            label: "submit latency p50 / p99 (ms), 50 terminals",
            terminals: 50,
            show: |f| format!("{} / {}", millis(f.submit_p50_ms), millis(f.submit_p99_ms)),
            rate: None,
        },
        Row {
            label: "read latency p50 / p99 (ms) under load, 1 terminal",
            terminals: 1,
            show: |f| format!("{} / {}", millis(f.read_p50_ms), millis(f.read_p99_ms)),
            rate: None,
        },
        Row {
            label: "read latency p50 / p99 (ms) under load, 50 terminals",
            terminals: 50,
            show: |f| format!("{} / {}", millis(f.read_p50_ms), millis(f.read_p99_ms)),
            rate: None,
        },
        Row {
            label: "commit-to-frame p99 (ms), 1 terminal",
            terminals: 1,
            show: |f| millis(f.commit_to_frame_p99_ms),
            rate: None,
        },
        Row {
            label: "commit-to-frame p99 (ms), 50 terminals",
            terminals: 50,
            show: |f| millis(f.commit_to_frame_p99_ms),
            rate: None,
        },
    ];
    let has = |b: Backend| results.iter().any(|r| r.backend == b);
    let tps = match pgbench {
        Some(Pgbench::Tps(t)) if has(Backend::Postgres) => Some(*t),
        _ => None,
    };
    let mut head = vec!["figure".to_owned()];
    if has(Backend::Postgres) {
        head.push("PostgreSQL".into());
        if tps.is_some() {
            head.push("x pgbench".into());
        }
    }
    if has(Backend::Sqlite) {
        head.push("SQLite".into());
    }
    let cell = |b: Backend, row: &Row| -> String {
        match results
            .iter()
            .find(|r| r.backend == b && r.terminals == row.terminals)
        {
            Some(r) => match &r.outcome {
                Ok(f) => (row.show)(f),
                Err(_) => "FAILED".into(),
            },
            None => "-".into(),
        }
    };
    let mut body = Vec::new();
    for row in &rows {
        let mut cells = vec![row.label.to_owned()];
        if has(Backend::Postgres) {
            cells.push(cell(Backend::Postgres, row));
            if let Some(tps) = tps {
                let ratio = results
                    .iter()
                    .find(|r| r.backend == Backend::Postgres && r.terminals == row.terminals)
                    .and_then(|r| r.outcome.as_ref().ok())
                    .and_then(|f| row.rate.map(|get| get(f) / tps));
                cells.push(ratio.map(|x| format!("{x:.2}")).unwrap_or_default());
            }
        }
        if has(Backend::Sqlite) {
            cells.push(cell(Backend::Sqlite, row));
        }
        body.push(cells);
    }
    markdown(&head, &body)
}

/// Lines under the table: per scenario, the error and warning counts of the
/// server log, the display reconnects and the number of unrelated reads.
pub fn notes(results: &[ScenarioResult]) -> Vec<String> {
    let mut out = Vec::new();
    for r in results {
        if let Some(log) = &r.log {
            let reconnects = match &r.outcome {
                Ok(f) => format!(
                    "; display reconnects: {}; unrelated reads under load: {}",
                    f.reconnects, f.reads
                ),
                Err(_) => String::new(),
            };
            out.push(format!(
                "server log, {}: {} ERROR, {} WARN line(s){reconnects}",
                r.label, log.errors, log.warnings
            ));
            for sample in &log.samples {
                out.push(format!("    {sample}"));
            }
        }
    }
    if !out.is_empty() {
        out.insert(0, String::new());
    }
    out
}

/// Pipes, first column left-aligned, the others right-aligned.
fn markdown(head: &[String], body: &[Vec<String>]) -> String {
    let width = |i: usize| {
        body.iter()
            .map(|r| r[i].chars().count())
            .chain([head[i].chars().count(), 3])
            .max()
            .unwrap_or(3)
    };
    let widths: Vec<usize> = (0..head.len()).map(width).collect();
    let line = |cells: &[String]| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i == 0 {
                    format!(" {c:<w$} ", w = widths[i])
                } else {
                    format!(" {c:>w$} ", w = widths[i])
                }
            })
            .collect();
        format!("|{}|", parts.join("|"))
    };
    let rule: Vec<String> = widths
        .iter()
        .enumerate()
        .map(|(i, w)| {
            if i == 0 {
                "-".repeat(w + 2)
            } else {
                format!("{}:", "-".repeat(w + 1))
            }
        })
        .collect();
    let mut out = vec![line(head), format!("|{}|", rule.join("|"))];
    out.extend(body.iter().map(|r| line(r)));
    out.join("\n")
}

fn rate(x: f64) -> String {
    format!("{x:.0}")
}

fn millis(x: f64) -> String {
    if x < 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::markdown;

    #[test]
    fn aligned_pipes() {
        let t = markdown(
            &["figure".into(), "SQLite".into()],
            &[vec!["a".into(), "12".into()]],
        );
        assert_eq!(
            t,
            "| figure | SQLite |\n|--------|-------:|\n| a      |     12 |"
        );
    }
}
