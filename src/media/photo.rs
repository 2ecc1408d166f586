//! The participant's uploaded photo, from untrusted bytes to a stored copy with no metadata.
//!
//! This module owns every step between the bytes a phone sends and the JPEG that
//! stagehand keeps or shows:
//!
//! 1. [`sniff`] the format by its magic numbers (never the Content-Type or the file
//!    name); [`is_heic`] lets the caller tell an iPhone's HEIC apart so it can say so.
//! 2. Read the dimensions, channels and bit depth from the header and refuse
//!    past [`PhotoLimits`] *before* decoding any pixel, so a tiny file that
//!    declares a huge image costs nothing. The memory bound is the pipeline's
//!    peak ([`peak_bytes`]): a 16-bit RGBA image takes 8 bytes a pixel
//!    decoded and 12 while it is converted, not the 3 of a JPEG. A JPEG must
//!    reach its end-of-image marker ([`super::jpeg::read`]).
//! 3. Reserve that peak in the photo pool's memory budget ([`Memory`]), then
//!    decode under `image::Limits` and read the EXIF orientation.
//! 4. A JPEG that is already upright and within the size asked is kept as sent
//!    with its metadata cut out ([`super::jpeg::strip_metadata`]): the same
//!    pixels, no second JPEG generation, a fraction of the CPU. Anything else is
//!    turned upright, flattened onto white where it has transparency,
//!    downscaled so the long side fits, and re-encoded as a baseline JPEG,
//!    which carries no EXIF, GPS, XMP or ICC data.
//!
//! [`normalize`] (the stored upload) and [`thumbnail`] (a display-size copy of a
//! result) are this one pipeline with different parameters.

use std::io::Cursor;

use image::metadata::Orientation;
use image::{
    ColorType, DynamicImage, ImageDecoder, ImageError, ImageFormat, ImageReader, Rgb, RgbImage,
};

use super::jpeg;
use super::pool::{Memory, MemoryHeld};

/// The content type of every image this module produces.
const JPEG_CONTENT_TYPE: &str = "image/jpeg";
/// JPEG quality of a normalized upload (kept, and sent on to the AI).
const NORMALIZE_QUALITY: u8 = 85;
/// JPEG quality of a thumbnail (shown only, so a little smaller).
const THUMBNAIL_QUALITY: u8 = 80;

/// An image format this module accepts, as told by the file's magic numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PhotoFormat {
    /// JPEG: starts with `FF D8 FF`.
    Jpeg,
    /// PNG: starts with `89 50 4E 47 0D 0A 1A 0A`.
    Png,
    /// WebP: `RIFF`, a 4-byte size, then `WEBP`.
    Webp,
}

impl PhotoFormat {
    /// The MIME type of this format, e.g. `image/png`.
    pub fn content_type(self) -> &'static str {
        match self {
            PhotoFormat::Jpeg => "image/jpeg",
            PhotoFormat::Png => "image/png",
            PhotoFormat::Webp => "image/webp",
        }
    }

    fn image_format(self) -> ImageFormat {
        match self {
            PhotoFormat::Jpeg => ImageFormat::Jpeg,
            PhotoFormat::Png => ImageFormat::Png,
            PhotoFormat::Webp => ImageFormat::WebP,
        }
    }
}

/// Tells the format of `bytes` from their magic numbers alone; `None` if it is
/// not JPEG, PNG or WebP. The Content-Type and file name a client sends are never
/// consulted: they are whatever the client says.
pub fn sniff(bytes: &[u8]) -> Option<PhotoFormat> {
    const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";
    if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some(PhotoFormat::Jpeg)
    } else if bytes.starts_with(PNG_SIGNATURE) {
        Some(PhotoFormat::Png)
    } else if bytes.starts_with(b"RIFF") && bytes.get(8..12) == Some(b"WEBP") {
        Some(PhotoFormat::Webp)
    } else {
        None
    }
}

/// True if `bytes` open with an ISO-BMFF `ftyp` box naming a HEIC/HEIF brand
/// (`heic`, `heix`, `mif1`, `heim`, `heis`, `hevc`, `hevx`), as an iPhone's photos
/// do. The caller uses it to answer "HEIC is not supported" rather than a bare 415.
///
/// The major brand may be any of those; among the compatible brands `mif1` alone
/// is not enough, since AVIF files list it too.
pub fn is_heic(bytes: &[u8]) -> bool {
    const HEIC_BRANDS: [&[u8]; 7] = [
        b"heic", b"heix", b"mif1", b"heim", b"heis", b"hevc", b"hevx",
    ];
    if bytes.get(4..8) != Some(b"ftyp") {
        return false;
    }
    let Some(major) = bytes.get(8..12) else {
        return false;
    };
    if HEIC_BRANDS.contains(&major) {
        return true;
    }
    ftyp_compatible_brands(bytes).any(|brand| brand != b"mif1" && HEIC_BRANDS.contains(&brand))
}

/// The compatible brands listed in the `ftyp` box at the start of `bytes`
/// (after size, type, major brand and minor version), bounded by the box size.
fn ftyp_compatible_brands(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    let declared = bytes
        .get(0..4)
        .and_then(|size| size.try_into().ok())
        .map_or(0, |size: [u8; 4]| u32::from_be_bytes(size) as usize);
    let end = declared.min(bytes.len());
    bytes.get(16..end).unwrap_or(&[]).chunks_exact(4)
}

/// The most an uploaded image may be before it is refused. Each bound is checked
/// against the image's header before any pixel is decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhotoLimits {
    /// The most pixels (width × height) an image may have.
    pub max_pixels: u64,
    /// The most pixels either side may have, however thin the image.
    pub max_side: u32,
    /// The most bytes the pipeline may hold at once for one image: its
    /// decoded buffer, its conversion and its output ([`peak_bytes`]).
    pub max_alloc_bytes: u64,
}

impl Default for PhotoLimits {
    /// 50 megapixels, 12,000 pixels a side, 512 MiB of decoder memory: room for
    /// any phone camera, far less than a decompression bomb asks for.
    fn default() -> Self {
        PhotoLimits {
            max_pixels: 50_000_000,
            max_side: 12_000,
            max_alloc_bytes: 512 * 1024 * 1024,
        }
    }
}

/// A re-encoded image: a baseline JPEG with no metadata, upright, no larger than asked.
#[derive(Clone, PartialEq, Eq)]
pub struct Normalized {
    /// The JPEG file.
    pub bytes: Vec<u8>,
    /// Its width in pixels, after orientation and downscaling.
    pub width: u32,
    /// Its height in pixels, after orientation and downscaling.
    pub height: u32,
    /// Always `image/jpeg`.
    pub content_type: &'static str,
}

impl std::fmt::Debug for Normalized {
    /// Shows the size of `bytes`, not the bytes, so logs and test failures stay readable.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Normalized")
            .field("bytes", &format_args!("<{} bytes>", self.bytes.len()))
            .field("width", &self.width)
            .field("height", &self.height)
            .field("content_type", &self.content_type)
            .finish()
    }
}

/// Why an upload was refused. Each message is plain English that a participant's
/// phone page can show or a JSON error can carry.
#[derive(Debug, thiserror::Error)]
pub enum PhotoError {
    /// Not JPEG, PNG or WebP; `heic` is true when it is an iPhone's HEIC/HEIF.
    #[error("{}", unsupported_message(.heic))]
    Unsupported {
        /// The file is HEIC/HEIF (see [`is_heic`]).
        heic: bool,
    },
    /// The header declares an image past [`PhotoLimits`]; `limit` names the bound with numbers.
    #[error("the photo is {width} × {height} pixels; {limit}")]
    TooLarge {
        /// Declared width in pixels.
        width: u32,
        /// Declared height in pixels.
        height: u32,
        /// The limit that was passed, in words and numbers.
        limit: String,
    },
    /// Truncated or damaged; carries what the decoder said.
    #[error("the photo could not be read ({0}); it may be damaged or cut short")]
    Corrupt(String),
}

fn unsupported_message(heic: &bool) -> &'static str {
    if *heic {
        "HEIC is not supported; send JPEG, PNG or WebP"
    } else {
        "this file is not a JPEG, PNG or WebP image; send JPEG, PNG or WebP"
    }
}

/// Turns an uploaded photo into the copy stagehand keeps: upright (EXIF
/// orientation applied), long side at most `max_px` (never upscaled), a JPEG
/// with no metadata at all (no EXIF, so no GPS). A JPEG already upright and
/// within `max_px` keeps its own scans; anything else is re-encoded at
/// quality 85 with transparency flattened onto white.
///
/// The header is checked against `limits` before anything is decoded, and
/// the decoding waits for its peak memory in `memory`.
pub fn normalize(
    bytes: &[u8],
    max_px: u32,
    limits: &PhotoLimits,
    memory: &Memory,
) -> Result<Normalized, PhotoError> {
    reencode(
        bytes,
        Target {
            max_px,
            quality: NORMALIZE_QUALITY,
        },
        limits,
        memory,
    )
}

/// Turns a result image (JPEG, PNG or WebP) into a display-size JPEG whose long
/// side is at most `max_px` (e.g. 640): the same pipeline as [`normalize`], at
/// a slightly lower JPEG quality since it is only shown.
pub fn thumbnail(
    bytes: &[u8],
    max_px: u32,
    limits: &PhotoLimits,
    memory: &Memory,
) -> Result<Normalized, PhotoError> {
    reencode(
        bytes,
        Target {
            max_px,
            quality: THUMBNAIL_QUALITY,
        },
        limits,
        memory,
    )
}

/// An image decoded upright (its EXIF orientation applied), with the
/// memory its decoding holds in the pool's budget.
pub struct Upright<P> {
    pub image: P,
    pub _memory: MemoryHeld,
}

/// Decodes a JPEG, PNG or WebP as 8-bit RGB, upright, transparency over
/// white: the pipeline's checks and memory bound, at full size.
pub fn decode_rgb(
    bytes: &[u8],
    limits: &PhotoLimits,
    memory: &Memory,
) -> Result<Upright<RgbImage>, PhotoError> {
    let (image, orientation, held) = decode_full(bytes, limits, memory)?;
    let mut upright = DynamicImage::ImageRgb8(flatten_onto_white(image));
    upright.apply_orientation(orientation);
    Ok(Upright {
        image: upright.into_rgb8(),
        _memory: held,
    })
}

/// Decodes a JPEG, PNG or WebP as 8-bit RGBA, upright, alpha kept (an
/// overlay or a logo).
pub fn decode_rgba(
    bytes: &[u8],
    limits: &PhotoLimits,
    memory: &Memory,
) -> Result<Upright<image::RgbaImage>, PhotoError> {
    let (mut image, orientation, held) = decode_full(bytes, limits, memory)?;
    image.apply_orientation(orientation);
    Ok(Upright {
        image: image.into_rgba8(),
        _memory: held,
    })
}

fn decode_full(
    bytes: &[u8],
    limits: &PhotoLimits,
    memory: &Memory,
) -> Result<(DynamicImage, Orientation, MemoryHeld), PhotoError> {
    let format = sniff(bytes).ok_or_else(|| PhotoError::Unsupported {
        heic: is_heic(bytes),
    })?;
    let target = Target {
        max_px: u32::MAX,
        quality: NORMALIZE_QUALITY,
    };
    let decoded = decode(bytes, format, target, limits, memory)?;
    Ok((decoded.image, decoded.orientation, decoded._memory))
}

/// `rgb` with its long side at most `max_px` (never upscaled): the
/// pipeline's own downscale.
pub fn shrunk(rgb: RgbImage, max_px: u32) -> RgbImage {
    downscale(rgb, max_px)
}

/// `rgb` as a JPEG at `quality`, with no metadata.
pub fn jpeg_of(rgb: &RgbImage, quality: u8) -> Result<Normalized, PhotoError> {
    encode_jpeg(rgb, quality)
}

/// What the pipeline makes: the longest side allowed and the JPEG quality.
#[derive(Debug, Clone, Copy)]
struct Target {
    max_px: u32,
    quality: u8,
}

/// The one pipeline: sniff, check the header, reserve the peak memory,
/// decode, then keep a JPEG as sent without its metadata, or flatten,
/// downscale, orient and encode. The memory is held until the end.
fn reencode(
    bytes: &[u8],
    target: Target,
    limits: &PhotoLimits,
    memory: &Memory,
) -> Result<Normalized, PhotoError> {
    let format = sniff(bytes).ok_or_else(|| PhotoError::Unsupported {
        heic: is_heic(bytes),
    })?;
    let Decoded {
        image,
        orientation,
        jpeg,
        _memory,
    } = decode(bytes, format, target, limits, memory)?;
    if let Some(kept) = as_sent_without_metadata(bytes, jpeg, &image, orientation, target.max_px)? {
        return Ok(kept);
    }
    let rgb = flatten_onto_white(image);
    let mut upright = DynamicImage::ImageRgb8(downscale(rgb, target.max_px));
    upright.apply_orientation(orientation);
    encode_jpeg(&upright.into_rgb8(), target.quality)
}

/// A file decoded: its pixels as stored, the EXIF orientation still to
/// apply, and for a JPEG its marker structure.
struct Decoded {
    image: DynamicImage,
    orientation: Orientation,
    jpeg: Option<jpeg::Structure>,
    /// The pipeline's peak memory, reserved in the pool's budget.
    _memory: MemoryHeld,
}

/// Decodes `bytes` as `format` once its header has passed `limits` (and a
/// JPEG's structure reaches its end marker: decoders pad a scan that is cut
/// short with grey instead of failing) and the pipeline's peak memory is
/// reserved in `memory`.
fn decode(
    bytes: &[u8],
    format: PhotoFormat,
    target: Target,
    limits: &PhotoLimits,
    memory: &Memory,
) -> Result<Decoded, PhotoError> {
    let mut decoder = open_decoder(bytes, format, limits)?;
    let (width, height) = decoder.dimensions();
    let peak = peak_bytes(width, height, decoder.color_type(), target.max_px);
    check_header(width, height, peak, limits)?;
    let held = memory.reserve(peak).map_err(|over| PhotoError::TooLarge {
        width,
        height,
        limit: over.to_string(),
    })?;
    let jpeg = match format {
        PhotoFormat::Jpeg => Some(jpeg::read(bytes).map_err(unreadable)?),
        PhotoFormat::Png | PhotoFormat::Webp => None,
    };
    let too_large = |err| decode_failure(err, width, height, limits);
    decoder
        .set_limits(image_limits(limits))
        .map_err(too_large)?;
    // A damaged EXIF block should not cost the participant their photo.
    let orientation = decoder.orientation().unwrap_or(Orientation::NoTransforms);
    let image = DynamicImage::from_decoder(decoder).map_err(too_large)?;
    Ok(Decoded {
        image,
        orientation,
        jpeg,
        _memory: held,
    })
}

/// The most memory the pipeline holds at once for a `width` × `height`
/// image whose decoder yields `color`, made at most `max_px` on its long
/// side: the decoded buffer at its own depth while it is converted to
/// 8-bit RGB (through RGBA when it has alpha: [`flatten_onto_white`]),
/// then the RGB copy while it is downscaled and turned (a copy of the
/// output each). A 16-bit RGBA image of 50 MP takes 400 MB decoded and
/// 600 MB at its peak; an 8-bit RGB one 150 MB and 150 MB.
pub fn peak_bytes(width: u32, height: u32, color: ColorType, max_px: u32) -> u64 {
    let pixels = u64::from(width) * u64::from(height);
    let decoded = pixels * u64::from(color.bytes_per_pixel());
    let converted = if color.has_alpha() {
        // Into RGBA (a copy unless it is RGBA already), then RGB beside it.
        let rgba = if color == ColorType::Rgba8 {
            0
        } else {
            4 * pixels
        };
        (decoded + rgba).max(7 * pixels)
    } else {
        let rgb = if color == ColorType::Rgb8 {
            0
        } else {
            3 * pixels
        };
        decoded + rgb
    };
    let (out_w, out_h) = fit_within(width, height, max_px);
    let output = 3 * u64::from(out_w) * u64::from(out_h);
    // The shrunk copy (when it shrinks) and the turned one.
    let copies = if output < 3 * pixels { 2 } else { 1 };
    converted.max(3 * pixels + copies * output)
}

/// A JPEG structure that is not whole, as the participant's error.
fn unreadable(err: jpeg::JpegError) -> PhotoError {
    PhotoError::Corrupt(err.to_string())
}

/// The upload itself with its metadata cut out, when the pipeline would
/// change nothing else: a JPEG (`jpeg` is its structure) that is upright,
/// within `max_px`, and grey or YCbCr (a CMYK one is converted). Re-encoding
/// a 1.5 MP photo takes about 11 ms and loses a JPEG generation; cutting
/// the metadata takes a fraction of a millisecond and keeps every pixel.
fn as_sent_without_metadata(
    bytes: &[u8],
    jpeg: Option<jpeg::Structure>,
    image: &DynamicImage,
    orientation: Orientation,
    max_px: u32,
) -> Result<Option<Normalized>, PhotoError> {
    let (width, height) = (image.width(), image.height());
    let unchanged = orientation == Orientation::NoTransforms && width.max(height) <= max_px;
    let colours = jpeg.and_then(|structure| structure.components);
    if !unchanged || !matches!(colours, Some(1 | 3)) {
        return Ok(None);
    }
    Ok(Some(Normalized {
        bytes: jpeg::strip_metadata(bytes).map_err(unreadable)?,
        width,
        height,
        content_type: JPEG_CONTENT_TYPE,
    }))
}

/// Reads only the header: the decoder is built with the allocation bound but no
/// dimension bound, so that [`check_header`] can name the dimensions it refuses.
fn open_decoder<'a>(
    bytes: &'a [u8],
    format: PhotoFormat,
    limits: &PhotoLimits,
) -> Result<impl ImageDecoder + 'a, PhotoError> {
    let mut header_limits = image::Limits::default();
    header_limits.max_alloc = Some(limits.max_alloc_bytes);
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format.image_format());
    reader.limits(header_limits);
    reader
        .into_decoder()
        .map_err(|err| PhotoError::Corrupt(err.to_string()))
}

/// Refuses an image whose declared size passes `limits`; `peak_bytes` is
/// what the pipeline would hold at once ([`peak_bytes`]).
fn check_header(
    width: u32,
    height: u32,
    peak_bytes: u64,
    limits: &PhotoLimits,
) -> Result<(), PhotoError> {
    let pixels = u64::from(width) * u64::from(height);
    if pixels > limits.max_pixels || width > limits.max_side || height > limits.max_side {
        return Err(PhotoError::TooLarge {
            width,
            height,
            limit: size_limit_text(limits),
        });
    }
    if peak_bytes > limits.max_alloc_bytes {
        return Err(PhotoError::TooLarge {
            width,
            height,
            limit: memory_limit_text(Some(peak_bytes), limits),
        });
    }
    Ok(())
}

fn size_limit_text(limits: &PhotoLimits) -> String {
    format!(
        "at most {} pixels and {} pixels a side are taken",
        limits.max_pixels, limits.max_side
    )
}

fn memory_limit_text(needed: Option<u64>, limits: &PhotoLimits) -> String {
    match needed {
        Some(bytes) => format!(
            "decoding it would take {bytes} bytes of memory; at most {} are allowed",
            limits.max_alloc_bytes
        ),
        None => format!(
            "decoding it would take more than the {} bytes of memory allowed",
            limits.max_alloc_bytes
        ),
    }
}

/// The `image::Limits` the decoder enforces itself while it decodes.
fn image_limits(limits: &PhotoLimits) -> image::Limits {
    let mut bounds = image::Limits::default();
    bounds.max_image_width = Some(limits.max_side);
    bounds.max_image_height = Some(limits.max_side);
    bounds.max_alloc = Some(limits.max_alloc_bytes);
    bounds
}

/// A decoder's error, once the header passed: a limit hit while decoding is
/// `TooLarge`, anything else (truncation, bad data) is `Corrupt`.
fn decode_failure(err: ImageError, width: u32, height: u32, limits: &PhotoLimits) -> PhotoError {
    match err {
        ImageError::Limits(_) => PhotoError::TooLarge {
            width,
            height,
            limit: memory_limit_text(None, limits),
        },
        other => PhotoError::Corrupt(other.to_string()),
    }
}

/// RGB8 with any transparency composited onto white (a JPEG has no alpha, and
/// dropping it would show whatever colour the transparent pixels happen to hold).
fn flatten_onto_white(image: DynamicImage) -> RgbImage {
    if !image.color().has_alpha() {
        return image.into_rgb8();
    }
    let rgba = image.into_rgba8();
    let mut rgb = RgbImage::new(rgba.width(), rgba.height());
    for (dst, src) in rgb.pixels_mut().zip(rgba.pixels()) {
        let [r, g, b, alpha] = src.0;
        *dst = Rgb([r, g, b].map(|channel| over_white(channel, alpha)));
    }
    rgb
}

/// One channel at `alpha` over white, rounded.
fn over_white(channel: u8, alpha: u8) -> u8 {
    let (c, a) = (u32::from(channel), u32::from(alpha));
    let blended = (c * a + 255 * (255 - a) + 127) / 255;
    u8::try_from(blended).unwrap_or(u8::MAX)
}

/// Makes the long side at most `max_px`, keeping the aspect ratio; never upscales.
///
/// The filter is `image`'s Triangle (bilinear, widened by the scale factor so
/// every source pixel counts), done here in fixed point and within ±1 of it:
/// for 12 MP → 1536 px `imageops::resize` took ~180 ms of CPU on the 2-core
/// dev machine, this ~40 ms; `imageops::thumbnail` (~95 ms) aliases when the
/// sizes are close.
fn downscale(rgb: RgbImage, max_px: u32) -> RgbImage {
    let (width, height) = fit_within(rgb.width(), rgb.height(), max_px);
    // Height first: that pass runs along whole rows, so it vectorises and
    // leaves the scalar width pass fewer rows to do.
    let rgb = if height < rgb.height() {
        shrink_height(&rgb, height)
    } else {
        rgb
    };
    if width < rgb.width() {
        shrink_width(&rgb, width)
    } else {
        rgb
    }
}

/// The size `width` × `height` takes when its long side is brought down to
/// `max_px` (at least 1), rounded, each side at least 1 pixel.
fn fit_within(width: u32, height: u32, max_px: u32) -> (u32, u32) {
    let max_px = max_px.max(1);
    let long = width.max(height);
    if long <= max_px {
        return (width, height);
    }
    let scale = |side: u32| {
        let scaled = (u64::from(side) * u64::from(max_px) + u64::from(long) / 2) / u64::from(long);
        u32::try_from(scaled).unwrap_or(max_px).max(1)
    };
    (scale(width), scale(height))
}

/// Fixed-point precision of the resampling weights (1.0 = `1 << WEIGHT_BITS`).
const WEIGHT_BITS: u32 = 14;

/// The source pixels that make one output pixel of a shrunk line, and their weights.
struct Taps {
    first: usize,
    weights: Vec<i32>,
}

/// Triangle-filter taps for shrinking a line of `src` pixels to `dst` (`dst <= src`):
/// each output pixel weighs the source pixels within one output pixel's width of
/// its centre, linearly less with distance; weights are renormalised at the edges.
fn triangle_taps(src: u32, dst: u32) -> Vec<Taps> {
    let scale = f64::from(src) / f64::from(dst.max(1));
    let one = f64::from(1u32 << WEIGHT_BITS);
    (0..dst)
        .map(|out| {
            let centre = (f64::from(out) + 0.5) * scale;
            let first = (centre - scale).floor().max(0.0) as usize;
            let end = ((centre + scale).ceil() as usize).clamp(first + 1, src as usize);
            let raw: Vec<f64> = (first..end)
                .map(|i| (1.0 - ((i as f64 + 0.5 - centre) / scale).abs()).max(0.0))
                .collect();
            let total = raw.iter().sum::<f64>().max(f64::MIN_POSITIVE);
            let weights = raw
                .iter()
                .map(|w| (w / total * one).round() as i32)
                .collect();
            Taps { first, weights }
        })
        .collect()
}

/// `rgb` with its height shrunk to `height`, one whole output row at a time.
fn shrink_height(rgb: &RgbImage, height: u32) -> RgbImage {
    let stride = rgb.width() as usize * 3;
    let mut out = RgbImage::new(rgb.width(), height);
    let mut sums = vec![0i32; stride];
    let taps = triangle_taps(rgb.height(), height);
    for (tap, out_row) in taps.iter().zip(out.chunks_exact_mut(stride)) {
        sums.fill(1 << (WEIGHT_BITS - 1));
        let rows = rgb.get(tap.first * stride..).unwrap_or_default();
        for (row, &weight) in rows.chunks_exact(stride).zip(&tap.weights) {
            add_weighted(&mut sums, row, weight);
        }
        store_weighted(out_row, &sums);
    }
    out
}

/// `sums[i] += weight × values[i]` (along a whole row, the compiler vectorises it).
fn add_weighted(sums: &mut [i32], values: &[u8], weight: i32) {
    for (sum, &value) in sums.iter_mut().zip(values) {
        *sum += weight * i32::from(value);
    }
}

/// Weighted sums back to channel values, rounded (the sums start at one half)
/// and clamped.
fn store_weighted(channels: &mut [u8], sums: &[i32]) {
    for (channel, &sum) in channels.iter_mut().zip(sums) {
        *channel = u8::try_from((sum >> WEIGHT_BITS).clamp(0, 255)).unwrap_or(u8::MAX);
    }
}

/// `rgb` with its width shrunk to `width`, one output pixel at a time.
fn shrink_width(rgb: &RgbImage, width: u32) -> RgbImage {
    let (src_stride, dst_stride) = (rgb.width() as usize * 3, width as usize * 3);
    let mut out = RgbImage::new(width, rgb.height());
    let taps = triangle_taps(rgb.width(), width);
    let rows = rgb
        .chunks_exact(src_stride)
        .zip(out.chunks_exact_mut(dst_stride));
    for (row, out_row) in rows {
        for (tap, dst) in taps.iter().zip(out_row.chunks_exact_mut(3)) {
            let mut sums = [1 << (WEIGHT_BITS - 1); 3];
            let pixels = row.get(tap.first * 3..).unwrap_or_default();
            for (pixel, &weight) in pixels.chunks_exact(3).zip(&tap.weights) {
                add_weighted(&mut sums, pixel, weight);
            }
            store_weighted(dst, &sums);
        }
    }
    out
}

/// Encodes as JPEG (`jpeg-encoder`, 4:2:0 chroma). It writes a JFIF header
/// and the pixels, never EXIF, XMP or ICC, so nothing of the upload's
/// metadata survives.
fn encode_jpeg(rgb: &RgbImage, quality: u8) -> Result<Normalized, PhotoError> {
    let mut bytes = Vec::new();
    let too_wide =
        || PhotoError::Corrupt("re-encoding as JPEG failed: wider than 65535 pixels".into());
    let width = u16::try_from(rgb.width()).map_err(|_| too_wide())?;
    let height = u16::try_from(rgb.height()).map_err(|_| too_wide())?;
    jpeg_encoder::Encoder::new(&mut bytes, quality)
        .encode(rgb.as_raw(), width, height, jpeg_encoder::ColorType::Rgb)
        .map_err(|err| PhotoError::Corrupt(format!("re-encoding as JPEG failed: {err}")))?;
    Ok(Normalized {
        bytes,
        width: rgb.width(),
        height: rgb.height(),
        content_type: JPEG_CONTENT_TYPE,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::imageops::FilterType;

    /// [`super::normalize`] outside the pool.
    fn normalize(
        bytes: &[u8],
        max_px: u32,
        limits: &PhotoLimits,
    ) -> Result<Normalized, PhotoError> {
        super::normalize(bytes, max_px, limits, &Memory::unbounded())
    }

    /// [`super::thumbnail`] outside the pool.
    fn thumbnail(
        bytes: &[u8],
        max_px: u32,
        limits: &PhotoLimits,
    ) -> Result<Normalized, PhotoError> {
        super::thumbnail(bytes, max_px, limits, &Memory::unbounded())
    }
    use image::{ImageBuffer, Rgba, RgbaImage};
    use std::time::{Duration, Instant};

    const LONG_SIDE: u32 = 1536;

    /// A smooth colour gradient, so JPEG encodes it like a photo rather than noise.
    fn gradient(width: u32, height: u32) -> RgbImage {
        ImageBuffer::from_fn(width, height, |x, y| {
            let r = (x * 255 / width.max(1)) as u8;
            let g = (y * 255 / height.max(1)) as u8;
            Rgb([r, g, 128])
        })
    }

    fn encode(image: DynamicImage, format: ImageFormat) -> Vec<u8> {
        let mut out = Cursor::new(Vec::new());
        image
            .write_to(&mut out, format)
            .expect("test image encodes");
        out.into_inner()
    }

    fn jpeg(width: u32, height: u32) -> Vec<u8> {
        encode(
            DynamicImage::ImageRgb8(gradient(width, height)),
            ImageFormat::Jpeg,
        )
    }

    fn png(width: u32, height: u32) -> Vec<u8> {
        encode(
            DynamicImage::ImageRgb8(gradient(width, height)),
            ImageFormat::Png,
        )
    }

    fn decode_jpeg(bytes: &[u8]) -> RgbImage {
        assert_eq!(sniff(bytes), Some(PhotoFormat::Jpeg), "output is a JPEG");
        image::load_from_memory_with_format(bytes, ImageFormat::Jpeg)
            .expect("output decodes")
            .into_rgb8()
    }

    fn heic_header() -> Vec<u8> {
        let mut ftyp = vec![0, 0, 0, 0x18];
        ftyp.extend_from_slice(b"ftypheic\0\0\0\0mif1heic");
        ftyp.extend_from_slice(&[0, 0, 0, 8, b'm', b'e', b't', b'a']);
        ftyp
    }

    /// CRC-32 (IEEE) as PNG chunks carry it.
    fn crc32(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &byte in data {
            crc ^= u32::from(byte);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    fn png_chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
        let mut chunk = (data.len() as u32).to_be_bytes().to_vec();
        chunk.extend_from_slice(kind);
        chunk.extend_from_slice(data);
        let crc = crc32(&chunk[4..]);
        chunk.extend_from_slice(&crc.to_be_bytes());
        chunk
    }

    /// A valid-looking PNG that declares `width` × `height` RGB8 but holds only a
    /// tiny zlib stream: a decompression bomb's header.
    fn png_declaring(width: u32, height: u32) -> Vec<u8> {
        let mut ihdr = width.to_be_bytes().to_vec();
        ihdr.extend_from_slice(&height.to_be_bytes());
        ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8-bit RGB, deflate, no interlace
        let empty_zlib = [0x78, 0x9C, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01];
        let mut file = b"\x89PNG\r\n\x1a\n".to_vec();
        file.extend(png_chunk(b"IHDR", &ihdr));
        file.extend(png_chunk(b"IDAT", &empty_zlib));
        file.extend(png_chunk(b"IEND", &[]));
        file
    }

    fn ifd_entry(tag: u16, kind: u16, count: u32, value: [u8; 4]) -> Vec<u8> {
        let mut entry = tag.to_le_bytes().to_vec();
        entry.extend_from_slice(&kind.to_le_bytes());
        entry.extend_from_slice(&count.to_le_bytes());
        entry.extend_from_slice(&value);
        entry
    }

    /// A little-endian TIFF with IFD0 = {Orientation, GPS pointer} and a GPS IFD
    /// = {GPSLatitudeRef "N", GPSLatitude 48/1 51/1 30/1}.
    fn exif_tiff(orientation: u16) -> Vec<u8> {
        const GPS_IFD: u32 = 38; // 8 header + (2 + 2×12 + 4) IFD0
        const LATITUDE: u32 = GPS_IFD + 30;
        let [o0, o1] = orientation.to_le_bytes();
        let mut tiff = b"II\x2a\x00".to_vec();
        tiff.extend_from_slice(&8u32.to_le_bytes());
        tiff.extend_from_slice(&2u16.to_le_bytes());
        tiff.extend(ifd_entry(0x0112, 3, 1, [o0, o1, 0, 0]));
        tiff.extend(ifd_entry(0x8825, 4, 1, GPS_IFD.to_le_bytes()));
        tiff.extend_from_slice(&0u32.to_le_bytes());
        assert_eq!(tiff.len() as u32, GPS_IFD);
        tiff.extend_from_slice(&2u16.to_le_bytes());
        tiff.extend(ifd_entry(0x0001, 2, 2, *b"N\0\0\0"));
        tiff.extend(ifd_entry(0x0002, 5, 3, LATITUDE.to_le_bytes()));
        tiff.extend_from_slice(&0u32.to_le_bytes());
        assert_eq!(tiff.len() as u32, LATITUDE);
        for value in [48u32, 51, 30] {
            tiff.extend_from_slice(&value.to_le_bytes());
            tiff.extend_from_slice(&1u32.to_le_bytes());
        }
        tiff
    }

    /// `jpeg` with a marker segment (`FF marker`, length, payload) inserted right after SOI.
    fn with_segment(jpeg: &[u8], marker: u8, payload: &[u8]) -> Vec<u8> {
        let length = u16::try_from(payload.len() + 2).expect("segment fits");
        let mut file = jpeg[..2].to_vec();
        file.extend_from_slice(&[0xFF, marker]);
        file.extend_from_slice(&length.to_be_bytes());
        file.extend_from_slice(payload);
        file.extend_from_slice(&jpeg[2..]);
        file
    }

    /// `jpeg` with an EXIF APP1 segment carrying `orientation` and GPS.
    fn with_exif(jpeg: &[u8], orientation: u16) -> Vec<u8> {
        let mut payload = b"Exif\0\0".to_vec();
        payload.extend(exif_tiff(orientation));
        with_segment(jpeg, 0xE1, &payload)
    }

    fn read_exif(bytes: &[u8]) -> Result<exif::Exif, exif::Error> {
        exif::Reader::new().read_from_container(&mut Cursor::new(bytes))
    }

    fn assert_no_exif(bytes: &[u8]) {
        assert!(
            matches!(read_exif(bytes), Err(exif::Error::NotFound(_))),
            "no EXIF (so no GPS) survives"
        );
    }

    fn is_red(pixel: Rgb<u8>) -> bool {
        let [r, g, b] = pixel.0;
        r > 200 && g < 60 && b < 60
    }

    #[test]
    fn sniffs_formats_by_magic_numbers_only() {
        assert_eq!(sniff(&png(8, 8)), Some(PhotoFormat::Png));
        assert_eq!(sniff(&jpeg(8, 8)), Some(PhotoFormat::Jpeg));
        let webp = encode(DynamicImage::ImageRgb8(gradient(8, 8)), ImageFormat::WebP);
        assert_eq!(sniff(&webp), Some(PhotoFormat::Webp));
        assert_eq!(sniff(&[0xFF, 0xD8, 0xFF, 0xE0]), Some(PhotoFormat::Jpeg));
        assert_eq!(
            sniff(b"RIFF\0\0\0\0WAVEfmt "),
            None,
            "a WAV is RIFF but not WebP"
        );
        assert_eq!(sniff(b"hello, this is a text file"), None);
        assert_eq!(sniff(b""), None);
        assert_eq!(sniff(&heic_header()), None);
    }

    #[test]
    fn recognises_heic_but_not_avif_or_others() {
        assert!(is_heic(&heic_header()));
        let mut compat_only = heic_header();
        compat_only[8..12].copy_from_slice(b"msf1");
        assert!(is_heic(&compat_only), "heic among the compatible brands");
        let mut avif = heic_header();
        avif[8..12].copy_from_slice(b"avif");
        avif[20..24].copy_from_slice(b"avif");
        assert!(!is_heic(&avif), "AVIF lists mif1 too but is not HEIC");
        assert!(!is_heic(&png(8, 8)));
        assert!(!is_heic(b"ftyp"));
        assert!(!is_heic(b""));
    }

    #[test]
    fn refuses_heic_and_unknown_bytes_as_unsupported() {
        let limits = PhotoLimits::default();
        let heic = normalize(&heic_header(), LONG_SIDE, &limits).unwrap_err();
        assert!(
            matches!(heic, PhotoError::Unsupported { heic: true }),
            "{heic:?}"
        );
        assert_eq!(
            heic.to_string(),
            "HEIC is not supported; send JPEG, PNG or WebP"
        );
        let text = normalize(b"not a photo", LONG_SIDE, &limits).unwrap_err();
        assert!(
            matches!(text, PhotoError::Unsupported { heic: false }),
            "{text:?}"
        );
        assert!(text.to_string().contains("send JPEG, PNG or WebP"));
    }

    #[test]
    fn refuses_a_declared_30000_square_png_from_its_header_quickly() {
        let bomb = png_declaring(30_000, 30_000);
        assert!(bomb.len() < 4096, "the bomb is a few bytes: {}", bomb.len());
        let started = Instant::now();
        let err = normalize(&bomb, LONG_SIDE, &PhotoLimits::default()).unwrap_err();
        let elapsed = started.elapsed();
        assert!(elapsed < Duration::from_millis(100), "took {elapsed:?}");
        match &err {
            PhotoError::TooLarge {
                width: 30_000,
                height: 30_000,
                ..
            } => {}
            other => panic!("expected TooLarge 30000 × 30000, got {other:?}"),
        }
        assert_eq!(
            err.to_string(),
            "the photo is 30000 × 30000 pixels; \
             at most 50000000 pixels and 12000 pixels a side are taken"
        );
    }

    #[test]
    fn refuses_a_thin_image_past_the_side_limit() {
        let err = normalize(
            &png_declaring(20_000, 10),
            LONG_SIDE,
            &PhotoLimits::default(),
        )
        .unwrap_err();
        assert!(matches!(
            err,
            PhotoError::TooLarge {
                width: 20_000,
                height: 10,
                ..
            }
        ));
    }

    #[test]
    fn refuses_past_the_memory_limit_before_decoding() {
        let limits = PhotoLimits {
            max_alloc_bytes: 10_000,
            ..PhotoLimits::default()
        };
        let err = normalize(&png(100, 100), LONG_SIDE, &limits).unwrap_err();
        assert!(matches!(
            err,
            PhotoError::TooLarge {
                width: 100,
                height: 100,
                ..
            }
        ));
        let message = err.to_string();
        assert!(
            message.contains("60000 bytes") && message.contains("10000"),
            "the RGB pixels and their turned copy: {message}"
        );
    }

    /// The peak counts bit depth and channels: 16-bit RGBA takes 8 bytes
    /// a pixel decoded and 12 while it becomes RGB; 8-bit RGB (a JPEG) 3,
    /// and twice that only while a copy is turned.
    #[test]
    fn the_peak_counts_bit_depth_and_channels() {
        let side = 7071;
        let pixels = 7071u64 * 7071;
        assert_eq!(
            peak_bytes(side, side, ColorType::Rgba16, LONG_SIDE),
            12 * pixels,
            "decoded (8) and RGBA8 (4) at once"
        );
        assert_eq!(
            peak_bytes(side, side, ColorType::Rgba8, LONG_SIDE),
            7 * pixels
        );
        assert_eq!(
            peak_bytes(side, side, ColorType::Rgb16, LONG_SIDE),
            9 * pixels
        );
        assert_eq!(peak_bytes(side, side, ColorType::L8, LONG_SIDE), 4 * pixels);
        assert_eq!(
            peak_bytes(4000, 3000, ColorType::Rgb8, LONG_SIDE),
            3 * 4000 * 3000 + 2 * 3 * 1536 * 1152,
            "RGB, shrunk and turned"
        );
        assert!(
            peak_bytes(side, side, ColorType::Rgba16, LONG_SIDE)
                > PhotoLimits::default().max_alloc_bytes,
            "past the default limit: refused before decoding"
        );
    }

    fn noise_jpeg() -> Vec<u8> {
        let noise = ImageBuffer::from_fn(256, 256, |x, y| {
            let v = (x * 7919 + y * 104_729) ^ (x * y);
            Rgb([v as u8, (v >> 8) as u8, (v >> 3) as u8])
        });
        encode(DynamicImage::ImageRgb8(noise), ImageFormat::Jpeg)
    }

    fn expect_corrupt(bytes: &[u8]) {
        match normalize(bytes, LONG_SIDE, &PhotoLimits::default()) {
            Err(err @ PhotoError::Corrupt(_)) => {
                assert!(
                    err.to_string().starts_with("the photo could not be read"),
                    "{err}"
                );
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }

    #[test]
    fn a_truncated_jpeg_is_corrupt() {
        let whole = noise_jpeg();
        assert!(normalize(&whole, LONG_SIDE, &PhotoLimits::default()).is_ok());
        expect_corrupt(&whole[..whole.len() / 2]);
        expect_corrupt(&whole[..whole.len() - 2]); // only the end marker missing
        expect_corrupt(&whole[..300]); // cut inside the headers
    }

    #[test]
    fn an_end_marker_inside_an_app_segment_does_not_hide_truncation() {
        // An EXIF thumbnail is a whole JPEG, end marker included, before the scan.
        let whole = with_segment(&noise_jpeg(), 0xE1, b"Exif\0\0\xFF\xD8\xFF\xD9");
        assert!(normalize(&whole, LONG_SIDE, &PhotoLimits::default()).is_ok());
        expect_corrupt(&whole[..whole.len() / 2]);
    }

    #[test]
    fn bytes_after_the_end_marker_are_allowed() {
        let mut motion_photo = noise_jpeg();
        motion_photo.extend_from_slice(b"\0\0\0\x18ftypmp42 appended video");
        let out = normalize(&motion_photo, LONG_SIDE, &PhotoLimits::default()).unwrap();
        assert_eq!((out.width, out.height), (256, 256));
    }

    #[test]
    fn a_truncated_png_or_webp_is_corrupt() {
        let png = png(300, 300);
        expect_corrupt(&png[..png.len() / 2]);
        let webp = encode(
            DynamicImage::ImageRgb8(gradient(300, 300)),
            ImageFormat::WebP,
        );
        expect_corrupt(&webp[..webp.len() / 2]);
    }

    #[test]
    fn downscales_a_4000_by_3000_jpeg_to_1536_by_1152() {
        // Grey, because encoding 12 MP of colour takes seconds in a debug build.
        let grey = DynamicImage::ImageRgb8(gradient(4000, 3000)).into_luma8();
        let upload = encode(DynamicImage::ImageLuma8(grey), ImageFormat::Jpeg);
        let out = normalize(&upload, LONG_SIDE, &PhotoLimits::default()).unwrap();
        assert_eq!((out.width, out.height), (1536, 1152));
        assert_eq!(out.content_type, "image/jpeg");
        assert_eq!(decode_jpeg(&out.bytes).dimensions(), (1536, 1152));
    }

    #[test]
    fn a_portrait_photo_stays_portrait() {
        let out = normalize(&jpeg(1500, 2000), LONG_SIDE, &PhotoLimits::default()).unwrap();
        assert_eq!((out.width, out.height), (1152, 1536));
        assert_eq!(decode_jpeg(&out.bytes).dimensions(), (1152, 1536));
    }

    #[test]
    fn a_small_photo_is_not_upscaled() {
        let out = normalize(&jpeg(800, 600), LONG_SIDE, &PhotoLimits::default()).unwrap();
        assert_eq!((out.width, out.height), (800, 600));
        assert_eq!(decode_jpeg(&out.bytes).dimensions(), (800, 600));
    }

    #[test]
    fn a_very_thin_image_keeps_at_least_one_pixel() {
        let out = normalize(&png(3000, 1), LONG_SIDE, &PhotoLimits::default()).unwrap();
        assert_eq!((out.width, out.height), (1536, 1));
    }

    #[test]
    fn downscaling_matches_image_triangle_filter() {
        let source = ImageBuffer::from_fn(301, 203, |x, y| {
            Rgb([
                ((x * 5) ^ (y * 3)) as u8,
                (x * y) as u8,
                ((x + y) * 7) as u8,
            ])
        });
        let ours = downscale(source.clone(), 97);
        let (width, height) = ours.dimensions();
        assert_eq!((width, height), (97, 65));
        let reference = image::imageops::resize(&source, width, height, FilterType::Triangle);
        let worst = ours
            .as_raw()
            .iter()
            .zip(reference.as_raw())
            .map(|(a, b)| a.abs_diff(*b))
            .max();
        assert!(worst <= Some(1), "differs from Triangle by {worst:?}");
    }

    #[test]
    fn applies_exif_orientation_and_strips_all_metadata() {
        let mut stored = gradient(400, 200);
        for (x, y, pixel) in stored.enumerate_pixels_mut() {
            if x < 50 && y < 50 {
                *pixel = Rgb([255, 0, 0]);
            }
        }
        let upload = with_exif(
            &encode(DynamicImage::ImageRgb8(stored), ImageFormat::Jpeg),
            6,
        );
        let input_exif = read_exif(&upload).expect("the upload carries EXIF");
        let gps_ref = input_exif.get_field(exif::Tag::GPSLatitudeRef, exif::In::PRIMARY);
        assert!(gps_ref.is_some(), "the upload carries GPS");

        let out = normalize(&upload, LONG_SIDE, &PhotoLimits::default()).unwrap();
        assert_eq!((out.width, out.height), (200, 400), "rotated upright");
        let upright = decode_jpeg(&out.bytes);
        assert!(
            is_red(*upright.get_pixel(180, 20)),
            "top-left went to top-right"
        );
        assert!(!is_red(*upright.get_pixel(20, 20)));
        assert!(!is_red(*upright.get_pixel(20, 380)));
        assert_no_exif(&out.bytes);
    }

    #[test]
    fn an_upright_jpeg_that_fits_keeps_its_pixels_and_loses_its_gps() {
        let plain = encode(
            DynamicImage::ImageRgb8(gradient(300, 200)),
            ImageFormat::Jpeg,
        );
        let upload = with_exif(&plain, 1);
        assert!(
            read_exif(&upload).is_ok(),
            "the upload carries EXIF with GPS"
        );
        let out = normalize(&upload, LONG_SIDE, &PhotoLimits::default()).unwrap();
        assert_eq!((out.width, out.height), (300, 200));
        assert_eq!(
            decode_jpeg(&out.bytes),
            decode_jpeg(&plain),
            "the very pixels sent: no second JPEG generation"
        );
        assert_no_exif(&out.bytes);
    }

    #[test]
    fn a_jpeg_that_must_turn_or_shrink_is_re_encoded() {
        let plain = encode(
            DynamicImage::ImageRgb8(gradient(300, 200)),
            ImageFormat::Jpeg,
        );
        let turned = normalize(&with_exif(&plain, 6), LONG_SIDE, &PhotoLimits::default()).unwrap();
        assert_eq!((turned.width, turned.height), (200, 300), "turned upright");
        let shrunk = normalize(&plain, 150, &PhotoLimits::default()).unwrap();
        assert_eq!((shrunk.width, shrunk.height), (150, 100), "shrunk to fit");
        assert_no_exif(&turned.bytes);
    }

    #[test]
    fn transparency_becomes_white() {
        let rgba: RgbaImage = ImageBuffer::from_fn(100, 100, |x, _| {
            if x < 50 {
                Rgba([255, 0, 0, 0]) // transparent, but red underneath
            } else {
                Rgba([0, 0, 255, 255])
            }
        });
        let upload = encode(DynamicImage::ImageRgba8(rgba), ImageFormat::Png);
        let out = normalize(&upload, LONG_SIDE, &PhotoLimits::default()).unwrap();
        let image = decode_jpeg(&out.bytes);
        let [r, g, b] = image.get_pixel(10, 50).0;
        assert!(
            r > 245 && g > 245 && b > 245,
            "transparent is white: {r} {g} {b}"
        );
        let [r, g, b] = image.get_pixel(90, 50).0;
        assert!(
            r < 30 && g < 30 && b > 220,
            "opaque blue stays blue: {r} {g} {b}"
        );
    }

    #[test]
    fn half_transparent_blends_with_white() {
        assert_eq!(over_white(0, 0), 255);
        assert_eq!(over_white(0, 255), 0);
        assert_eq!(over_white(0, 128), 127);
        assert_eq!(over_white(200, 255), 200);
    }

    #[test]
    fn normalizes_a_webp() {
        let upload = encode(
            DynamicImage::ImageRgb8(gradient(2000, 500)),
            ImageFormat::WebP,
        );
        let out = normalize(&upload, LONG_SIDE, &PhotoLimits::default()).unwrap();
        assert_eq!((out.width, out.height), (1536, 384));
        decode_jpeg(&out.bytes);
    }

    #[test]
    fn thumbnails_a_2000_by_1000_png_to_640_by_320_jpeg() {
        let out = thumbnail(&png(2000, 1000), 640, &PhotoLimits::default()).unwrap();
        assert_eq!((out.width, out.height), (640, 320));
        assert_eq!(out.content_type, "image/jpeg");
        assert_eq!(decode_jpeg(&out.bytes).dimensions(), (640, 320));
    }
}
