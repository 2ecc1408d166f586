//! An SMTP server for the tests: `smtp_server.py` beside this file, one
//! Python process per [`SmtpServer`], on 127.0.0.1. It is `aiosmtpd` (from
//! PyPI, which `.ci/run` installs), never a mock of SMTP; it parses every
//! message it keeps with Python's own `email` package, never with
//! stagehand's code, and answers DATA the way a test sets with
//! [`SmtpServer::mode`]:
//!
//! - `accept` (at first): kept, answered 250.
//! - `tempfail_once`: not kept, answered `451 4.3.0`; then `accept` again.
//! - `reject`: not kept, answered `550 5.1.1`; the mode stays.
//! - `drop_after_data`: kept, then the connection is closed with no answer
//!   at all; then `accept` again.
//! - `hold`: kept, answered 250 only at [`SmtpServer::release`]; the mode
//!   stays, so later ones are held too.
//!
//! What each kept message looks like is in `smtp_server.py`'s doc string.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const INSTALL: &str = "python3 -m pip install aiosmtpd==1.4.6";

/// One server; killed on drop.
pub struct SmtpServer {
    /// Where mail goes: `smtp://127.0.0.1:PORT` (plain SMTP, no TLS, no
    /// AUTH).
    pub url: String,
    /// Its SMTP port.
    pub port: u16,
    control: String,
    child: Child,
    http: reqwest::Client,
}

impl SmtpServer {
    pub fn start() -> SmtpServer {
        // reqwest over rustls needs the process's crypto provider first.
        stagehand::ai::client::ensure_crypto_provider();
        let http = reqwest::Client::new();
        let script =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/smtp_server.py");
        let mut child = Command::new("python3")
            .arg(&script)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        let mut first = String::new();
        BufReader::new(child.stdout.take().expect("the SMTP server's stdout"))
            .read_line(&mut first)
            .expect("the SMTP server's ports");
        let ports: Vec<u16> = first
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .unwrap_or_default();
        let (port, control) = match ports.as_slice() {
            [port, control] => (*port, *control),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the SMTP server did not start ({INSTALL}): {first:?}")
            }
        };
        SmtpServer {
            url: format!("smtp://127.0.0.1:{port}"),
            port,
            control: format!("http://127.0.0.1:{control}"),
            child,
            http,
        }
    }

    /// How DATA is answered from now on: `accept`, `tempfail_once`,
    /// `reject`, `drop_after_data` or `hold`.
    pub async fn mode(&self, mode: &str) {
        let resp = self
            .http
            .post(format!("{}/control", self.control))
            .json(&json!({ "mode": mode }))
            .send()
            .await
            .expect("the SMTP server's control");
        let status = resp.status();
        assert!(
            status.is_success(),
            "mode {mode:?}: {status} {}",
            resp.text().await.unwrap_or_default()
        );
    }

    /// Answers 250 to every message held now (`hold`); later ones are held
    /// again unless the mode changed.
    pub async fn release(&self) {
        let resp = self
            .http
            .post(format!("{}/release", self.control))
            .send()
            .await
            .expect("the SMTP server's release");
        assert!(resp.status().is_success());
    }

    /// Every message kept, in the order they came: `{"mail_from",
    /// "rcpt_tos", "outcome" (accepted, dropped or held), "message_id",
    /// "subject", "from", "to", "date", "content_language", "text", "html",
    /// "inline_images": [{"content_id", "content_type", "size", "width",
    /// "height"}], "attachments": [{"filename", "content_type", "size"}],
    /// "structure", "raw_size", "header_names", "part_header_names",
    /// "defects"}`.
    pub async fn received(&self) -> Vec<Value> {
        self.get("received").await
    }

    /// Every DATA, in order: `{"outcome" (accepted, tempfail, rejected,
    /// dropped or held), "message_id"}`.
    pub async fn attempts(&self) -> Vec<Value> {
        self.get("attempts").await
    }

    /// Waits until at least `count` messages were kept; panics with those
    /// there are after `deadline`.
    pub async fn wait_received(&self, count: usize, deadline: Duration) -> Vec<Value> {
        self.wait("received", count, deadline).await
    }

    /// Waits until at least `count` DATA attempts were made; panics with
    /// those there are after `deadline`.
    pub async fn wait_attempts(&self, count: usize, deadline: Duration) -> Vec<Value> {
        self.wait("attempts", count, deadline).await
    }

    async fn get(&self, what: &str) -> Vec<Value> {
        self.http
            .get(format!("{}/{what}", self.control))
            .send()
            .await
            .unwrap_or_else(|e| panic!("the SMTP server's {what}: {e}"))
            .json()
            .await
            .unwrap_or_else(|e| panic!("the SMTP server's {what} as JSON: {e}"))
    }

    async fn wait(&self, what: &str, count: usize, deadline: Duration) -> Vec<Value> {
        let started = Instant::now();
        loop {
            let got = self.get(what).await;
            if got.len() >= count {
                return got;
            }
            if started.elapsed() > deadline {
                panic!(
                    "the SMTP server had {} {what}, not {count}, after {deadline:?}: {}",
                    got.len(),
                    Value::Array(got)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for SmtpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
