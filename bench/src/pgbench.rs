//! The database's own ceiling: pgbench with a prepared single-row UPDATE on a
//! fresh database, so the table can say how far the server is from it.

use std::path::Path;
use std::process::Command;

/// What pgbench gave.
#[derive(Debug, Clone)]
pub enum Pgbench {
    Tps(f64),
    NotInstalled,
    Failed(String),
}

/// The parameters printed next to the figure.
pub const DESCRIPTION: &str = "prepared single-row UPDATE, -c 8 -j 2 -T 8";

const SCRIPT: &str = "\\set aid random(1, 100000)\n\
UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;\n";

/// Initializes a fresh database, runs the UPDATE script for 8 s, drops the
/// database.
pub async fn run(admin: &str, dir: &Path) -> Pgbench {
    match Command::new("pgbench").arg("--version").output() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Pgbench::NotInstalled,
        Err(e) => return Pgbench::Failed(format!("pgbench --version: {e}")),
        Ok(_) => {}
    }
    let script = dir.join("pgbench-update.sql");
    if let Err(e) = std::fs::write(&script, SCRIPT) {
        return Pgbench::Failed(format!("write {}: {e}", script.display()));
    }
    let (url, name) = match super::create_database(admin).await {
        Ok(x) => x,
        Err(e) => return Pgbench::Failed(e),
    };
    let script = script.display().to_string();
    let outcome = tokio::task::spawn_blocking(move || {
        pgbench(&["-i", "-q", "-s", "1", &url])?;
        let out = pgbench(&[
            "-n", "-M", "prepared", "-c", "8", "-j", "2", "-T", "8", "-f", &script, &url,
        ])?;
        parse_tps(&out).ok_or_else(|| format!("no \"tps = \" line in pgbench output:\n{out}"))
    })
    .await;
    super::drop_database(admin, &name).await;
    match outcome {
        Ok(Ok(tps)) => Pgbench::Tps(tps),
        Ok(Err(e)) => Pgbench::Failed(e),
        Err(e) => Pgbench::Failed(format!("pgbench task: {e}")),
    }
}

/// Runs pgbench; its stdout, or its stderr as the error.
fn pgbench(args: &[&str]) -> Result<String, String> {
    let out = Command::new("pgbench")
        .args(args)
        .output()
        .map_err(|e| format!("run pgbench: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "pgbench {} exited with {}: {}",
            args.first().copied().unwrap_or_default(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `tps = 19312.123456 (without initial connection time)`.
fn parse_tps(out: &str) -> Option<f64> {
    out.lines()
        .filter(|l| l.contains("without initial connection time"))
        .find_map(|l| {
            l.split("tps = ")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
}

#[cfg(test)]
mod tests {
    use super::parse_tps;

    #[test]
    fn reads_tps() {
        let out = "latency average = 0.4 ms\n\
                   initial connection time = 3.1 ms\n\
                   tps = 19312.123456 (without initial connection time)\n";
        assert_eq!(parse_tps(out), Some(19312.123456));
        assert_eq!(parse_tps("nothing"), None);
    }
}
