//! A webhook endpoint for the tests: `webhook_receiver.py` beside this
//! file, one Python process per [`WebhookReceiver`], on 127.0.0.1. It
//! verifies every delivery with the reference library of Standard
//! Webhooks (`standardwebhooks` from PyPI, which `.ci/run` installs),
//! never with stagehand's own signing code, keeps what it got, and answers
//! with the status and after the delay a test sets.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

const INSTALL: &str = "python3 -m pip install standardwebhooks==1.1.0";

/// One receiver; killed on drop.
pub struct WebhookReceiver {
    /// Where deliveries go: `http://127.0.0.1:PORT/hook`.
    pub url: String,
    base: String,
    child: Child,
    http: reqwest::Client,
}

impl WebhookReceiver {
    pub fn start() -> WebhookReceiver {
        // reqwest over rustls needs the process's crypto provider first.
        stagehand::ai::client::ensure_crypto_provider();
        let http = reqwest::Client::new();
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/support/webhook_receiver.py");
        let mut child = Command::new("python3")
            .arg(&script)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        let mut first = String::new();
        BufReader::new(child.stdout.take().expect("the receiver's stdout"))
            .read_line(&mut first)
            .expect("the receiver's port");
        let port: u16 = first.trim().parse().unwrap_or_else(|_| {
            let _ = child.kill();
            panic!("the webhook receiver did not start ({INSTALL}): {first:?}")
        });
        WebhookReceiver {
            url: format!("http://127.0.0.1:{port}/hook"),
            base: format!("http://127.0.0.1:{port}"),
            child,
            http,
        }
    }

    /// Sets what the receiver verifies with and how it answers.
    pub async fn control(&self, settings: Value) {
        let resp = self
            .http
            .post(format!("{}/control", self.base))
            .json(&settings)
            .send()
            .await
            .expect("the receiver's control");
        assert!(resp.status().is_success());
    }

    /// The endpoint's secret, as stagehand showed it once.
    pub async fn set_secret(&self, secret: &str) {
        self.control(json!({ "secret": secret })).await;
    }

    /// Answers every delivery with `status`, after `delay`.
    pub async fn answer(&self, status: u16, delay: Duration) {
        self.control(json!({"status": status, "delay_ms": delay.as_millis() as u64}))
            .await;
    }

    /// Checks timestamps against the sender's clock at `now_ms` (a test's
    /// injected clock), not this machine's.
    pub async fn follow_clock(&self, now_ms: i64) {
        self.control(json!({ "now_ms": now_ms })).await;
    }

    /// Every delivery received, in order: `{"id", "verified", "error"?,
    /// "body", "status" (what it was answered), "at"}`.
    pub async fn received(&self) -> Vec<Value> {
        self.http
            .get(format!("{}/received", self.base))
            .send()
            .await
            .expect("the receiver's log")
            .json()
            .await
            .expect("the receiver's log as JSON")
    }
}

impl Drop for WebhookReceiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
