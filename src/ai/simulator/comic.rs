//! The simulator's photo transform: a participant's photo (JPEG, PNG or
//! WebP bytes) turned into a comic-looking PNG, as a real image-to-image
//! provider would answer a job with `params.input_url`. Pure code: bytes in,
//! bytes out, no I/O; the simulator fetches the photo and runs this off its
//! actix workers.
//!
//! The look: the photo upright (its EXIF orientation applied), at most
//! [`MAX_SIDE`] pixels on its long side, each channel posterized to
//! [`LEVELS`] levels, and black outlines where the colour changes sharply
//! (a Sobel gradient over [`EDGE_THRESHOLD`]).
//!
//! Decoding is bounded ([`decode_limits`]): a small file that claims a huge
//! picture (a decompression bomb) is refused before any pixel is allocated.

use std::io::Cursor;

use image::imageops::FilterType;
use image::{DynamicImage, GrayImage, ImageDecoder, ImageFormat, ImageReader, Limits, RgbImage};

/// Longest side of the comic, in pixels (larger photos are scaled down,
/// smaller ones kept as they are).
pub const MAX_SIDE: u32 = 1024;
/// Levels each colour channel is cut to.
pub const LEVELS: u8 = 5;
/// Sobel gradient magnitude (|gx| + |gy| of one channel, 0..=2040) from
/// which a pixel is drawn as outline.
const EDGE_THRESHOLD: u32 = 160;
/// The outlines' colour.
const INK: [u8; 3] = [16, 16, 16];
/// Widest and tallest photo decoded (a 48 MP phone photo is 8000 px wide).
const MAX_INPUT_SIDE: u32 = 12_000;
/// Most pixels decoded (about a 64 MP photo).
const MAX_INPUT_PIXELS: u64 = 64_000_000;
/// Most memory the decoder may take (a 64 MP RGB picture is 192 MiB).
const MAX_DECODE_BYTES: u64 = 256 * 1024 * 1024;

/// The comic PNG of `photo`, or why there is none (not an image, a format
/// other than JPEG, PNG or WebP, too large, or corrupt).
pub fn comic(photo: &[u8]) -> Result<Vec<u8>, String> {
    let upright = decode(photo)?;
    let small = downscale(upright).to_rgb8();
    let edges = edge_strength(&small);
    let mut drawn = small;
    for (x, y, pixel) in drawn.enumerate_pixels_mut() {
        pixel.0 = if edges.get_pixel(x, y).0[0] > 0 {
            INK
        } else {
            pixel.0.map(posterize)
        };
    }
    encode_png(DynamicImage::ImageRgb8(drawn))
}

/// The limits every decode runs under: sides, pixels and memory bounded.
pub fn decode_limits() -> Limits {
    // `Limits` is non-exhaustive: its fields are set one by one.
    let mut limits = Limits::default();
    limits.max_image_width = Some(MAX_INPUT_SIDE);
    limits.max_image_height = Some(MAX_INPUT_SIDE);
    limits.max_alloc = Some(MAX_DECODE_BYTES);
    limits
}

/// Decodes `photo` under [`decode_limits`] and turns it upright.
fn decode(photo: &[u8]) -> Result<DynamicImage, String> {
    let mut reader = ImageReader::new(Cursor::new(photo))
        .with_guessed_format()
        .map_err(|e| format!("unreadable photo: {e}"))?;
    match reader.format() {
        Some(ImageFormat::Jpeg | ImageFormat::Png | ImageFormat::WebP) => {}
        Some(other) => return Err(format!("unsupported photo format {other:?}")),
        None => return Err("not an image (no JPEG, PNG or WebP signature)".to_owned()),
    }
    reader.limits(decode_limits());
    let mut decoder = reader
        .into_decoder()
        .map_err(|e| format!("undecodable photo: {e}"))?;
    let (width, height) = decoder.dimensions();
    if u64::from(width) * u64::from(height) > MAX_INPUT_PIXELS {
        return Err(format!("photo too large: {width}x{height} pixels"));
    }
    // A broken EXIF block is no reason to refuse the photo: drawn as stored.
    let orientation = decoder
        .orientation()
        .unwrap_or(image::metadata::Orientation::NoTransforms);
    let mut image =
        DynamicImage::from_decoder(decoder).map_err(|e| format!("undecodable photo: {e}"))?;
    image.apply_orientation(orientation);
    Ok(image)
}

/// `image` with its long side at most [`MAX_SIDE`], proportions kept.
fn downscale(image: DynamicImage) -> DynamicImage {
    if image.width().max(image.height()) <= MAX_SIDE {
        return image;
    }
    image.resize(MAX_SIDE, MAX_SIDE, FilterType::Triangle)
}

/// A channel value cut to the nearest of [`LEVELS`] evenly spaced levels.
fn posterize(value: u8) -> u8 {
    let steps = u32::from(LEVELS - 1);
    let level = (u32::from(value) * steps + 127) / 255;
    u8::try_from((level * 255 + steps / 2) / steps).unwrap_or(u8::MAX)
}

/// 255 where the colour changes sharply, 0 elsewhere: the strongest
/// channel's Sobel gradient (3x3, |gx| + |gy|) reaches [`EDGE_THRESHOLD`].
/// Every channel counts, so the rim between two colours of the same
/// brightness is outlined too. The border pixels are never edges.
fn edge_strength(rgb: &RgbImage) -> GrayImage {
    let (width, height) = rgb.dimensions();
    let mut edges = GrayImage::new(width, height);
    for y in 1..height.saturating_sub(1) {
        for x in 1..width.saturating_sub(1) {
            let strongest = (0..3).map(|channel| sobel(rgb, x, y, channel)).max();
            if strongest.is_some_and(|gradient| gradient >= EDGE_THRESHOLD) {
                edges.put_pixel(x, y, image::Luma([255]));
            }
        }
    }
    edges
}

/// |gx| + |gy| of one channel at (`x`, `y`), which has all 8 neighbours.
fn sobel(rgb: &RgbImage, x: u32, y: u32, channel: usize) -> u32 {
    let at = |x: u32, y: u32| i32::from(rgb.get_pixel(x, y).0[channel]);
    let gx = (at(x + 1, y - 1) + 2 * at(x + 1, y) + at(x + 1, y + 1))
        - (at(x - 1, y - 1) + 2 * at(x - 1, y) + at(x - 1, y + 1));
    let gy = (at(x - 1, y + 1) + 2 * at(x, y + 1) + at(x + 1, y + 1))
        - (at(x - 1, y - 1) + 2 * at(x, y - 1) + at(x + 1, y - 1));
    gx.unsigned_abs() + gy.unsigned_abs()
}

fn encode_png(image: DynamicImage) -> Result<Vec<u8>, String> {
    let mut png = Cursor::new(Vec::new());
    image
        .write_to(&mut png, ImageFormat::Png)
        .map_err(|e| format!("PNG encoding failed: {e}"))?;
    Ok(png.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Taken by the camera turned a quarter: 1200x900 as stored, with EXIF
    /// Orientation 6, GPS, Make/Model and BodySerialNumber.
    const ROTATED_JPEG: &[u8] = include_bytes!("../../../tests/fixtures/photo-gps-rotated.jpg");
    /// 640x480, no metadata.
    const SMALL_PNG: &[u8] = include_bytes!("../../../tests/fixtures/photo-small.png");

    fn decoded(png: &[u8]) -> RgbImage {
        let image =
            image::load_from_memory_with_format(png, ImageFormat::Png).expect("the comic is a PNG");
        image.to_rgb8()
    }

    /// A photo-like picture made here: a gradient with a sharp disc.
    fn synthetic_jpeg(width: u32, height: u32) -> Vec<u8> {
        let picture = RgbImage::from_fn(width, height, |x, y| {
            let (dx, dy) = (x.abs_diff(width / 2), y.abs_diff(height / 2));
            if dx * dx + dy * dy < (height / 4).pow(2) {
                image::Rgb([230, 40, 40])
            } else {
                image::Rgb([(x * 255 / width) as u8, (y * 255 / height) as u8, 150])
            }
        });
        let mut jpeg = Cursor::new(Vec::new());
        DynamicImage::ImageRgb8(picture)
            .write_to(&mut jpeg, ImageFormat::Jpeg)
            .expect("JPEG encoding");
        jpeg.into_inner()
    }

    #[test]
    fn a_small_photo_keeps_its_size_and_gets_posterized_with_outlines() {
        let input = image::load_from_memory(SMALL_PNG)
            .expect("fixture")
            .to_rgb8();
        let output = decoded(&comic(SMALL_PNG).expect("a comic"));
        assert_eq!(output.dimensions(), (640, 480));
        let levels: Vec<u8> = (0..=255).map(posterize).collect();
        let mut ink = 0;
        let mut changed = 0;
        for (x, y, pixel) in output.enumerate_pixels() {
            if pixel.0 == INK {
                ink += 1;
            } else {
                assert!(pixel.0.iter().all(|c| levels.contains(c)), "{pixel:?}");
            }
            if pixel != input.get_pixel(x, y) {
                changed += 1;
            }
        }
        let total = 640 * 480;
        assert!(ink > total / 100 && ink < total / 3, "{ink} outline pixels");
        assert!(changed > total / 2, "{changed} pixels changed");
    }

    #[test]
    fn a_large_photo_is_scaled_down_to_the_long_side() {
        let output = decoded(&comic(&synthetic_jpeg(2000, 1000)).expect("a comic"));
        assert_eq!(output.dimensions(), (MAX_SIDE, MAX_SIDE / 2));
        // The disc (radius 250 px, 128 px once scaled) is posterized red
        // inside, and its sharp rim is outlined.
        let (centre_x, centre_y) = (MAX_SIDE / 2, MAX_SIDE / 4);
        assert_eq!(output.get_pixel(centre_x, centre_y).0, [255, 64, 64]);
        let rim = (centre_y - 136..centre_y - 120).any(|y| output.get_pixel(centre_x, y).0 == INK);
        assert!(rim, "no outline on the disc's rim");
    }

    #[test]
    fn exif_orientation_is_applied() {
        let output = decoded(&comic(ROTATED_JPEG).expect("a comic"));
        // 1200x900 stored, turned a quarter: 900x1200, scaled to 768x1024.
        assert_eq!(output.dimensions(), (768, 1024));
    }

    #[test]
    fn posterize_cuts_to_evenly_spaced_levels() {
        assert_eq!(posterize(0), 0);
        assert_eq!(posterize(255), 255);
        assert_eq!(posterize(60), 64);
        assert_eq!(posterize(140), 128);
        let mut seen: Vec<u8> = (0..=255).map(posterize).collect();
        seen.dedup();
        assert_eq!(seen, [0, 64, 128, 191, 255]);
    }

    #[test]
    fn what_is_not_a_photo_is_refused() {
        let error = comic(b"<html>not a photo</html>").expect_err("not an image");
        assert!(error.contains("not an image"), "{error}");
        let jpeg = synthetic_jpeg(64, 48);
        let error = comic(&jpeg[..jpeg.len() / 3]).expect_err("cut short");
        assert!(error.contains("undecodable"), "{error}");
        let gif = b"GIF89a\x01\x00\x01\x00\x00\x00\x00;";
        let error = comic(gif).expect_err("a GIF");
        assert!(error.contains("unsupported"), "{error}");
    }

    /// A JPEG whose header claims 60000x60000 pixels (14 GB of RGB) is
    /// refused from its header, before anything that size is allocated.
    #[test]
    fn a_decompression_bomb_is_refused_from_its_header() {
        let mut jpeg = synthetic_jpeg(64, 48);
        let sof = jpeg
            .windows(2)
            .position(|marker| marker == [0xFF, 0xC0])
            .expect("a baseline SOF0 marker");
        // SOF0: marker, length (2), precision (1), height (2), width (2).
        jpeg[sof + 5..sof + 9].copy_from_slice(&[0xEA, 0x60, 0xEA, 0x60]);
        let error = comic(&jpeg).expect_err("a bomb");
        assert!(
            error.contains("undecodable") || error.contains("too large"),
            "{error}"
        );
    }

    /// The fixture carries what tests of metadata stripping look for.
    #[test]
    fn the_rotated_fixture_carries_gps_camera_and_orientation() {
        let exif = exif::Reader::new()
            .read_from_container(&mut Cursor::new(ROTATED_JPEG))
            .expect("EXIF in the fixture");
        for tag in [
            exif::Tag::GPSLatitude,
            exif::Tag::GPSLongitude,
            exif::Tag::Make,
            exif::Tag::Model,
            exif::Tag::BodySerialNumber,
        ] {
            assert!(exif.get_field(tag, exif::In::PRIMARY).is_some(), "{tag}");
        }
        let orientation = exif
            .get_field(exif::Tag::Orientation, exif::In::PRIMARY)
            .and_then(|field| field.value.get_uint(0));
        assert_eq!(orientation, Some(6));
    }
}
