//! The event's brand, drawn: the overlay (a PNG with alpha, scaled to
//! cover or fit the result and centred), a logo in the top-right corner,
//! and the caption on a band along the foot, in the font the repository
//! ships (`assets/fonts`, NanumSquare Bold: Hangul and Latin, SIL OFL).
//!
//! - [`check_upload`] decides whether an uploaded overlay or logo is
//!   taken (a PNG, within [`BRAND_LIMITS`]), before anything is stored.
//! - [`BrandArt`] is one experience's brand, decoded once; it keeps the
//!   overlay scaled to the last result size it drew on, so a run of
//!   results of one size scales it once.
//! - [`brand_result`] makes the branded rendition of a kept result (at
//!   the original's size) and its display-size copy.
//! - [`BrandBook`] holds each experience's brand in memory by its
//!   `brand_version`: the keep reads a brand again only when an operator
//!   changed it, so an unbranded experience costs its sagas nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use ab_glyph::{Font, FontRef, PxScale, ScaleFont};
use bytes::Bytes;
use image::imageops::FilterType;
use image::{Rgb, RgbImage, RgbaImage};

use super::photo::{
    decode_rgb, decode_rgba, jpeg_of, shrunk, sniff, Normalized, PhotoError, PhotoFormat,
    PhotoLimits,
};
use super::pool::{Memory, PhotoPool};
use super::MediaStore;
use crate::domain::brand::{AppliesTo, BrandFit};
use crate::store::entities::experiences;

/// The font captions are drawn in.
static FONT_BYTES: &[u8] = include_bytes!("../../assets/fonts/NanumSquareB.ttf");

/// How large an overlay or logo may be: 25 megapixels, 8,192 a side.
pub const BRAND_LIMITS: PhotoLimits = PhotoLimits {
    max_pixels: 25_000_000,
    max_side: 8_192,
    max_alloc_bytes: 256 * 1024 * 1024,
};

/// The most bytes an uploaded overlay or logo may have.
pub const MAX_BRAND_FILE_BYTES: usize = 20 * 1024 * 1024;

/// JPEG quality of a branded rendition (it is printed).
const BRANDED_QUALITY: u8 = 90;
/// JPEG quality of its display-size copy.
const BRANDED_THUMBNAIL_QUALITY: u8 = 80;

/// Why an uploaded overlay or logo is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BrandUploadError {
    #[error(
        "the {0} must be a PNG image (with alpha for what shows through); this file is not one"
    )]
    NotPng(&'static str),
    #[error("the {part} is {width} × {height} pixels; at most {} pixels and {} a side are taken", BRAND_LIMITS.max_pixels, BRAND_LIMITS.max_side)]
    TooManyPixels {
        part: &'static str,
        width: u32,
        height: u32,
    },
    #[error("the {part} could not be read as a PNG: {detail}")]
    Unreadable { part: &'static str, detail: String },
}

/// The overlay or logo's size, once it is known to be a PNG within
/// [`BRAND_LIMITS`] that decodes whole (`part` names it in the errors).
pub fn check_upload(
    bytes: &[u8],
    part: &'static str,
    memory: &Memory,
) -> Result<(u32, u32), BrandUploadError> {
    if sniff(bytes) != Some(PhotoFormat::Png) {
        return Err(BrandUploadError::NotPng(part));
    }
    match decode_rgba(bytes, &BRAND_LIMITS, memory) {
        Ok(decoded) => Ok(decoded.image.dimensions()),
        Err(PhotoError::TooLarge { width, height, .. }) => Err(BrandUploadError::TooManyPixels {
            part,
            width,
            height,
        }),
        Err(e) => Err(BrandUploadError::Unreadable {
            part,
            detail: e.to_string(),
        }),
    }
}

/// One experience's brand, decoded.
pub struct BrandArt {
    overlay: Option<RgbaImage>,
    logo: Option<RgbaImage>,
    fit: BrandFit,
    caption: Option<String>,
    applies_to: AppliesTo,
    /// The overlay and logo at the last result size drawn on.
    scaled: Mutex<Option<Arc<Scaled>>>,
}

/// The overlay and the logo scaled for one result size, each with its
/// top-left corner on the result.
struct Scaled {
    result_size: (u32, u32),
    overlay: Option<Placed>,
    logo: Option<Placed>,
}

struct Placed {
    left: i64,
    top: i64,
    pixels: RgbaImage,
}

/// What a brand is made of, as stored: the files' bytes and the settings.
pub struct BrandParts {
    pub overlay: Option<Bytes>,
    pub logo: Option<Bytes>,
    pub fit: BrandFit,
    pub caption: Option<String>,
    pub applies_to: AppliesTo,
}

impl BrandArt {
    /// Decodes the parts (None: the brand draws nothing).
    pub fn decode(parts: BrandParts, memory: &Memory) -> Result<Option<BrandArt>, PhotoError> {
        let image = |bytes: Option<Bytes>| {
            bytes
                .map(|b| decode_rgba(&b, &BRAND_LIMITS, memory).map(|d| d.image))
                .transpose()
        };
        let art = BrandArt {
            overlay: image(parts.overlay)?,
            logo: image(parts.logo)?,
            fit: parts.fit,
            caption: parts.caption,
            applies_to: parts.applies_to,
            scaled: Mutex::new(None),
        };
        let draws = art.overlay.is_some() || art.logo.is_some() || art.caption.is_some();
        Ok(draws.then_some(art))
    }

    pub fn applies_to(&self) -> &AppliesTo {
        &self.applies_to
    }

    /// Draws the brand on `rgb`: the overlay, the logo, then the caption.
    pub fn draw(&self, rgb: &mut RgbImage) {
        let scaled = self.scaled(rgb.dimensions());
        for placed in [&scaled.overlay, &scaled.logo].into_iter().flatten() {
            blend(rgb, &placed.pixels, placed.left, placed.top);
        }
        if let Some(caption) = &self.caption {
            draw_caption(rgb, caption);
        }
    }

    /// The overlay and logo scaled for a result of `size`: made once per
    /// size, kept for the results of the same size that follow.
    fn scaled(&self, size: (u32, u32)) -> Arc<Scaled> {
        let mut held = self.scaled.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(scaled) = held.as_ref().filter(|s| s.result_size == size) {
            return scaled.clone();
        }
        let scaled = Arc::new(Scaled {
            result_size: size,
            overlay: self
                .overlay
                .as_ref()
                .map(|o| place_overlay(o, self.fit, size)),
            logo: self.logo.as_ref().map(|l| place_logo(l, size)),
        });
        *held = Some(scaled.clone());
        scaled
    }
}

/// A result's branded rendition, at the original's size, and its
/// display-size copy (long side `thumbnail_px`).
pub struct Branded {
    pub full: Normalized,
    pub thumbnail: Normalized,
}

/// Draws `art` on the result image `bytes` (decoded upright).
pub fn brand_result(
    bytes: &[u8],
    art: &BrandArt,
    thumbnail_px: u32,
    limits: &PhotoLimits,
    memory: &Memory,
) -> Result<Branded, PhotoError> {
    let mut decoded = decode_rgb(bytes, limits, memory)?;
    art.draw(&mut decoded.image);
    let full = jpeg_of(&decoded.image, BRANDED_QUALITY)?;
    let small = shrunk(decoded.image, thumbnail_px);
    let thumbnail = jpeg_of(&small, BRANDED_THUMBNAIL_QUALITY)?;
    Ok(Branded { full, thumbnail })
}

/// A sample to preview a brand on: a square of soft colour bands, as a
/// result might be.
pub fn sample_result(side: u32) -> RgbImage {
    RgbImage::from_fn(side, side, |x, y| {
        let (fx, fy) = (x as f32 / side as f32, y as f32 / side as f32);
        Rgb([
            (90.0 + 120.0 * fx) as u8,
            (120.0 + 80.0 * fy) as u8,
            (170.0 - 60.0 * fx * fy) as u8,
        ])
    })
}

/// `over` laid on `rgb` with its top-left corner at (`left`, `top`), by
/// its alpha; what lies outside `rgb` is cut.
fn blend(rgb: &mut RgbImage, over: &RgbaImage, left: i64, top: i64) {
    let (width, height) = (i64::from(rgb.width()), i64::from(rgb.height()));
    let x0 = left.max(0);
    let x1 = (left + i64::from(over.width())).min(width);
    let y0 = top.max(0);
    let y1 = (top + i64::from(over.height())).min(height);
    for y in y0..y1 {
        for x in x0..x1 {
            let [r, g, b, a] = over.get_pixel((x - left) as u32, (y - top) as u32).0;
            if a == 0 {
                continue;
            }
            let dst = rgb.get_pixel_mut(x as u32, y as u32);
            dst.0 = mix(dst.0, [r, g, b], u32::from(a));
        }
    }
}

/// `src` over `dst` at coverage `alpha` (0 to 255), rounded.
fn mix(dst: [u8; 3], src: [u8; 3], alpha: u32) -> [u8; 3] {
    let one =
        |d: u8, s: u8| ((u32::from(s) * alpha + u32::from(d) * (255 - alpha) + 127) / 255) as u8;
    [
        one(dst[0], src[0]),
        one(dst[1], src[1]),
        one(dst[2], src[2]),
    ]
}

/// The overlay scaled and centred as `fit` says.
fn place_overlay(overlay: &RgbaImage, fit: BrandFit, size: (u32, u32)) -> Placed {
    let placement = fit.placement(size, overlay.dimensions());
    Placed {
        left: placement.left,
        top: placement.top,
        pixels: image::imageops::resize(
            overlay,
            placement.width,
            placement.height,
            FilterType::Triangle,
        ),
    }
}

/// The logo in the top-right corner: 18% of the result's width, a margin
/// of 3% of its short side.
fn place_logo(logo: &RgbaImage, (width, height): (u32, u32)) -> Placed {
    let target_w = (width as f32 * 0.18).round().max(1.0) as u32;
    let target_h = ((logo.height() as f32 * target_w as f32 / logo.width().max(1) as f32).round()
        as u32)
        .clamp(1, height);
    let margin = i64::from((width.min(height) as f32 * 0.03).round() as u32);
    Placed {
        left: i64::from(width) - i64::from(target_w) - margin,
        top: margin,
        pixels: image::imageops::resize(logo, target_w, target_h, FilterType::Triangle),
    }
}

/// The font, parsed once.
fn font() -> &'static FontRef<'static> {
    static FONT: OnceLock<FontRef<'static>> = OnceLock::new();
    FONT.get_or_init(|| FontRef::try_from_slice(FONT_BYTES).expect("the shipped font parses"))
}

/// The caption, white, centred on a dark band along the foot: its size is
/// 5% of the result's height, smaller when the line would pass 90% of the
/// width.
fn draw_caption(rgb: &mut RgbImage, caption: &str) {
    let (width, height) = rgb.dimensions();
    let mut px = (height as f32 * 0.05).max(8.0);
    let mut line = line_width(caption, px);
    let room = width as f32 * 0.9;
    if line > room {
        px *= room / line;
        line = line_width(caption, px);
    }
    let band = ((px * 1.8).ceil() as u32).min(height);
    darken_band(rgb, height - band, height);
    let scaled = font().as_scaled(PxScale::from(px));
    let baseline =
        (height - band) as f32 + (band as f32 + scaled.ascent() + scaled.descent()) / 2.0;
    let mut x = (width as f32 - line) / 2.0;
    let mut previous = None;
    for c in caption.chars() {
        let id = scaled.glyph_id(c);
        if let Some(p) = previous {
            x += scaled.kern(p, id);
        }
        let glyph = id.with_scale_and_position(px, ab_glyph::point(x, baseline));
        x += scaled.h_advance(id);
        previous = Some(id);
        let Some(outline) = font().outline_glyph(glyph) else {
            continue;
        };
        let bounds = outline.px_bounds();
        outline.draw(|gx, gy, coverage| {
            let (px_x, px_y) = (
                bounds.min.x as i64 + i64::from(gx),
                bounds.min.y as i64 + i64::from(gy),
            );
            if px_x < 0 || px_y < 0 || px_x >= i64::from(width) || px_y >= i64::from(height) {
                return;
            }
            let dst = rgb.get_pixel_mut(px_x as u32, px_y as u32);
            let alpha = (coverage.clamp(0.0, 1.0) * 255.0).round() as u32;
            dst.0 = mix(dst.0, [255, 255, 255], alpha);
        });
    }
}

/// The width of `text` in the caption's font at `px`.
fn line_width(text: &str, px: f32) -> f32 {
    let scaled = font().as_scaled(PxScale::from(px));
    let mut width = 0.0;
    let mut previous = None;
    for c in text.chars() {
        let id = scaled.glyph_id(c);
        if let Some(p) = previous {
            width += scaled.kern(p, id);
        }
        width += scaled.h_advance(id);
        previous = Some(id);
    }
    width
}

/// Rows `from..to` at 55% brightness: the caption's band.
fn darken_band(rgb: &mut RgbImage, from: u32, to: u32) {
    for y in from..to {
        for x in 0..rgb.width() {
            let dst = rgb.get_pixel_mut(x, y);
            dst.0 = dst.0.map(|c| ((u32::from(c) * 55 + 50) / 100) as u8);
        }
    }
}

/// Each experience's brand in memory, by the `brand_version` it was read
/// at (None: the brand draws nothing). Bounded by the experiences there
/// are; a stale entry is replaced, never kept beside the new.
#[derive(Default)]
pub struct BrandBook {
    brands: Mutex<HashMap<String, ReadAt>>,
}

/// A brand and the `brand_version` it was read at.
type ReadAt = (i64, Option<Arc<BrandArt>>);

impl BrandBook {
    /// The brand of `experience_id` if it was read at `version` or later.
    pub fn get(&self, experience_id: &str, version: i64) -> Option<Option<Arc<BrandArt>>> {
        let brands = self.brands.lock().unwrap_or_else(|e| e.into_inner());
        brands
            .get(experience_id)
            .filter(|(v, _)| *v >= version)
            .map(|(_, art)| art.clone())
    }

    /// Keeps the brand read at `version` (an older one never replaces a
    /// newer: two keeps may read it at once).
    pub fn put(&self, experience_id: &str, version: i64, art: Option<Arc<BrandArt>>) {
        let mut brands = self.brands.lock().unwrap_or_else(|e| e.into_inner());
        let newer = brands
            .get(experience_id)
            .is_some_and(|(held, _)| *held > version);
        if !newer {
            brands.insert(experience_id.to_owned(), (version, art));
        }
    }
}

/// Reads `experience`'s brand: its files from the media store, decoded
/// on the photo pool (None: it draws nothing). The error says why it
/// cannot be read now.
pub async fn read_brand(
    experience: &experiences::Model,
    media: &MediaStore,
    pool: &PhotoPool,
) -> Result<Option<Arc<BrandArt>>, String> {
    let file = |key: Option<String>| async move {
        match key {
            Some(key) => media
                .get(&key)
                .await
                .map(Some)
                .map_err(|e| format!("the brand file {key} cannot be read: {e}")),
            None => Ok(None),
        }
    };
    let parts = BrandParts {
        overlay: file(experience.brand_overlay_key.clone()).await?,
        logo: file(experience.brand_logo_key.clone()).await?,
        fit: experience.brand_fit.parse().unwrap_or_default(),
        caption: experience.brand_caption.clone(),
        applies_to: AppliesTo::from_column(&experience.brand_applies_to),
    };
    pool.run_keep(move |memory| BrandArt::decode(parts, memory))
        .await
        .map_err(|full| full.to_string())?
        .map(|art| art.map(Arc::new))
        .map_err(|e| format!("the brand cannot be decoded: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::Rgba;

    fn png(image: &RgbaImage) -> Bytes {
        let mut out = std::io::Cursor::new(Vec::new());
        image.write_to(&mut out, image::ImageFormat::Png).unwrap();
        Bytes::from(out.into_inner())
    }

    fn art(overlay: RgbaImage, fit: BrandFit, caption: Option<&str>) -> BrandArt {
        BrandArt::decode(
            BrandParts {
                overlay: Some(png(&overlay)),
                logo: None,
                fit,
                caption: caption.map(str::to_owned),
                applies_to: AppliesTo::default(),
            },
            &Memory::unbounded(),
        )
        .unwrap()
        .expect("a brand that draws")
    }

    /// A frame: an opaque red border of a tenth of each side, clear inside.
    fn frame(side: u32) -> RgbaImage {
        let edge = side / 10;
        RgbaImage::from_fn(side, side, |x, y| {
            let border = x < edge || y < edge || x >= side - edge || y >= side - edge;
            if border {
                Rgba([255, 0, 0, 255])
            } else {
                Rgba([0, 0, 0, 0])
            }
        })
    }

    #[test]
    fn a_covering_frame_lies_on_the_edges_and_leaves_the_middle() {
        let mut rgb = RgbImage::from_pixel(400, 400, Rgb([0, 0, 255]));
        art(frame(100), BrandFit::Cover, None).draw(&mut rgb);
        assert_eq!(rgb.get_pixel(5, 5).0, [255, 0, 0]);
        assert_eq!(rgb.get_pixel(395, 200).0, [255, 0, 0]);
        assert_eq!(rgb.get_pixel(200, 200).0, [0, 0, 255]);
    }

    #[test]
    fn a_fitted_frame_on_a_wide_result_leaves_the_sides_untouched() {
        let mut rgb = RgbImage::from_pixel(800, 400, Rgb([0, 0, 255]));
        art(frame(100), BrandFit::Fit, None).draw(&mut rgb);
        // Fitted: 400 × 400 centred, from x = 200 to 600.
        assert_eq!(rgb.get_pixel(10, 200).0, [0, 0, 255]);
        assert_eq!(rgb.get_pixel(205, 200).0, [255, 0, 0]);
        assert_eq!(rgb.get_pixel(400, 200).0, [0, 0, 255]);
    }

    #[test]
    fn a_caption_in_hangul_and_latin_draws_white_on_a_dark_band() {
        let clear = RgbaImage::from_pixel(10, 10, Rgba([0, 0, 0, 0]));
        let mut rgb = RgbImage::from_pixel(600, 600, Rgb([200, 200, 200]));
        art(clear, BrandFit::Cover, Some("서울 2026 #Stagehand")).draw(&mut rgb);
        let band: Vec<&Rgb<u8>> = (560..600)
            .flat_map(|y| (0..600).map(move |x| (x, y)))
            .map(|(x, y)| rgb.get_pixel(x, y))
            .collect();
        assert!(
            band.iter().any(|p| p.0 == [110, 110, 110]),
            "the band darkens"
        );
        assert!(
            band.iter().filter(|p| p.0[0] > 240).count() > 200,
            "the letters are drawn"
        );
        assert_eq!(rgb.get_pixel(300, 100).0, [200, 200, 200]);
    }

    #[test]
    fn the_logo_sits_in_the_top_right_corner_on_every_result_of_a_size() {
        let art = BrandArt::decode(
            BrandParts {
                overlay: None,
                logo: Some(png(&RgbaImage::from_pixel(40, 20, Rgba([0, 200, 0, 255])))),
                fit: BrandFit::Cover,
                caption: None,
                applies_to: AppliesTo::default(),
            },
            &Memory::unbounded(),
        )
        .unwrap()
        .expect("a brand that draws");
        for _ in 0..2 {
            let mut rgb = RgbImage::from_pixel(1000, 500, Rgb([0, 0, 255]));
            art.draw(&mut rgb);
            // 180 × 90 at a margin of 15: x 805..985, y 15..105.
            assert_eq!(rgb.get_pixel(900, 60).0, [0, 200, 0]);
            assert_eq!(rgb.get_pixel(990, 60).0, [0, 0, 255]);
            assert_eq!(rgb.get_pixel(100, 60).0, [0, 0, 255]);
            assert_eq!(rgb.get_pixel(900, 200).0, [0, 0, 255]);
        }
    }

    #[test]
    fn an_upload_must_be_a_png_within_the_limits() {
        let memory = Memory::unbounded();
        assert_eq!(
            check_upload(&png(&frame(20)), "overlay", &memory),
            Ok((20, 20))
        );
        assert_eq!(
            check_upload(b"GIF89a....", "overlay", &memory),
            Err(BrandUploadError::NotPng("overlay"))
        );
        let mut cut = png(&frame(64)).to_vec();
        cut.truncate(cut.len() / 2);
        assert!(matches!(
            check_upload(&cut, "logo", &memory),
            Err(BrandUploadError::Unreadable { .. })
        ));
    }

    #[test]
    fn the_book_keeps_the_newest_version() {
        let book = BrandBook::default();
        book.put("e", 2, None);
        book.put(
            "e",
            1,
            Some(Arc::new(art(frame(10), BrandFit::Cover, None))),
        );
        assert!(matches!(book.get("e", 2), Some(None)));
        assert!(
            matches!(book.get("e", 1), Some(None)),
            "a newer brand serves an older ask"
        );
        assert!(book.get("e", 3).is_none());
    }
}
