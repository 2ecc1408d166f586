//! `stagehand bench --side-by-side A`: server builds measured by one
//! client in alternation, so that what drifts over a sitting (the disk's
//! writeback, the page cache, another tenant) falls on every build alike.
//! With one `--side-by-side` path the order is A B B A (B: the server
//! build, `--server-binary` or this one); with more, each set runs the
//! builds in order and back (A B C C B A), which for two builds is the
//! same. Each run is pgbench (with PostgreSQL) and the flat-out
//! scenarios. The result is a row per run and, per scenario, each build's
//! median, and each build's ratio to the one before it with its spread:
//! the lowest and highest ratio of the two neighbouring runs of the pair
//! in each set (on the way out and on the way back).
//!
//! The simulator, the client and the accounting are this build's for
//! every build, as with `--server-binary` alone. Nothing is deleted
//! between runs: every run's files stay in the bench's folder until the
//! end, so no run's deletions slow the next one's file creation.

use std::path::{Path, PathBuf};

use super::load::{self, Backend, Load, Scenario, ScenarioResult};
use super::pgbench::{self, Pgbench};
use super::{Bench, BenchArgs};

/// One build measured: its name in the table (its file's name) and path.
#[derive(Debug, Clone)]
struct Build {
    name: String,
    path: PathBuf,
}

/// One run: which build (its index), pgbench, and the scenarios.
struct Run {
    build: usize,
    pgbench: Option<f64>,
    results: Vec<ScenarioResult>,
}

/// The order of the runs over `builds` builds: in order and back, `sets`
/// times (A B B A for two).
pub fn order(builds: usize, sets: usize) -> Vec<usize> {
    (0..sets)
        .flat_map(|_| (0..builds).chain((0..builds).rev()))
        .collect()
}

/// Build `later`'s rate against build `earlier`'s: the ratio of their
/// medians, and the lowest and highest ratio of neighbouring runs of the
/// two (`rates` in run order as [`order`] gives them, with their build;
/// None for a run that failed).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratio {
    pub earlier_median: f64,
    pub later_median: f64,
    pub ratio: f64,
    pub low: f64,
    pub high: f64,
}

impl Ratio {
    pub fn of(rates: &[(usize, Option<f64>)], earlier: usize, later: usize) -> Option<Ratio> {
        let of_build = |build: usize| -> Vec<f64> {
            rates
                .iter()
                .filter(|(b, _)| *b == build)
                .filter_map(|(_, r)| *r)
                .collect()
        };
        let earlier_median = median(of_build(earlier))?;
        let later_median = median(of_build(later))?;
        let pairs: Vec<f64> = rates
            .windows(2)
            .filter_map(|w| match w {
                [(x, Some(a)), (y, Some(b))] if (*x, *y) == (earlier, later) => Some(b / a),
                [(x, Some(b)), (y, Some(a))] if (*x, *y) == (later, earlier) => Some(b / a),
                _ => None,
            })
            .collect();
        if pairs.is_empty() {
            return None;
        }
        Some(Ratio {
            earlier_median,
            later_median,
            ratio: later_median / earlier_median,
            low: pairs.iter().copied().fold(f64::INFINITY, f64::min),
            high: pairs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        })
    }
}

fn median(mut xs: Vec<f64>) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    Some(if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    })
}

/// The builds: each `--side-by-side` path, then the server build.
fn builds(args: &BenchArgs, bench: &Bench) -> Result<Vec<Build>, String> {
    let name = |path: &Path| {
        path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    };
    let mut builds = Vec::new();
    for path in &args.side_by_side {
        if !path.is_file() {
            return Err(format!("--side-by-side {}: no such file", path.display()));
        }
        builds.push(Build {
            name: name(path),
            path: path.clone(),
        });
    }
    let server_name = match &args.server_binary {
        Some(path) => name(path),
        None => "this build".to_owned(),
    };
    builds.push(Build {
        name: server_name,
        path: bench.server_exe.clone(),
    });
    Ok(builds)
}

/// Runs the sets, prints the table; Err when a run failed (the table is
/// printed first, with what did run).
pub(super) async fn run(args: &BenchArgs, bench: &Bench) -> Result<(), String> {
    let builds = builds(args, bench)?;
    let started = chrono::Local::now().format("%Y-%m-%d %H:%M %Z").to_string();
    let load_start = super::load_average();
    let runs_in_order = order(builds.len(), args.sets);
    let mut runs = Vec::new();
    for (n, &build) in runs_in_order.iter().enumerate() {
        eprintln!(
            "bench: side by side, run {} of {}: {}",
            n + 1,
            runs_in_order.len(),
            builds[build].name
        );
        runs.push(one_run(args, bench, build, &builds[build]).await);
    }
    println!(
        "stagehand bench side by side, {started}, {} CPU(s), load average {} at start, {} at end",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_start.map_or("?".into(), |l| format!("{l:.2}")),
        super::load_average().map_or("?".into(), |l| format!("{l:.2}")),
    );
    for build in &builds {
        println!("{} = {}", build.name, build.path.display());
    }
    println!(
        "{} set(s), each the builds in order and back; each run: pgbench ({}), then {} sagas per \
         flat-out scenario, {} submitters, AI simulator at 0 ms",
        args.sets,
        pgbench::DESCRIPTION,
        args.sessions,
        args.concurrency
    );
    println!();
    for line in render(&builds, &runs) {
        println!("{line}");
    }
    let failed: Vec<String> = runs
        .iter()
        .flat_map(|r| &r.results)
        .filter_map(|r| {
            r.outcome
                .as_ref()
                .err()
                .map(|e| format!("{}: {e}", r.label))
        })
        .collect();
    super::cleanup(&bench.dir, args.keep_logs || !failed.is_empty());
    if failed.is_empty() {
        Ok(())
    } else {
        for f in &failed {
            eprintln!("\n{f}");
        }
        Err(format!("{} scenario run(s) failed", failed.len()))
    }
}

/// pgbench, then each flat-out scenario, with `build` serving.
async fn one_run(args: &BenchArgs, bench: &Bench, index: usize, build: &Build) -> Run {
    let pgbench = match &bench.postgres {
        Some(admin) => match pgbench::run(admin, &bench.dir).await {
            Pgbench::Tps(tps) => Some(tps),
            Pgbench::NotInstalled | Pgbench::Failed(_) => None,
        },
        None => None,
    };
    let mut results = Vec::new();
    for (backend, terminals) in flat_scenarios(args, bench) {
        let scenario = Scenario {
            exe: bench.exe.clone(),
            server_exe: build.path.clone(),
            backend,
            terminals,
            sessions: args.sessions,
            concurrency: args.concurrency,
            load: Load::FlatOut,
            instances: 1,
            server_args: bench.server_args.clone(),
            admin_url: bench.postgres.clone(),
            dir: bench.dir.clone(),
            deadline: args.deadline,
        };
        let result = load::run(&scenario).await;
        match &result.outcome {
            Ok(f) => eprintln!(
                "bench: {} {} done: {:.0} sagas/s end to end",
                build.name,
                scenario.label(),
                f.sagas_per_s
            ),
            Err(e) => eprintln!(
                "bench: {} {} FAILED: {}",
                build.name,
                scenario.label(),
                e.lines().next().unwrap_or_default()
            ),
        }
        results.push(result);
    }
    Run {
        build: index,
        pgbench,
        results,
    }
}

/// The flat-out scenarios of a run: per backend, per `--terminals`.
fn flat_scenarios(args: &BenchArgs, bench: &Bench) -> Vec<(Backend, usize)> {
    bench
        .backends()
        .into_iter()
        .flat_map(|backend| args.terminals.iter().map(move |&t| (backend, t)))
        .collect()
}

/// The rows per run, then each build's medians and ratio to the build
/// before it, per scenario.
fn render(builds: &[Build], runs: &[Run]) -> Vec<String> {
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    let labels: Vec<String> = first.results.iter().map(|r| r.label.clone()).collect();
    let mut lines = vec![format!(
        "| run | build | pgbench tps | {} |",
        labels
            .iter()
            .map(|l| format!(
                "{l}: sagas/s (× pgbench) · CPU-ms per saga server / PostgreSQL / AI simulator · transactions / statements per saga"
            ))
            .collect::<Vec<_>>()
            .join(" | ")
    )];
    lines.push(format!("|---|---|---:|{}", "---:|".repeat(labels.len())));
    for (n, run) in runs.iter().enumerate() {
        let cells: Vec<String> = run
            .results
            .iter()
            .map(|r| run_cell(r, run.pgbench))
            .collect();
        lines.push(format!(
            "| {} | {} | {} | {} |",
            n + 1,
            builds[run.build].name,
            run.pgbench.map_or("-".into(), |t| format!("{t:.0}")),
            cells.join(" | ")
        ));
    }
    lines.push(String::new());
    lines.push(
        "| scenario | build | median | ÷ the build before | spread (neighbouring runs) |".into(),
    );
    lines.push("|---|---|---:|---:|---|".into());
    for (i, label) in labels.iter().enumerate() {
        let rates =
            |pick: fn(&load::Figures, Option<f64>) -> Option<f64>| -> Vec<(usize, Option<f64>)> {
                runs.iter()
                    .map(|run| {
                        let figures = run.results.get(i).and_then(|r| r.outcome.as_ref().ok());
                        (run.build, figures.and_then(|f| pick(f, run.pgbench)))
                    })
                    .collect()
            };
        let per_pgbench = |f: &load::Figures, tps: Option<f64>| tps.map(|t| f.sagas_per_s / t);
        for (what, picked, decimals) in [
            ("sagas/s", rates(|f, _| Some(f.sagas_per_s)), 0),
            ("× pgbench", rates(per_pgbench), 3),
        ] {
            lines.extend(ratio_rows(
                &format!("{label} {what}"),
                builds,
                &picked,
                decimals,
            ));
        }
    }
    lines
}

/// Per build: its median, and its ratio to the build before it.
fn ratio_rows(
    what: &str,
    builds: &[Build],
    rates: &[(usize, Option<f64>)],
    decimals: usize,
) -> Vec<String> {
    let mut rows = Vec::new();
    for (b, build) in builds.iter().enumerate() {
        let Some(m) = median(
            rates
                .iter()
                .filter(|(x, _)| *x == b)
                .filter_map(|(_, r)| *r)
                .collect(),
        ) else {
            continue;
        };
        let step = b
            .checked_sub(1)
            .and_then(|before| Ratio::of(rates, before, b))
            .map_or(("".to_owned(), "".to_owned()), |r| {
                (
                    format!("{:.2}×", r.ratio),
                    format!("{:.2}–{:.2}×", r.low, r.high),
                )
            });
        rows.push(format!(
            "| {what} | {} | {m:.decimals$} | {} | {} |",
            build.name, step.0, step.1
        ));
    }
    rows
}

/// One scenario of one run: the rate, its ratio to pgbench, the CPU per
/// saga and the transactions and statements per saga.
fn run_cell(r: &ScenarioResult, pgbench: Option<f64>) -> String {
    let Ok(f) = &r.outcome else {
        return "FAILED".into();
    };
    let ratio = match (r.backend, pgbench) {
        (Backend::Postgres, Some(tps)) => format!(" ({:.3})", f.sagas_per_s / tps),
        _ => String::new(),
    };
    let p = &f.per_saga;
    let pg_cpu = p
        .postgres_cpu_ms
        .map_or(" / -".to_owned(), |ms| format!(" / {ms:.2}"));
    let simulator = format!(" / {:.2}", p.simulator_cpu_ms);
    let statements = match (p.transactions, p.statements) {
        (Some(t), Some(s)) => format!(" · {t:.1} / {s:.1}"),
        (Some(t), None) => format!(" · {t:.1} / -"),
        _ => String::new(),
    };
    format!(
        "{:.0}{ratio} · {:.2}{pg_cpu}{simulator}{statements}",
        f.sagas_per_s, p.server_cpu_ms
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_builds_run_a_b_b_a_and_more_run_in_order_and_back() {
        assert_eq!(order(2, 2), vec![0, 1, 1, 0, 0, 1, 1, 0]);
        assert_eq!(order(3, 1), vec![0, 1, 2, 2, 1, 0]);
    }

    #[test]
    fn the_ratio_is_of_the_medians_and_the_spread_of_neighbouring_runs() {
        let rates = [
            (0, Some(100.0)),
            (1, Some(120.0)),
            (1, Some(90.0)),
            (0, Some(100.0)),
            (0, Some(80.0)),
            (1, Some(100.0)),
            (1, Some(110.0)),
            (0, Some(110.0)),
        ];
        let r = Ratio::of(&rates, 0, 1).unwrap();
        assert_eq!(r.earlier_median, 100.0);
        assert_eq!(r.later_median, 105.0);
        assert!((r.ratio - 1.05).abs() < 1e-9);
        // Neighbours: 120/100, 90/100, 100/80, 110/110 (the two B runs
        // and the A runs that meet between sets are not pairs of the two).
        assert!((r.low - 0.9).abs() < 1e-9, "{r:?}");
        assert!((r.high - 1.25).abs() < 1e-9, "{r:?}");
    }

    #[test]
    fn in_a_bisect_each_build_meets_the_one_before_it_twice_a_set() {
        // A B C C B A: B against A at runs 1-2 and 5-6, C against B at
        // 2-3 and 4-5.
        let rates = [
            (0, Some(100.0)),
            (1, Some(50.0)),
            (2, Some(60.0)),
            (2, Some(66.0)),
            (1, Some(60.0)),
            (0, Some(120.0)),
        ];
        let ba = Ratio::of(&rates, 0, 1).unwrap();
        assert_eq!((ba.low, ba.high), (0.5, 0.5));
        let cb = Ratio::of(&rates, 1, 2).unwrap();
        assert!(
            (cb.low - 1.1).abs() < 1e-9 && (cb.high - 1.2).abs() < 1e-9,
            "{cb:?}"
        );
    }

    #[test]
    fn a_failed_run_leaves_its_pair_out() {
        let rates = [
            (0, Some(100.0)),
            (1, None),
            (1, Some(150.0)),
            (0, Some(100.0)),
        ];
        let r = Ratio::of(&rates, 0, 1).unwrap();
        assert_eq!((r.low, r.high), (1.5, 1.5));
        assert!(Ratio::of(&[(0, Some(1.0)), (1, None)], 0, 1).is_none());
    }
}
