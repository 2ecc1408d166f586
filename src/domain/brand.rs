//! The event's brand, as rules: how an overlay is placed (`cover` or
//! `fit`), where the branded rendition is shown (display, share, print),
//! what a caption may be, and the keys of a result's branded renditions
//! (derived from the kept original's, so a keep that runs again after a
//! crash overwrites them and never adds a second). The pixels are drawn
//! in `crate::media::brand`.

use std::collections::BTreeSet;
use std::str::FromStr;

/// The longest caption, in characters.
pub const MAX_CAPTION_CHARS: usize = 80;

/// How the overlay is placed on a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BrandFit {
    /// Scaled to cover the whole result (centred; what sticks out is cut).
    #[default]
    Cover,
    /// Scaled to fit inside the result (centred; nothing is cut).
    Fit,
}

impl BrandFit {
    pub fn as_str(self) -> &'static str {
        match self {
            BrandFit::Cover => "cover",
            BrandFit::Fit => "fit",
        }
    }

    /// The overlay's size and top-left corner on a `width` × `height`
    /// result, for an overlay of `ow` × `oh` (at least 1 × 1).
    pub fn placement(self, (width, height): (u32, u32), (ow, oh): (u32, u32)) -> Placement {
        let (sx, sy) = (
            f64::from(width) / f64::from(ow.max(1)),
            f64::from(height) / f64::from(oh.max(1)),
        );
        let scale = match self {
            BrandFit::Cover => sx.max(sy),
            BrandFit::Fit => sx.min(sy),
        };
        let w = ((f64::from(ow) * scale).round() as u32).max(1);
        let h = ((f64::from(oh) * scale).round() as u32).max(1);
        Placement {
            width: w,
            height: h,
            left: (i64::from(width) - i64::from(w)) / 2,
            top: (i64::from(height) - i64::from(h)) / 2,
        }
    }
}

impl FromStr for BrandFit {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "cover" => Ok(BrandFit::Cover),
            "fit" => Ok(BrandFit::Fit),
            other => Err(format!(
                "brand_fit must be \"cover\" or \"fit\", not {other:?}"
            )),
        }
    }
}

/// Where a scaled overlay lies on the result: its size and its top-left
/// corner (negative when it sticks out, as `cover` does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub width: u32,
    pub height: u32,
    pub left: i64,
    pub top: i64,
}

/// A place a result is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Surface {
    /// The booth's big screen (the display thumbnail).
    Display,
    /// The phone, the share page, the download, the gallery and the export.
    Share,
    /// The print station.
    Print,
}

impl Surface {
    pub const ALL: [Surface; 3] = [Surface::Display, Surface::Share, Surface::Print];

    pub fn as_str(self) -> &'static str {
        match self {
            Surface::Display => "display",
            Surface::Share => "share",
            Surface::Print => "print",
        }
    }
}

impl FromStr for Surface {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Surface::ALL
            .into_iter()
            .find(|s| s.as_str() == text)
            .ok_or_else(|| {
                format!("brand_applies_to takes \"display\", \"share\" and \"print\", not {text:?}")
            })
    }
}

/// The surfaces a brand applies to (stored as `display,share,print`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliesTo(BTreeSet<Surface>);

impl Default for AppliesTo {
    fn default() -> Self {
        AppliesTo(Surface::ALL.into_iter().collect())
    }
}

impl AppliesTo {
    /// From the API's list of names (duplicates are one).
    pub fn from_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<AppliesTo, String> {
        names
            .into_iter()
            .map(str::parse)
            .collect::<Result<BTreeSet<_>, _>>()
            .map(AppliesTo)
    }

    /// From the stored column (an unknown name is skipped).
    pub fn from_column(text: &str) -> AppliesTo {
        AppliesTo(
            text.split(',')
                .filter_map(|name| name.trim().parse().ok())
                .collect(),
        )
    }

    pub fn to_column(&self) -> String {
        self.names().join(",")
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.0.iter().map(|s| s.as_str()).collect()
    }

    pub fn contains(&self, surface: Surface) -> bool {
        self.0.contains(&surface)
    }
}

/// The caption as stored: trimmed, None when empty; refused past
/// [`MAX_CAPTION_CHARS`] or with a control character (a line break
/// among them: the caption is one line).
pub fn checked_caption(text: Option<&str>) -> Result<Option<String>, String> {
    let Some(text) = text.map(str::trim).filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    let chars = text.chars().count();
    if chars > MAX_CAPTION_CHARS {
        return Err(format!(
            "brand_caption is {chars} characters; it may be at most {MAX_CAPTION_CHARS}"
        ));
    }
    if text.chars().any(char::is_control) {
        return Err("brand_caption must be one line, with no control characters".into());
    }
    Ok(Some(text.to_owned()))
}

/// The key of the branded rendition of the result kept at `key`
/// (`r/<stem>.b.jpg`).
pub fn branded_key(key: &str) -> String {
    format!("{}.b.jpg", stem_of(key))
}

/// The key of the display-size branded rendition (`r/<stem>.bt.jpg`).
pub fn branded_thumbnail_key(key: &str) -> String {
    format!("{}.bt.jpg", stem_of(key))
}

fn stem_of(key: &str) -> &str {
    key.split_once('.').map_or(key, |(stem, _)| stem)
}

/// The media store's key of an experience's brand file (`overlay` or
/// `logo`): one per experience and part, replaced in place.
pub fn brand_file_key(experience_id: &str, part: BrandPart) -> String {
    format!("b/{experience_id}/{}.png", part.as_str())
}

/// The image parts of a brand an operator uploads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrandPart {
    /// The frame, covering (or fitted to) the whole result.
    Overlay,
    /// A logo in the bottom-right corner.
    Logo,
}

impl BrandPart {
    pub fn as_str(self) -> &'static str {
        match self {
            BrandPart::Overlay => "overlay",
            BrandPart::Logo => "logo",
        }
    }
}

impl FromStr for BrandPart {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "overlay" => Ok(BrandPart::Overlay),
            "logo" => Ok(BrandPart::Logo),
            other => Err(format!(
                "a brand has an \"overlay\" and a \"logo\", not {other:?}"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cover_fills_the_result_and_fit_stays_inside_it() {
        let cover = BrandFit::Cover.placement((1000, 500), (100, 100));
        assert_eq!(
            (cover.width, cover.height, cover.left, cover.top),
            (1000, 1000, 0, -250)
        );
        let fit = BrandFit::Fit.placement((1000, 500), (100, 100));
        assert_eq!(
            (fit.width, fit.height, fit.left, fit.top),
            (500, 500, 250, 0)
        );
        let same = BrandFit::Cover.placement((640, 480), (1280, 960));
        assert_eq!(
            (same.width, same.height, same.left, same.top),
            (640, 480, 0, 0)
        );
    }

    #[test]
    fn applies_to_reads_names_and_refuses_others() {
        let some = AppliesTo::from_names(["print", "display", "print"]).unwrap();
        assert_eq!(some.to_column(), "display,print");
        assert!(!some.contains(Surface::Share));
        assert_eq!(AppliesTo::from_column(&some.to_column()), some);
        assert_eq!(AppliesTo::default().names(), ["display", "share", "print"]);
        assert!(AppliesTo::from_names(["screen"])
            .unwrap_err()
            .contains("screen"));
    }

    #[test]
    fn a_caption_is_one_line_of_at_most_80_characters() {
        assert_eq!(checked_caption(Some("  ")).unwrap(), None);
        assert_eq!(
            checked_caption(Some(" 서울 2026 #stagehand "))
                .unwrap()
                .as_deref(),
            Some("서울 2026 #stagehand")
        );
        assert!(checked_caption(Some(&"가".repeat(80))).is_ok());
        assert!(checked_caption(Some(&"가".repeat(81)))
            .unwrap_err()
            .contains("81"));
        assert!(checked_caption(Some("a\nb")).is_err());
    }

    #[test]
    fn branded_keys_come_from_the_original_key() {
        let key = "r/0123456789abcdef0123456789abcdef.png";
        assert_eq!(branded_key(key), "r/0123456789abcdef0123456789abcdef.b.jpg");
        assert_eq!(
            branded_thumbnail_key(key),
            "r/0123456789abcdef0123456789abcdef.bt.jpg"
        );
        assert_eq!(brand_file_key("e1", BrandPart::Logo), "b/e1/logo.png");
    }
}
