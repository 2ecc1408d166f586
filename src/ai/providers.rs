//! The AI providers of a deployment: one account each, named in the
//! providers file (`--providers FILE`, `STAGEHAND_PROVIDERS`), or, without
//! one, a single provider `default` from `AI_URL` / `AI_PROVIDER` as
//! before. This module reads and checks the file; `startup` builds a
//! client, a breaker and a rate limit per provider, and the store keeps
//! each provider's shared cap (`providers` table) for the claim.
//!
//! ```toml
//! [providers.images]
//! kind = "jobs"               # jobs | openai | replicate
//! url = "http://127.0.0.1:9090"
//! max_in_flight = 10          # the account's concurrent jobs
//! rate_limit = "20/s"         # optional
//! api_key_env = "IMAGES_KEY"  # optional: the variable holding the key
//! ```
//!
//! By kind: `replicate` takes `model` or `version` and `photo_input` (the
//! model input field of a participant's photo, default `image`); `openai`
//! takes `chat_model`, `image_model` and `image_size`.
//!
//! A key written into the file itself is refused: the file is config,
//! often committed or copied around, and a key in it leaks with it.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::ProviderKind;
use crate::units::{parse_rate_limit, RateLimit};

/// The name of the provider an experience uses when it names none, and the
/// one made from `AI_URL` / `AI_PROVIDER` when there is no providers file.
pub const DEFAULT_PROVIDER: &str = "default";

/// Upper bound of a provider's `max_in_flight`.
pub const MAX_PROVIDER_IN_FLIGHT: i32 = 100_000;

/// One provider as configured.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderSpec {
    pub name: String,
    pub kind: ProviderKind,
    /// Base URL. None: the kind's default (`jobs`: the built-in simulator).
    pub url: Option<String>,
    /// The account's concurrent jobs across every experience and every
    /// instance. None: no shared cap (only each experience's ceiling), as
    /// for `default` without a providers file.
    pub max_in_flight: Option<i32>,
    /// Requests (submits, polls, cancels) of all instances together.
    pub rate_limit: RateLimit,
    /// The environment variable holding the bearer key.
    pub api_key_env: Option<String>,
    /// Model settings, by kind: `replicate` uses `model` ("owner/name") or
    /// `version`, and `photo_input`; `openai` uses `chat_model`,
    /// `image_model`, `image_size`.
    pub model: Option<String>,
    pub version: Option<String>,
    pub chat_model: Option<String>,
    pub image_model: Option<String>,
    pub image_size: Option<String>,
    /// Origins (`https://host[:port]`, `https://*.host`) besides the
    /// provider's own that its result files may be fetched from. A listed
    /// origin that resolves to a private or loopback address is refused.
    pub result_origins: Vec<String>,
    /// `replicate`: the model input field the participant's photo goes in
    /// (None: `image`).
    pub photo_input: Option<String>,
}

impl ProviderSpec {
    /// The rate limit as the admin API shows it (`"20/s"`), None when off.
    pub fn rate_limit_text(&self) -> Option<String> {
        match self.rate_limit {
            RateLimit::Off => None,
            RateLimit::Every { count, per } => {
                Some(format!("{count}/{}", humantime::format_duration(per)))
            }
        }
    }

    /// The kind as written in the file and shown by the admin API.
    pub fn kind_name(&self) -> &'static str {
        kind_name(self.kind)
    }
}

pub fn kind_name(kind: ProviderKind) -> &'static str {
    match kind {
        ProviderKind::Jobs => "jobs",
        ProviderKind::Openai => "openai",
        ProviderKind::Replicate => "replicate",
    }
}

/// Why a providers file was refused; `serve` stops with it at start.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ProvidersFileError {
    #[error("cannot read the providers file {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("providers file, line {line}: {reason}")]
    Invalid { line: usize, reason: String },
}

/// The file as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    providers: BTreeMap<String, toml::Spanned<Entry>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    kind: String,
    url: Option<String>,
    max_in_flight: i64,
    rate_limit: Option<String>,
    api_key_env: Option<String>,
    model: Option<String>,
    version: Option<String>,
    chat_model: Option<String>,
    image_model: Option<String>,
    image_size: Option<String>,
    #[serde(default)]
    result_origins: Vec<String>,
    photo_input: Option<String>,
}

/// Fields that would hold a key itself.
const KEY_FIELDS: [&str; 5] = ["api_key", "key", "token", "secret", "api_token"];

/// Reads and checks the providers file at `path`.
pub fn load(path: &Path) -> Result<Vec<ProviderSpec>, ProvidersFileError> {
    let text = std::fs::read_to_string(path).map_err(|e| ProvidersFileError::Read {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    parse(&text)
}

/// Parses and checks a providers file.
pub fn parse(text: &str) -> Result<Vec<ProviderSpec>, ProvidersFileError> {
    // The 1-based line of a byte offset: the newlines before it, plus one.
    let line_at = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
    if let Some((line, field)) = key_in_file(text) {
        return Err(ProvidersFileError::Invalid {
            line,
            reason: format!(
                "`{field}` would put a key in this file; put the key in an environment \
                 variable and name that variable with api_key_env = \"NAME\""
            ),
        });
    }
    let file: File = toml::from_str(text).map_err(|e| ProvidersFileError::Invalid {
        line: e.span().map(|s| line_at(s.start)).unwrap_or(1),
        reason: e.message().trim().to_owned(),
    })?;
    if file.providers.is_empty() {
        return Err(ProvidersFileError::Invalid {
            line: 1,
            reason: "no provider: add a [providers.NAME] table".to_owned(),
        });
    }
    let mut specs = Vec::with_capacity(file.providers.len());
    for (name, entry) in file.providers {
        let line = line_at(entry.span().start);
        let entry = entry.into_inner();
        let invalid = |reason: String| ProvidersFileError::Invalid { line, reason };
        if name.is_empty()
            || name.len() > 40
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(invalid(format!(
                "provider name {name:?}: use 1 to 40 letters, digits, '-' or '_'"
            )));
        }
        let kind = match entry.kind.as_str() {
            "jobs" => ProviderKind::Jobs,
            "openai" => ProviderKind::Openai,
            "replicate" => ProviderKind::Replicate,
            other => {
                return Err(invalid(format!(
                    "[providers.{name}] kind {other:?}: use jobs, openai or replicate"
                )))
            }
        };
        if !(1..=i64::from(MAX_PROVIDER_IN_FLIGHT)).contains(&entry.max_in_flight) {
            return Err(invalid(format!(
                "[providers.{name}] max_in_flight must be 1 to {MAX_PROVIDER_IN_FLIGHT}, not {}",
                entry.max_in_flight
            )));
        }
        if let Some(url) = &entry.url {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(invalid(format!(
                    "[providers.{name}] url must be an http:// or https:// URL, not {url:?}"
                )));
            }
        }
        let rate_limit = match &entry.rate_limit {
            None => RateLimit::Off,
            Some(text) => parse_rate_limit(text)
                .map_err(|e| invalid(format!("[providers.{name}] rate_limit: {e}")))?,
        };
        if let Some(var) = &entry.api_key_env {
            let valid = !var.is_empty()
                && var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !var.starts_with(|c: char| c.is_ascii_digit());
            if !valid {
                return Err(invalid(format!(
                    "[providers.{name}] api_key_env names an environment variable (like \
                     IMAGES_KEY), not a key; {} characters given",
                    var.chars().count()
                )));
            }
        }
        if kind == ProviderKind::Replicate && entry.model.is_none() && entry.version.is_none() {
            return Err(invalid(format!(
                "[providers.{name}] a replicate provider needs model = \"owner/name\" or version = \"...\""
            )));
        }
        if let Some(field) = &entry.photo_input {
            check_photo_input(&name, kind, field).map_err(invalid)?;
        }
        specs.push(ProviderSpec {
            name,
            kind,
            url: entry.url,
            max_in_flight: Some(entry.max_in_flight as i32),
            rate_limit,
            api_key_env: entry.api_key_env,
            model: entry.model,
            version: entry.version,
            chat_model: entry.chat_model,
            image_model: entry.image_model,
            image_size: entry.image_size,
            result_origins: entry.result_origins,
            photo_input: entry.photo_input,
        });
    }
    Ok(specs)
}

/// `photo_input` names a model input field of a `replicate` provider:
/// letters, digits and `_`, and not `prompt` (which carries the words).
fn check_photo_input(name: &str, kind: ProviderKind, field: &str) -> Result<(), String> {
    if kind != ProviderKind::Replicate {
        return Err(format!(
            "[providers.{name}] photo_input is a replicate setting (the model input field of the photo); a {} provider takes no such field",
            kind_name(kind)
        ));
    }
    let valid = !field.is_empty()
        && field.len() <= 64
        && field.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && field != "prompt";
    if !valid {
        return Err(format!(
            "[providers.{name}] photo_input {field:?}: name the model's input field of the photo (letters, digits, '_'; not prompt), like \"image\" or \"input_image\""
        ));
    }
    Ok(())
}

/// The first line that sets a field holding a key itself, and the field.
fn key_in_file(text: &str) -> Option<(usize, String)> {
    text.lines().enumerate().find_map(|(i, line)| {
        let (field, _) = line.split_once('=')?;
        let field = field.trim().trim_matches('"').to_ascii_lowercase();
        KEY_FIELDS.contains(&field.as_str()).then(|| (i + 1, field))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = r#"
[providers.images]
kind = "jobs"
url = "http://127.0.0.1:9090"
max_in_flight = 10
rate_limit = "20/s"
api_key_env = "IMAGES_KEY"

[providers.llm]
kind = "openai"
url = "https://api.openai.com"
max_in_flight = 4
"#;

    #[test]
    fn reads_every_field() {
        let specs = parse(TWO).unwrap();
        assert_eq!(specs.len(), 2);
        let images = &specs[0];
        assert_eq!(images.name, "images");
        assert_eq!(images.kind, ProviderKind::Jobs);
        assert_eq!(images.url.as_deref(), Some("http://127.0.0.1:9090"));
        assert_eq!(images.max_in_flight, Some(10));
        assert_eq!(images.rate_limit_text().as_deref(), Some("20/1s"));
        assert_eq!(images.api_key_env.as_deref(), Some("IMAGES_KEY"));
        assert_eq!(specs[1].kind, ProviderKind::Openai);
        assert_eq!(specs[1].rate_limit, RateLimit::Off);
    }

    #[test]
    fn a_key_in_the_file_is_refused_with_its_line() {
        let text = "[providers.a]\nkind = \"jobs\"\nmax_in_flight = 2\napi_key = \"sk-live-123\"\n";
        let err = parse(text).unwrap_err();
        assert_eq!(
            err,
            ProvidersFileError::Invalid {
                line: 4,
                reason: "`api_key` would put a key in this file; put the key in an environment \
                         variable and name that variable with api_key_env = \"NAME\""
                    .to_owned()
            }
        );
        assert!(!err.to_string().contains("sk-live-123"));
    }

    #[test]
    fn a_key_given_as_api_key_env_is_refused_without_showing_it() {
        let text =
            "[providers.a]\nkind = \"jobs\"\nmax_in_flight = 2\napi_key_env = \"sk-live/123=\"\n";
        let err = parse(text).unwrap_err().to_string();
        assert!(
            err.contains("api_key_env names an environment variable"),
            "{err}"
        );
        assert!(!err.contains("sk-live"), "{err}");
    }

    #[test]
    fn bad_values_say_their_line_and_reason() {
        let cases = [
            (
                "[providers.a]\nkind = \"grpc\"\nmax_in_flight = 2\n",
                "kind \"grpc\"",
            ),
            (
                "[providers.a]\nkind = \"jobs\"\nmax_in_flight = 0\n",
                "max_in_flight must be 1",
            ),
            (
                "[providers.a]\nkind = \"jobs\"\n",
                "missing field `max_in_flight`",
            ),
            (
                "[providers.a]\nkind = \"jobs\"\nmax_in_flight = 2\nrate_limit = \"fast\"\n",
                "rate_limit",
            ),
            (
                "[providers.a]\nkind = \"jobs\"\nmax_in_flight = 2\nurl = \"ftp://x\"\n",
                "url must be",
            ),
            (
                "[providers.a]\nkind = \"replicate\"\nmax_in_flight = 2\n",
                "needs model",
            ),
            (
                "[providers.a]\nkind = \"jobs\"\nmax_in_flight = 2\ncolour = 1\n",
                "unknown field",
            ),
            ("[providers.a]\nkind = jobs\n", "line 2"),
            ("", "no provider"),
        ];
        for (text, expected) in cases {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(expected), "{text:?} gave {err:?}");
            assert!(err.starts_with("providers file, line "), "{err}");
        }
    }

    #[test]
    fn photo_input_names_a_replicate_input_field() {
        let replicate = |line: &str| {
            format!(
                "[providers.r]\nkind = \"replicate\"\nmax_in_flight = 2\nmodel = \"o/m\"\n{line}\n"
            )
        };
        let specs = parse(&replicate("photo_input = \"input_image\"")).unwrap();
        assert_eq!(specs[0].photo_input.as_deref(), Some("input_image"));
        assert_eq!(parse(&replicate("")).unwrap()[0].photo_input, None);
        for bad in ["\"\"", "\"prompt\"", "\"input image\"", "\"a.b\""] {
            let err = parse(&replicate(&format!("photo_input = {bad}")))
                .unwrap_err()
                .to_string();
            assert!(err.contains("photo_input"), "{bad}: {err}");
            assert!(err.starts_with("providers file, line "), "{err}");
        }
        let err =
            parse("[providers.a]\nkind = \"openai\"\nmax_in_flight = 2\nphoto_input = \"image\"\n")
                .unwrap_err()
                .to_string();
        assert!(err.contains("photo_input is a replicate setting"), "{err}");
    }

    #[test]
    fn a_missing_file_says_its_path() {
        let err = load(Path::new("/nonexistent/providers.toml")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/providers.toml"));
    }
}
