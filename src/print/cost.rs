//! What the event's outputs cost in CPU, measured here for `stagehand
//! bench` (the hidden `stagehand output-cost` prints it as JSON): drawing
//! the brand on a 1024² and a 2048² result (decode, overlay, logo,
//! caption, the two JPEG encodes of the keep stage), and preparing a
//! print (decode the branded file, fit it to 4×6 in at 300 dpi, encode).
//! Times are the measuring thread's CPU time, in milliseconds.

use std::io::Cursor;

use bytes::Bytes;
use image::{Rgba, RgbaImage};

use super::prepare::{media_size, pixels_at, print_ready};
use crate::domain::brand::{AppliesTo, BrandFit};
use crate::media::brand::{brand_result, sample_result, BrandArt, BrandParts};
use crate::media::photo::{decode_rgb, jpeg_of, PhotoLimits};
use crate::media::pool::Memory;

/// The rounds of each measurement, in ms of CPU, in order.
#[derive(Debug, Clone, serde::Serialize)]
pub struct OutputCost {
    pub brand_1024_ms: Vec<f64>,
    pub brand_2048_ms: Vec<f64>,
    pub print_prepare_ms: Vec<f64>,
}

/// Measures `rounds` rounds of each.
pub fn measure(rounds: usize) -> Result<OutputCost, String> {
    let memory = Memory::unbounded();
    let art = bench_brand(&memory)?;
    let result = |side| -> Result<Vec<u8>, String> {
        Ok(jpeg_of(&sample_result(side), 90)
            .map_err(|e| e.to_string())?
            .bytes)
    };
    let (small, large) = (result(1024)?, result(2048)?);
    let brand = |bytes: &[u8]| -> Result<Vec<f64>, String> {
        (0..rounds)
            .map(|_| {
                let started = thread_cpu_ms();
                brand_result(bytes, &art, 640, &PhotoLimits::default(), &memory)
                    .map_err(|e| e.to_string())?;
                Ok(thread_cpu_ms() - started)
            })
            .collect()
    };
    let branded = brand_result(&large, &art, 640, &PhotoLimits::default(), &memory)
        .map_err(|e| e.to_string())?
        .full
        .bytes;
    let page = pixels_at(&media_size("na_index-4x6_4x6in").ok_or("no 4x6 size")?, 300);
    let print_prepare_ms = (0..rounds)
        .map(|_| {
            let started = thread_cpu_ms();
            let decoded = decode_rgb(&branded, &PhotoLimits::default(), &memory)
                .map_err(|e| e.to_string())?;
            jpeg_of(&print_ready(&decoded.image, page), 92).map_err(|e| e.to_string())?;
            Ok(thread_cpu_ms() - started)
        })
        .collect::<Result<_, String>>()?;
    Ok(OutputCost {
        brand_1024_ms: brand(&small)?,
        brand_2048_ms: brand(&large)?,
        print_prepare_ms,
    })
}

/// A brand as an event sets one: a frame overlay with a clear middle, a
/// logo and a caption in Hangul and Latin.
fn bench_brand(memory: &Memory) -> Result<BrandArt, String> {
    let png = |image: RgbaImage| {
        let mut out = Cursor::new(Vec::new());
        image
            .write_to(&mut out, image::ImageFormat::Png)
            .map(|_| Bytes::from(out.into_inner()))
    };
    let frame = RgbaImage::from_fn(1200, 1800, |x, y| {
        let edge = x < 90 || y < 90 || x >= 1110 || y >= 1710;
        Rgba(if edge {
            [200, 30, 60, 255]
        } else {
            [0, 0, 0, 0]
        })
    });
    let logo = RgbaImage::from_fn(400, 200, |x, _| Rgba([255, 255, 255, (x % 256) as u8]));
    let parts = BrandParts {
        overlay: Some(png(frame).map_err(|e| e.to_string())?),
        logo: Some(png(logo).map_err(|e| e.to_string())?),
        fit: BrandFit::Cover,
        caption: Some("서울 디자인 위크 2026 · #stagehand".into()),
        applies_to: AppliesTo::default(),
    };
    BrandArt::decode(parts, memory)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| "the bench brand draws nothing".to_owned())
}

/// This thread's CPU time, in ms.
#[cfg(target_os = "linux")]
fn thread_cpu_ms() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as f64 * 1_000.0 + t.tv_nsec as f64 / 1_000_000.0
}

/// Elsewhere: wall time (the measuring thread does nothing else).
#[cfg(not(target_os = "linux"))]
fn thread_cpu_ms() -> f64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs_f64()
        * 1_000.0
}
