//! Languages. An experience has a locale (`en` or `ko`); the human messages
//! (abort reasons, progress) and the page texts come from one table per
//! locale, `static/i18n/<locale>.json`, which the server embeds and the pages
//! fetch. A key missing from a table falls back to English, then to the key.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, utoipa::ToSchema)]
#[schema(rename_all = "lowercase")]
pub enum Locale {
    #[default]
    En,
    Ko,
}

const EN: &str = include_str!("../../static/i18n/en.json");
const KO: &str = include_str!("../../static/i18n/ko.json");

impl Locale {
    pub const ALL: [Locale; 2] = [Locale::En, Locale::Ko];

    pub fn as_str(self) -> &'static str {
        match self {
            Locale::En => "en",
            Locale::Ko => "ko",
        }
    }

    /// The table as embedded (JSON text), for serving to the pages.
    pub fn table_json(self) -> &'static str {
        match self {
            Locale::En => EN,
            Locale::Ko => KO,
        }
    }

    fn table(self) -> &'static HashMap<String, String> {
        static TABLES: OnceLock<[HashMap<String, String>; 2]> = OnceLock::new();
        let tables = TABLES.get_or_init(|| {
            // The tables are part of the build; a broken one is a bug the
            // locale tests catch.
            let parse = |text: &str| serde_json::from_str(text).unwrap_or_default();
            [parse(EN), parse(KO)]
        });
        match self {
            Locale::En => &tables[0],
            Locale::Ko => &tables[1],
        }
    }

    /// The text of `key` in this language (English when this table lacks
    /// it, the key itself when both do).
    pub fn text(self, key: &str) -> Cow<'static, str> {
        self.table()
            .get(key)
            .or_else(|| Locale::En.table().get(key))
            .map(|text| Cow::Borrowed(text.as_str()))
            .unwrap_or_else(|| Cow::Owned(key.to_owned()))
    }

    /// The locale of an experience as stored; anything unknown reads as
    /// English.
    pub fn of(stored: &str) -> Locale {
        stored.parse().unwrap_or_default()
    }
}

impl fmt::Display for Locale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Texts per locale as an experience stores them (a JSON object of
/// locale to text: its notice, its mail consent), as the API shows them;
/// null when there are none (or the stored text is not such an object).
pub fn stored_texts(stored: Option<&str>) -> serde_json::Value {
    stored
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or(serde_json::Value::Null)
}

impl FromStr for Locale {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Locale::ALL
            .into_iter()
            .find(|l| l.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "locale must be one of {}",
                    Locale::ALL.map(Locale::as_str).join(", ")
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::saga::AbortReason;

    #[test]
    fn every_table_parses_and_has_every_server_message() {
        for locale in Locale::ALL {
            let table: HashMap<String, String> =
                serde_json::from_str(locale.table_json()).expect("the table is JSON");
            let mut keys: Vec<String> = AbortReason::ALL
                .iter()
                .map(|r| format!("abort.{}", r.as_str()))
                .collect();
            keys.extend(
                ["session.OPEN", "session.SUBMITTING", "session.COMPLETED"].map(String::from),
            );
            for key in keys {
                let text = table
                    .get(&key)
                    .unwrap_or_else(|| panic!("{locale} lacks {key}"));
                assert!(!text.trim().is_empty(), "{locale}: {key} is empty");
                assert!(
                    !text.to_lowercase().contains("error"),
                    "{locale}: {key} says error"
                );
            }
        }
    }

    #[test]
    fn korean_differs_and_unknown_keys_fall_back() {
        let key = "abort.INPUT_REJECTED";
        assert!(Locale::En
            .text(key)
            .starts_with("blocked: inappropriate input"));
        assert_ne!(Locale::Ko.text(key), Locale::En.text(key));
        assert_eq!(Locale::Ko.text("no.such.key"), "no.such.key");
        assert_eq!(Locale::of("ko"), Locale::Ko);
        assert_eq!(Locale::of("fr"), Locale::En);
    }
}
