//! The print-ready image: a photo fitted to a page of the printer's media
//! (PWG 5101.1 media names to sizes, sizes to pixels at a resolution), cut
//! to fill the page borderless, and encoded in a format the printer takes
//! (JPEG, or PWG raster for printers that take nothing else).

use image::imageops::{self, FilterType};
use image::RgbImage;

/// A page size, in hundredths of a millimetre (the unit of IPP's `media-size`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MediaSize {
    pub width_mm_100: u32,
    pub height_mm_100: u32,
}

/// The size a PWG 5101.1 self-describing media name says: its last
/// `_WxH(in|mm)` part ("na_index-4x6_4x6in" is 4x6 in, "iso_a6_105x148mm",
/// "oe_photo-l_3.5x5in", "custom_booth_100x150mm"). None for a name with no
/// size in it or a zero size.
pub fn media_size(pwg_name: &str) -> Option<MediaSize> {
    pwg_name.rsplit('_').find_map(dimensions)
}

/// `WxHin` or `WxHmm` (decimals allowed) as hundredths of a millimetre.
fn dimensions(part: &str) -> Option<MediaSize> {
    let (numbers, per_unit) = if let Some(n) = part.strip_suffix("in") {
        (n, 2540.0)
    } else if let Some(n) = part.strip_suffix("mm") {
        (n, 100.0)
    } else {
        return None;
    };
    let (w, h) = numbers.split_once('x')?;
    let hundredths = |n: &str| -> Option<u32> {
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
            return None;
        }
        let value = (n.parse::<f64>().ok()? * per_unit).round();
        (value >= 1.0 && value <= f64::from(u32::MAX)).then_some(value as u32)
    };
    Some(MediaSize {
        width_mm_100: hundredths(w)?,
        height_mm_100: hundredths(h)?,
    })
}

/// The page in pixels at `dpi`, rounded: 4x6 in at 300 dpi is (1200, 1800).
pub fn pixels_at(size: &MediaSize, dpi: u32) -> (u32, u32) {
    let pixels = |hundredths: u32| -> u32 {
        ((u64::from(hundredths) * u64::from(dpi) + 1270) / 2540).max(1) as u32
    };
    (pixels(size.width_mm_100), pixels(size.height_mm_100))
}

/// The picture on a page of `target` pixels (width, height), borderless:
/// the page is turned to the picture's orientation (a landscape picture on
/// a portrait page gives a landscape canvas of (target.1, target.0); the
/// picture itself is never rotated), then the picture is scaled to cover
/// the whole page and its middle cut out.
pub fn print_ready(rgb: &RgbImage, target: (u32, u32)) -> RgbImage {
    let (width, height) = page_for(rgb.dimensions(), target);
    let (src_w, src_h) = rgb.dimensions();
    if src_w == 0 || src_h == 0 {
        return RgbImage::from_pixel(width, height, image::Rgb([255, 255, 255]));
    }
    // The largest part of the picture with the page's proportions, centred.
    let (crop_w, crop_h) = if u64::from(src_w) * u64::from(height)
        > u64::from(src_h) * u64::from(width)
    {
        // Wider than the page: cut the sides.
        let w = (u64::from(src_h) * u64::from(width) + u64::from(height) / 2) / u64::from(height);
        (w.clamp(1, u64::from(src_w)) as u32, src_h)
    } else {
        let h = (u64::from(src_w) * u64::from(height) + u64::from(width) / 2) / u64::from(width);
        (src_w, h.clamp(1, u64::from(src_h)) as u32)
    };
    let x = (src_w - crop_w) / 2;
    let y = (src_h - crop_h) / 2;
    let part = imageops::crop_imm(rgb, x, y, crop_w, crop_h);
    if (crop_w, crop_h) == (width, height) {
        return part.to_image();
    }
    imageops::resize(&*part, width, height, FilterType::CatmullRom)
}

/// `target` turned to the picture's orientation; a square picture or page keeps it.
fn page_for(picture: (u32, u32), target: (u32, u32)) -> (u32, u32) {
    let (pw, ph) = picture;
    let (tw, th) = target;
    let picture_landscape = pw > ph;
    let picture_portrait = pw < ph;
    if (picture_landscape && tw < th) || (picture_portrait && tw > th) {
        (th.max(1), tw.max(1))
    } else {
        (tw.max(1), th.max(1))
    }
}

/// JPEG's media type.
pub const JPEG: &str = "image/jpeg";
/// PWG raster's media type.
pub const PWG_RASTER: &str = "image/pwg-raster";

/// PWG raster's page header size (PWG 5102.4), after the 4-byte sync word.
const PWG_HEADER_LEN: usize = 1796;

/// One page of PWG raster (PWG 5102.4, `image/pwg-raster`): the sync word
/// "RaS2", a 1796-byte header (sRGB, 8 bits a colour, `dpi` both ways,
/// `media` as the page size name), then each line compressed as CUPS does:
/// a repeat count for identical lines, then runs of a repeated pixel or of
/// literal pixels (a PackBits variant counting whole pixels). `dpi` should
/// be one of the printer's `pwg-raster-document-resolution-supported`
/// (IPP Everywhere printers list their `printer-resolution-supported`
/// among them).
pub fn encode_pwg_raster(rgb: &RgbImage, dpi: u32, media: &str) -> Vec<u8> {
    let (width, height) = rgb.dimensions();
    let line_len = width as usize * 3;
    let mut out = Vec::with_capacity(4 + PWG_HEADER_LEN + rgb.as_raw().len() / 2);
    out.extend_from_slice(b"RaS2");
    out.extend_from_slice(&pwg_header(width, height, dpi, media));
    if line_len == 0 {
        return out;
    }
    let lines: Vec<&[u8]> = rgb.as_raw().chunks_exact(line_len).collect();
    let mut y = 0;
    while y < lines.len() {
        // Up to 256 identical lines share one encoding.
        let mut repeat = 1;
        while repeat < 256 && y + repeat < lines.len() && lines[y + repeat] == lines[y] {
            repeat += 1;
        }
        out.push((repeat - 1) as u8);
        pack_line(lines[y], &mut out);
        y += repeat;
    }
    out
}

/// The PWG raster page header, big-endian, the fields PWG 5102.4 names
/// (CUPS's `cups_page_header2_t` layout), the rest zero.
fn pwg_header(width: u32, height: u32, dpi: u32, media: &str) -> Vec<u8> {
    let mut h = vec![0u8; PWG_HEADER_LEN];
    let mut put_str = |offset: usize, text: &str| {
        let bytes = &text.as_bytes()[..text.len().min(63)];
        h[offset..offset + bytes.len()].copy_from_slice(bytes);
    };
    put_str(0, "PwgRaster"); // MediaClass
    put_str(1732, media); // PageSizeName
    let dpi = dpi.max(1);
    let points =
        |pixels: u32| ((u64::from(pixels) * 72 + u64::from(dpi) / 2) / u64::from(dpi)) as u32;
    let fields: [(usize, u32); 19] = [
        (276, dpi),            // HWResolution cross-feed
        (280, dpi),            // HWResolution feed
        (340, 1),              // NumCopies
        (352, points(width)),  // PageSize, points
        (356, points(height)), //
        (372, width),          // Width
        (376, height),         // Height
        (384, 8),              // BitsPerColor
        (388, 24),             // BitsPerPixel
        (392, width * 3),      // BytesPerLine
        (396, 0),              // ColorOrder: chunky
        (400, 19),             // ColorSpace: sRGB
        (420, 3),              // NumColors
        (452, 1),              // TotalPageCount
        (456, 1),              // CrossFeedTransform
        (460, 1),              // FeedTransform
        (472, width),          // ImageBoxRight (left and top 0: borderless)
        (476, height),         // ImageBoxBottom
        (480, 0x00ff_ffff),    // AlternatePrimary: white
    ];
    for (offset, value) in fields {
        h[offset..offset + 4].copy_from_slice(&value.to_be_bytes());
    }
    h
}

/// One line of 3-byte pixels: a byte n of 0..=127 is the next pixel n+1
/// times; 257-n (129..=255) is n literal pixels (2..=128) following; a
/// lone last pixel is a run of one.
fn pack_line(line: &[u8], out: &mut Vec<u8>) {
    let pixels: Vec<&[u8]> = line.chunks_exact(3).collect();
    let n = pixels.len();
    let mut i = 0;
    while i < n {
        let mut run = 1;
        while run < 128 && i + run < n && pixels[i + run] == pixels[i] {
            run += 1;
        }
        if run > 1 || i + 1 == n {
            out.push((run - 1) as u8);
            out.extend_from_slice(pixels[i]);
            i += run;
            continue;
        }
        // Literal pixels until two equal neighbours begin a run.
        let mut count = 1;
        while count < 128
            && i + count < n
            && (i + count + 1 >= n || pixels[i + count] != pixels[i + count + 1])
        {
            count += 1;
        }
        if count == 1 {
            out.push(0);
        } else {
            out.push((257 - count) as u8);
        }
        for pixel in &pixels[i..i + count] {
            out.extend_from_slice(pixel);
        }
        i += count;
    }
}

/// The document format to print in, from the printer's
/// `document-format-supported`: JPEG when it takes it, otherwise PWG raster
/// ([`encode_pwg_raster`]), otherwise none this server can make.
pub fn choose_format(formats: &[String]) -> Option<&'static str> {
    [JPEG, PWG_RASTER]
        .into_iter()
        .find(|wanted| formats.iter().any(|f| f.eq_ignore_ascii_case(wanted)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::Rgb;

    #[test]
    fn media_names_give_their_size() {
        let size = |w, h| {
            Some(MediaSize {
                width_mm_100: w,
                height_mm_100: h,
            })
        };
        assert_eq!(media_size("na_index-4x6_4x6in"), size(10160, 15240));
        assert_eq!(media_size("iso_a6_105x148mm"), size(10500, 14800));
        assert_eq!(media_size("oe_photo-l_3.5x5in"), size(8890, 12700));
        assert_eq!(media_size("na_letter_8.5x11in"), size(21590, 27940));
        assert_eq!(media_size("na_number-10_4.125x9.5in"), size(10478, 24130));
        assert_eq!(
            media_size("custom_booth-strip_50.8x152.4mm"),
            size(5080, 15240)
        );
        assert_eq!(media_size("custom_100x150mm"), size(10000, 15000));
        assert_eq!(media_size("iso_a4_210x297mm"), size(21000, 29700));
        for name in [
            "",
            "na_letter",
            "iso_a4",
            "4x6",
            "na_x_0x6in",
            "na_x_4x6cm",
            "na_x_4x-6in",
            "auto",
        ] {
            assert_eq!(media_size(name), None, "{name:?}");
        }
    }

    #[test]
    fn pages_in_pixels() {
        let four_by_six = media_size("na_index-4x6_4x6in").unwrap();
        assert_eq!(pixels_at(&four_by_six, 300), (1200, 1800));
        assert_eq!(pixels_at(&four_by_six, 600), (2400, 3600));
        assert_eq!(
            pixels_at(&media_size("iso_a6_105x148mm").unwrap(), 300),
            (1240, 1748)
        );
        assert_eq!(
            pixels_at(&media_size("oe_photo-l_3.5x5in").unwrap(), 300),
            (1050, 1500)
        );
    }

    fn gradient(width: u32, height: u32) -> RgbImage {
        RgbImage::from_fn(width, height, |x, y| {
            Rgb([(x * 255 / width) as u8, (y * 255 / height) as u8, 100])
        })
    }

    #[test]
    fn a_portrait_picture_fills_a_portrait_page() {
        let page = print_ready(&gradient(1000, 2000), (1200, 1800));
        assert_eq!(page.dimensions(), (1200, 1800));
    }

    #[test]
    fn a_landscape_picture_turns_the_page_not_itself() {
        // 4:3 landscape on a 4x6 portrait page: a 6x4 landscape page, the
        // picture upright (left still dark red, right bright red).
        let picture = gradient(800, 600);
        let page = print_ready(&picture, (400, 600));
        assert_eq!(page.dimensions(), (600, 400));
        assert!(page.get_pixel(2, 200)[0] < 10 && page.get_pixel(597, 200)[0] > 245);
        // The cover cut: 4:3 into 3:2 keeps the full width, cuts top and bottom.
        assert!(page.get_pixel(300, 1)[1] > 10, "top rows cut away");
        assert!(page.get_pixel(300, 398)[1] < 245, "bottom rows cut away");
        // A landscape page with a portrait picture turns the other way.
        assert_eq!(
            print_ready(&gradient(300, 500), (1800, 1200)).dimensions(),
            (1200, 1800)
        );
        // A square picture keeps the page as given.
        assert_eq!(
            print_ready(&gradient(500, 500), (1200, 1800)).dimensions(),
            (1200, 1800)
        );
        assert_eq!(
            print_ready(&gradient(500, 500), (1800, 1200)).dimensions(),
            (1800, 1200)
        );
    }

    #[test]
    fn a_small_picture_is_scaled_up_to_cover() {
        let page = print_ready(&gradient(40, 30), (1200, 1800));
        assert_eq!(page.dimensions(), (1800, 1200));
        let page = print_ready(&gradient(1800, 1200), (1200, 1800));
        assert_eq!(page.dimensions(), (1800, 1200));
    }

    /// Decodes one page of PWG raster as CUPS reads it (3-byte pixels).
    fn decode_pwg(bytes: &[u8]) -> (u32, u32, Vec<u8>) {
        assert_eq!(&bytes[..4], b"RaS2");
        let field =
            |offset: usize| u32::from_be_bytes(bytes[4 + offset..8 + offset].try_into().unwrap());
        let (width, height) = (field(372), field(376));
        let line_len = width as usize * 3;
        let mut pixels = Vec::new();
        let mut at = 4 + PWG_HEADER_LEN;
        while pixels.len() < line_len * height as usize {
            let repeat = bytes[at] as usize + 1;
            at += 1;
            let mut line = Vec::new();
            while line.len() < line_len {
                let n = bytes[at];
                at += 1;
                if n & 0x80 == 0 {
                    for _ in 0..=n {
                        line.extend_from_slice(&bytes[at..at + 3]);
                    }
                    at += 3;
                } else {
                    let count = (257 - u32::from(n)) as usize * 3;
                    line.extend_from_slice(&bytes[at..at + count]);
                    at += count;
                }
            }
            assert_eq!(line.len(), line_len);
            for _ in 0..repeat {
                pixels.extend_from_slice(&line);
            }
        }
        assert_eq!(at, bytes.len(), "nothing after the page");
        (width, height, pixels)
    }

    #[test]
    fn pwg_raster_has_the_page_header() {
        let bytes = encode_pwg_raster(&gradient(1200, 1800), 300, "na_index-4x6_4x6in");
        let field =
            |offset: usize| u32::from_be_bytes(bytes[4 + offset..8 + offset].try_into().unwrap());
        assert_eq!(&bytes[4..14], b"PwgRaster\0");
        assert_eq!(&bytes[4 + 1732..4 + 1732 + 19], b"na_index-4x6_4x6in\0");
        assert_eq!((field(276), field(280)), (300, 300));
        assert_eq!((field(352), field(356)), (288, 432)); // 4x6 in, in points
        assert_eq!((field(372), field(376)), (1200, 1800));
        assert_eq!((field(384), field(388), field(392)), (8, 24, 3600));
        assert_eq!((field(400), field(420)), (19, 3));
        assert_eq!((field(452), field(456), field(460)), (1, 1, 1));
    }

    #[test]
    fn pwg_raster_decodes_to_the_same_pixels() {
        // Runs, literals, a lone last pixel, identical lines, more than
        // 128 equal pixels, more than 256 equal lines.
        let mut picture = RgbImage::from_pixel(301, 600, Rgb([255, 255, 255]));
        for x in 0..301 {
            picture.put_pixel(x, 0, Rgb([x as u8, 0, 0]));
            picture.put_pixel(x, 1, Rgb([(x / 3) as u8, 7, 9]));
            picture.put_pixel(
                x,
                2,
                if x % 2 == 0 {
                    Rgb([1, 2, 3])
                } else {
                    Rgb([4, 5, 6])
                },
            );
        }
        picture.put_pixel(300, 3, Rgb([9, 9, 9]));
        for picture in [
            picture,
            gradient(257, 3),
            gradient(1, 1),
            RgbImage::new(2, 2),
            gradient(129, 2),
        ] {
            let (width, height, pixels) =
                decode_pwg(&encode_pwg_raster(&picture, 600, "iso_a6_105x148mm"));
            assert_eq!((width, height), picture.dimensions());
            assert!(pixels == *picture.as_raw(), "{width}x{height}");
        }
    }

    #[test]
    fn formats_prefer_jpeg() {
        let formats = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            choose_format(&formats(&[
                "application/octet-stream",
                "image/pwg-raster",
                "image/jpeg"
            ])),
            Some("image/jpeg")
        );
        assert_eq!(
            choose_format(&formats(&["image/urf", "image/pwg-raster"])),
            Some("image/pwg-raster")
        );
        assert_eq!(
            choose_format(&formats(&["application/pdf", "image/urf"])),
            None
        );
        assert_eq!(choose_format(&[]), None);
    }
}
