//! JPEG's marker structure, read without decoding a pixel: whether a file
//! reaches its end-of-image marker, how many colour components it has, and
//! the same image with its metadata cut out.
//!
//! A JPEG is a run of segments (a marker `FF xx`, most with a 2-byte
//! length) around entropy-coded scan data. Everything that identifies a
//! person or a device lives outside the scans: in the application segments
//! (APP0–APP15: EXIF with GPS, serial numbers and a thumbnail, XMP, IPTC,
//! ICC profiles naming the device), in comments (COM), and in whatever a
//! phone appends after the end-of-image marker (a motion photo's video,
//! MPF's second pictures with EXIF of their own). [`strip_metadata`] copies
//! the tables and the scans byte for byte, so the pixels are exactly the
//! upload's (no second JPEG generation), and keeps of the rest only what
//! decoding needs: the JFIF header without its thumbnail, and Adobe's
//! colour-transform segment.
//!
//! The crate img-parts parses segments too, but keeps everything after the
//! first scan as one opaque block: a progressive file's later segments and
//! the bytes after its end, which is where a motion photo keeps its video.

/// Start of image.
const SOI: u8 = 0xD8;
/// End of image.
const EOI: u8 = 0xD9;
/// Start of scan: its header is followed by entropy-coded data.
const SOS: u8 = 0xDA;
/// APP0, where JFIF's header lives.
const APP0: u8 = 0xE0;
/// APP14, where Adobe's colour transform lives.
const APP14: u8 = 0xEE;
/// A comment.
const COM: u8 = 0xFE;
/// JFIF's header without a thumbnail: `JFIF\0`, version (2), units (1),
/// densities (2 + 2), then the thumbnail's width and height (set to 0).
const JFIF_HEADER: usize = 12;
/// Adobe's segment: `Adobe`, version (2), flags (2 + 2), transform (1).
const ADOBE_SEGMENT: usize = 12;

/// Why a file is not a whole JPEG.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum JpegError {
    /// It does not open with `FF D8`.
    #[error("the data does not start like a JPEG")]
    NotJpeg,
    /// The data ends before the end-of-image marker.
    #[error("the JPEG data stops before its end-of-image marker")]
    Truncated,
    /// A segment is not where or what a segment must be.
    #[error("the JPEG's structure is broken at byte {0}")]
    Malformed(usize),
}

/// One piece of a JPEG in file order: a marker segment (the marker, its
/// length and its payload) or the entropy-coded data after a scan header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Piece<'a> {
    Segment { marker: u8, bytes: &'a [u8] },
    Scan(&'a [u8]),
}

/// What [`read`] found: the file is whole up to its end-of-image marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Structure {
    /// Colour components of the frame (1 grey, 3 YCbCr, 4 CMYK), if a
    /// frame header came before the first scan.
    pub components: Option<u8>,
    /// Where the end-of-image marker ends; anything after it is not the image.
    pub end: usize,
}

/// Walks the whole file to its end-of-image marker: Err if the data stops
/// first (a half-sent upload, which decoders pad with grey instead of
/// failing) or a segment is broken. An end marker inside an application
/// segment (an EXIF thumbnail's) is skipped with its segment.
pub fn read(bytes: &[u8]) -> Result<Structure, JpegError> {
    let mut components = None;
    let end = walk(bytes, |piece| {
        if let Piece::Segment { marker, bytes } = piece {
            if components.is_none() && is_frame_header(marker) {
                components = bytes.get(9).copied();
            }
        }
    })?;
    Ok(Structure { components, end })
}

/// The same JPEG with no metadata: SOI, the segments decoding needs and
/// every scan byte for byte, then EOI; nothing after the end marker.
pub fn strip_metadata(bytes: &[u8]) -> Result<Vec<u8>, JpegError> {
    let mut out = Vec::with_capacity(bytes.len());
    out.extend_from_slice(&[0xFF, SOI]);
    walk(bytes, |piece| match piece {
        Piece::Scan(data) => out.extend_from_slice(data),
        Piece::Segment { marker, bytes } => keep_segment(marker, bytes, &mut out),
    })?;
    out.extend_from_slice(&[0xFF, EOI]);
    Ok(out)
}

/// Appends the part of a segment that survives: JFIF's header without its
/// thumbnail, Adobe's colour transform, every segment that is not an
/// application segment or a comment; nothing else.
fn keep_segment(marker: u8, segment: &[u8], out: &mut Vec<u8>) {
    let payload = segment.get(4..).unwrap_or_default();
    let kept = match marker {
        APP0 if payload.starts_with(b"JFIF\0") => payload.get(..JFIF_HEADER).map(|header| {
            let mut header = header.to_vec();
            header.extend_from_slice(&[0, 0]);
            header
        }),
        APP14 if payload.starts_with(b"Adobe") => payload.get(..ADOBE_SEGMENT).map(<[u8]>::to_vec),
        0xE0..=0xEF | COM => None,
        _ => {
            out.extend_from_slice(segment);
            return;
        }
    };
    if let Some(payload) = kept {
        let length = u16::try_from(payload.len() + 2).unwrap_or(u16::MAX);
        out.extend_from_slice(&[0xFF, marker]);
        out.extend_from_slice(&length.to_be_bytes());
        out.extend_from_slice(&payload);
    }
}

/// SOF0–SOF15 (`C0`–`CF`) but DHT (`C4`), JPG (`C8`) and DAC (`CC`), which
/// share the range.
fn is_frame_header(marker: u8) -> bool {
    (0xC0..=0xCF).contains(&marker) && !matches!(marker, 0xC4 | 0xC8 | 0xCC)
}

/// Calls `visit` with each piece from after SOI up to (not with) EOI, and
/// returns where EOI ends.
fn walk<'a>(bytes: &'a [u8], mut visit: impl FnMut(Piece<'a>)) -> Result<usize, JpegError> {
    if !bytes.starts_with(&[0xFF, SOI]) {
        return Err(JpegError::NotJpeg);
    }
    let mut pos = 2;
    loop {
        let (marker, start, after_marker) = next_marker(bytes, pos)?;
        if marker == EOI {
            return Ok(after_marker);
        }
        if is_standalone(marker) {
            visit(Piece::Segment {
                marker,
                bytes: &bytes[start..after_marker],
            });
            pos = after_marker;
            continue;
        }
        let end = segment_end(bytes, start, after_marker)?;
        visit(Piece::Segment {
            marker,
            bytes: &bytes[start..end],
        });
        pos = end;
        if marker == SOS {
            let scan_end = scan_end(bytes, pos)?;
            visit(Piece::Scan(&bytes[pos..scan_end]));
            pos = scan_end;
        }
    }
}

/// The marker at `pos` (after any `FF` fill bytes): its code, where its
/// last `FF` is, and where its code ends.
fn next_marker(bytes: &[u8], pos: usize) -> Result<(u8, usize, usize), JpegError> {
    if *bytes.get(pos).ok_or(JpegError::Truncated)? != 0xFF {
        return Err(JpegError::Malformed(pos));
    }
    let mut code = pos + 1;
    while bytes.get(code) == Some(&0xFF) {
        code += 1;
    }
    let marker = *bytes.get(code).ok_or(JpegError::Truncated)?;
    if marker == 0x00 {
        return Err(JpegError::Malformed(code));
    }
    Ok((marker, code - 1, code + 1))
}

/// Markers with no length and no payload: TEM and the restart markers.
fn is_standalone(marker: u8) -> bool {
    marker == 0x01 || (0xD0..=0xD7).contains(&marker)
}

/// Where a segment with a length ends; its length counts its own two bytes.
fn segment_end(bytes: &[u8], start: usize, after_marker: usize) -> Result<usize, JpegError> {
    let length = bytes
        .get(after_marker..after_marker + 2)
        .ok_or(JpegError::Truncated)?;
    let length = usize::from(u16::from_be_bytes([length[0], length[1]]));
    if length < 2 {
        return Err(JpegError::Malformed(start));
    }
    let end = after_marker + length;
    if end > bytes.len() {
        return Err(JpegError::Truncated);
    }
    Ok(end)
}

/// Where the entropy-coded data from `from` ends: at the first `FF` that
/// starts a marker. `FF 00` is a stuffed data byte and `FF D0`–`FF D7` a
/// restart marker, both part of the scan; `FF FF` is fill before a marker.
fn scan_end(bytes: &[u8], from: usize) -> Result<usize, JpegError> {
    let mut pos = from;
    loop {
        let ff = pos
            + bytes[pos..]
                .iter()
                .position(|&b| b == 0xFF)
                .ok_or(JpegError::Truncated)?;
        match *bytes.get(ff + 1).ok_or(JpegError::Truncated)? {
            0x00 | 0xD0..=0xD7 => pos = ff + 2,
            _ => return Ok(ff),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A photo-like picture with fine detail, so every scan has real data.
    fn picture(width: u16, height: u16) -> Vec<u8> {
        (0..u32::from(width) * u32::from(height))
            .flat_map(|i| {
                let (x, y) = (i % u32::from(width), i / u32::from(width));
                let v = (x * 7 + y * 13) ^ (x * y);
                [v as u8, (x * 3) as u8, (y * 5 + (v >> 3)) as u8]
            })
            .collect()
    }

    /// A JPEG of `picture` made with jpeg-encoder, as configured by `setup`.
    fn encoded(
        width: u16,
        height: u16,
        setup: impl FnOnce(&mut jpeg_encoder::Encoder<&mut Vec<u8>>),
    ) -> Vec<u8> {
        let mut out = Vec::new();
        let mut encoder = jpeg_encoder::Encoder::new(&mut out, 90);
        setup(&mut encoder);
        encoder
            .encode(
                &picture(width, height),
                width,
                height,
                jpeg_encoder::ColorType::Rgb,
            )
            .expect("test picture encodes");
        out
    }

    fn segment(marker: u8, payload: &[u8]) -> Vec<u8> {
        let mut bytes = vec![0xFF, marker];
        bytes.extend_from_slice(
            &u16::try_from(payload.len() + 2)
                .expect("fits")
                .to_be_bytes(),
        );
        bytes.extend_from_slice(payload);
        bytes
    }

    /// `jpeg` with `extra` inserted at `at`.
    fn inserted(jpeg: &[u8], at: usize, extra: &[u8]) -> Vec<u8> {
        [&jpeg[..at], extra, &jpeg[at..]].concat()
    }

    fn pixels(jpeg: &[u8]) -> Vec<u8> {
        image::load_from_memory_with_format(jpeg, image::ImageFormat::Jpeg)
            .expect("decodes")
            .into_rgb8()
            .into_raw()
    }

    fn markers(jpeg: &[u8]) -> Vec<u8> {
        let mut found = Vec::new();
        walk(jpeg, |piece| {
            if let Piece::Segment { marker, .. } = piece {
                found.push(marker);
            }
        })
        .expect("a whole JPEG");
        found
    }

    /// Where the `n`th scan header (0-based) starts.
    fn nth_scan_header(jpeg: &[u8], n: usize) -> usize {
        let mut starts = Vec::new();
        walk(jpeg, |piece| {
            if let Piece::Segment { marker: SOS, bytes } = piece {
                starts.push(bytes.as_ptr() as usize - jpeg.as_ptr() as usize);
            }
        })
        .expect("a whole JPEG");
        starts[n]
    }

    /// Every kind of metadata a phone writes, around a baseline JPEG.
    fn with_everything(jpeg: &[u8]) -> Vec<u8> {
        let mut exif = b"Exif\0\0MM\0*GPS 48N serial 1234".to_vec();
        exif.extend_from_slice(&[0xFF, SOI, 0xFF, EOI]); // its thumbnail's markers
        let metadata = [
            segment(0xE1, &exif),
            segment(0xE1, b"http://ns.adobe.com/xap/1.0/\0<x:xmpmeta>"),
            segment(0xE2, b"ICC_PROFILE\0\x01\x01device model"),
            segment(0xED, b"Photoshop 3.0\0IPTC byline"),
            segment(COM, b"taken by someone"),
        ]
        .concat();
        let mut file = inserted(jpeg, 2, &metadata);
        file.extend_from_slice(b"\0\0\0\x18ftypmp42 a motion photo's video with GPS");
        file
    }

    #[test]
    fn stripping_keeps_every_pixel_and_drops_every_kind_of_metadata() {
        let plain = encoded(96, 64, |_| {});
        let upload = with_everything(&plain);
        let stripped = strip_metadata(&upload).expect("whole");
        assert_eq!(
            pixels(&stripped),
            pixels(&plain),
            "the same pixels, not a re-encode"
        );
        assert!(
            markers(&stripped)
                .iter()
                .all(|m| !(0xE1..=0xED).contains(m) && *m != COM),
            "no EXIF, XMP, ICC, IPTC or comment: {:02X?}",
            markers(&stripped)
        );
        for secret in [
            &b"GPS"[..],
            b"serial",
            b"xmpmeta",
            b"device model",
            b"IPTC",
            b"someone",
            b"mp42",
        ] {
            assert!(
                !stripped.windows(secret.len()).any(|w| w == secret),
                "{} survived",
                String::from_utf8_lossy(secret)
            );
        }
        assert!(
            stripped.ends_with(&[0xFF, EOI]),
            "nothing after the end marker"
        );
        assert_eq!(read(&stripped).expect("whole").end, stripped.len());
    }

    #[test]
    fn a_progressive_jpeg_with_metadata_between_its_scans_is_stripped_whole() {
        let plain = encoded(80, 48, |e| e.set_progressive(true));
        let later_scan = nth_scan_header(&plain, 2);
        let upload = inserted(
            &plain,
            later_scan,
            &segment(0xE1, b"Exif\0\0GPS between scans"),
        );
        assert!(
            markers(&upload).iter().filter(|m| **m == SOS).count() > 2,
            "progressive"
        );
        let stripped = strip_metadata(&upload).expect("whole");
        assert_eq!(pixels(&stripped), pixels(&plain));
        assert!(
            !stripped.windows(3).any(|w| w == b"GPS"),
            "the late EXIF is gone"
        );
        assert_eq!(stripped, plain, "nothing else changed");
    }

    #[test]
    fn restart_markers_and_stuffed_bytes_stay_inside_their_scan() {
        let plain = encoded(64, 64, |e| e.set_restart_interval(2));
        assert!(
            markers(&plain).contains(&0xDD),
            "the file has a restart interval"
        );
        let stripped = strip_metadata(&plain).expect("whole");
        assert_eq!(
            stripped, plain,
            "a file with nothing to strip comes back unchanged"
        );
    }

    #[test]
    fn jfif_loses_its_thumbnail_and_adobe_keeps_its_colour_transform() {
        let plain = encoded(32, 32, |_| {});
        let mut jfif = b"JFIF\0\x01\x02\x01\0\x48\0\x48\x02\x01".to_vec();
        jfif.extend_from_slice(&[9; 6]); // a 2 × 1 RGB thumbnail
        let adobe = b"Adobe\0\x64\0\0\0\0\x01";
        let upload = inserted(
            &plain,
            2,
            &[segment(APP0, &jfif), segment(APP14, adobe)].concat(),
        );
        let stripped = strip_metadata(&upload).expect("whole");
        let mut without_thumbnail = jfif[..JFIF_HEADER].to_vec();
        without_thumbnail.extend_from_slice(&[0, 0]);
        let expected_start = [
            &[0xFF, SOI][..],
            &segment(APP0, &without_thumbnail),
            &segment(APP14, adobe),
        ]
        .concat();
        assert!(
            stripped.starts_with(&expected_start),
            "{:02X?}",
            &stripped[..40]
        );
        assert_eq!(pixels(&stripped), pixels(&plain));
    }

    #[test]
    fn every_cut_short_copy_is_refused_and_none_panics() {
        let whole = with_everything(&encoded(24, 16, |e| e.set_progressive(true)));
        let end = read(&whole).expect("whole").end;
        for cut in 0..end {
            let prefix = &whole[..cut];
            assert!(read(prefix).is_err(), "cut at {cut} of {end} passed");
            assert!(strip_metadata(prefix).is_err(), "cut at {cut} stripped");
        }
    }

    #[test]
    fn reads_the_frames_components() {
        assert_eq!(
            read(&encoded(8, 8, |_| {})).expect("whole").components,
            Some(3)
        );
        let mut grey = Vec::new();
        jpeg_encoder::Encoder::new(&mut grey, 90)
            .encode(&[128; 64], 8, 8, jpeg_encoder::ColorType::Luma)
            .expect("encodes");
        assert_eq!(read(&grey).expect("whole").components, Some(1));
        assert_eq!(read(b"\x89PNG"), Err(JpegError::NotJpeg));
    }
}
