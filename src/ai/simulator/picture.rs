//! The simulator's pictures: a small SVG drawn from a job's kind and prompt,
//! served at `GET /v1/jobs/{id}/image.svg` so that a result shows a real
//! image on the pages (before, its URL pointed at an address that could not
//! load). Everything comes from the job's kind and prompt: the same job
//! always gives the same bytes (no clock, no randomness; the colours and
//! shapes are picked by a hash of the two, so the same prompt draws the same
//! picture in every run, which keeps screenshots of the pages stable).
//!
//! The prompt is participants' text: it only ever appears as XML character
//! data, escaped ([`xml_text`]), and characters XML cannot hold at all are
//! dropped, so no prompt can break the document or add markup to it.

use crate::domain::markup::xml_text;
use std::fmt::Write as _;

/// The picture's size (its viewBox; the pages scale it).
const WIDTH: u32 = 800;
const HEIGHT: u32 = 600;
/// Characters of the prompt drawn at most (the rest is cut with "…").
const MAX_PROMPT_CHARS: usize = 240;

/// Background pairs (sky, ground) a picture is painted in.
const PALETTE: [(&str, &str); 8] = [
    ("#5b3df5", "#f0b429"),
    ("#0f766e", "#fde68a"),
    ("#be185d", "#fbcfe8"),
    ("#1d4ed8", "#93c5fd"),
    ("#b45309", "#fed7aa"),
    ("#15803d", "#bbf7d0"),
    ("#7c3aed", "#ddd6fe"),
    ("#0e7490", "#a5f3fc"),
];

/// The SVG document for a job of `kind` with `prompt`. `comic`: four panels
/// in reading order with the prompt's words spread over them; `score`: a
/// trophy card; `video`: a film frame; `music`: a record and sound bars;
/// anything else (`image`): one picture. Every kind carries the prompt.
pub fn draw(kind: &str, prompt: &str) -> String {
    let mut dice = Dice::new(&[kind, prompt]);
    let words = words_of(prompt);
    let mut svg = String::with_capacity(4096);
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" font-family="'Nanum Gothic','NanumGothic','Noto Sans CJK KR',sans-serif">"#
    );
    let _ = write!(
        svg,
        "<title>{}</title>",
        xml_text(&format!("{kind}: {}", words.join(" ")))
    );
    match kind {
        "comic" => comic(&mut svg, &mut dice, &words),
        "score" => badge(&mut svg, &mut dice, &words, Badge::Trophy),
        "video" => badge(&mut svg, &mut dice, &words, Badge::Film),
        "music" => badge(&mut svg, &mut dice, &words, Badge::Record),
        _ => picture(&mut svg, &mut dice, &words),
    }
    svg.push_str("</svg>\n");
    svg
}

/// The prompt's words, at most [`MAX_PROMPT_CHARS`] characters of them.
fn words_of(prompt: &str) -> Vec<String> {
    let mut left = MAX_PROMPT_CHARS;
    let mut words = Vec::new();
    for word in prompt.split_whitespace() {
        if left == 0 {
            break;
        }
        let count = word.chars().count();
        if count > left {
            let cut: String = word.chars().take(left).collect();
            words.push(format!("{cut}…"));
            break;
        }
        left = left.saturating_sub(count + 1);
        words.push(word.to_owned());
    }
    if words.is_empty() {
        words.push("…".to_owned());
    }
    words
}

/// One comic: a 2×2 grid of panels, each with its own little scene and its
/// share of the words in a caption box (a panel without words stays silent).
fn comic(svg: &mut String, dice: &mut Dice, words: &[String]) {
    svg.push_str(r##"<rect width="800" height="600" fill="#fffdf7"/>"##);
    let (panel_w, panel_h, gap) = (380.0, 280.0, 13.33);
    let n = words.len();
    for i in 0..4_u32 {
        let x = gap + f64::from(i % 2) * (panel_w + gap);
        let y = gap + f64::from(i / 2) * (panel_h + gap);
        let share = &words[i as usize * n / 4..(i as usize + 1) * n / 4];
        let (sky, ground) = PALETTE[dice.below(PALETTE.len())];
        let _ = write!(
            svg,
            r##"<g transform="translate({x:.1} {y:.1})"><rect width="{panel_w}" height="{panel_h}" fill="{sky}"/>"##
        );
        scene(svg, dice, panel_w, panel_h, ground, 0.7);
        let _ = write!(
            svg,
            r##"<text x="12" y="30" font-size="22" font-weight="700" fill="#fff">{}</text>"##,
            i + 1
        );
        if !share.is_empty() {
            caption(
                svg,
                share,
                12.0,
                panel_h - 96.0,
                panel_w - 24.0,
                84.0,
                22.0,
                3,
            );
        }
        let _ = write!(
            svg,
            r##"<rect width="{panel_w}" height="{panel_h}" fill="none" stroke="#111" stroke-width="5"/></g>"##
        );
    }
}

/// One picture: a scene filling the frame, the prompt in a band below.
fn picture(svg: &mut String, dice: &mut Dice, words: &[String]) {
    let (sky, ground) = PALETTE[dice.below(PALETTE.len())];
    let _ = write!(
        svg,
        r##"<defs><linearGradient id="sky" x1="0" y1="0" x2="0" y2="1"><stop offset="0" stop-color="{sky}"/><stop offset="1" stop-color="{ground}"/></linearGradient></defs><rect width="800" height="600" fill="url(#sky)"/>"##
    );
    scene(svg, dice, 800.0, 600.0, ground, 1.4);
    caption(svg, words, 30.0, 430.0, 740.0, 140.0, 32.0, 3);
}

#[derive(Clone, Copy)]
enum Badge {
    Trophy,
    Film,
    Record,
}

/// A card with a big emblem of the kind in the middle and the prompt below.
fn badge(svg: &mut String, dice: &mut Dice, words: &[String], emblem: Badge) {
    let (dark, light) = PALETTE[dice.below(PALETTE.len())];
    let _ = write!(
        svg,
        r##"<rect width="800" height="600" fill="{dark}"/><circle cx="400" cy="220" r="170" fill="{light}" opacity=".25"/>"##
    );
    match emblem {
        Badge::Trophy => {
            // A star of five points and a cup base.
            let mut points = String::new();
            for k in 0..10_u32 {
                let r = if k % 2 == 0 { 130.0 } else { 55.0 };
                let a = std::f64::consts::PI * (f64::from(k) / 5.0 - 0.5);
                let _ = write!(
                    points,
                    "{:.1},{:.1} ",
                    400.0 + r * a.cos(),
                    215.0 + r * a.sin()
                );
            }
            let _ = write!(
                svg,
                r##"<polygon points="{}" fill="#facc15" stroke="#fff" stroke-width="6"/><rect x="350" y="345" width="100" height="22" rx="6" fill="#fff"/>"##,
                points.trim_end()
            );
        }
        Badge::Film => {
            svg.push_str(
                r##"<rect x="230" y="90" width="340" height="250" rx="18" fill="#111"/>"##,
            );
            for k in 0..6 {
                let x = 248 + k * 55;
                let _ = write!(
                    svg,
                    r##"<rect x="{x}" y="102" width="30" height="18" rx="3" fill="#eee"/><rect x="{x}" y="310" width="30" height="18" rx="3" fill="#eee"/>"##
                );
            }
            let _ = write!(
                svg,
                r##"<rect x="250" y="130" width="300" height="170" fill="{light}"/><polygon points="370,170 370,260 445,215" fill="#fff" stroke="#111" stroke-width="4"/>"##
            );
        }
        Badge::Record => {
            let _ = write!(
                svg,
                r##"<circle cx="330" cy="215" r="120" fill="#111"/><circle cx="330" cy="215" r="40" fill="{light}"/><circle cx="330" cy="215" r="7" fill="#111"/>"##
            );
            for k in 0..7 {
                let h = 30 + dice.below(150) as u32;
                let x = 480 + k * 26;
                let _ = write!(
                    svg,
                    r##"<rect x="{x}" y="{}" width="16" height="{h}" rx="8" fill="#fff"/>"##,
                    300 - h
                );
            }
        }
    }
    caption(svg, words, 30.0, 410.0, 740.0, 160.0, 32.0, 3);
}

/// A little landscape in a `w`×`h` frame: ground, a sun and a figure placed
/// by the dice; `scale` sizes the figure.
fn scene(svg: &mut String, dice: &mut Dice, w: f64, h: f64, ground: &str, scale: f64) {
    let horizon = h * (0.55 + 0.1 * dice.unit());
    let sun_x = w * (0.15 + 0.7 * dice.unit());
    let sun_r = h * (0.07 + 0.05 * dice.unit());
    let _ = write!(
        svg,
        r##"<circle cx="{sun_x:.1}" cy="{:.1}" r="{sun_r:.1}" fill="#fff7c2" opacity=".9"/><path d="M0 {horizon:.1} Q {:.1} {:.1} {w:.1} {horizon:.1} V {h:.1} H 0 Z" fill="{ground}"/>"##,
        h * 0.22,
        w * (0.3 + 0.4 * dice.unit()),
        horizon - h * 0.15,
    );
    // A figure: a round body, a head with eyes, on the ground; and a prop
    // on the other side of it.
    let left = dice.below(2) == 0;
    let fx = w * if left {
        0.2 + 0.25 * dice.unit()
    } else {
        0.55 + 0.25 * dice.unit()
    };
    let px = w * if left { 0.78 } else { 0.22 };
    prop(svg, dice, px, horizon + h * 0.02, scale);
    let fy = horizon + h * 0.02;
    let s = 28.0 * scale;
    let body = PALETTE[dice.below(PALETTE.len())].0;
    let _ = write!(
        svg,
        r##"<g transform="translate({fx:.1} {fy:.1})"><ellipse cx="0" cy="{:.1}" rx="{:.1}" ry="{:.1}" fill="{body}" stroke="#111" stroke-width="3"/><circle cx="0" cy="{:.1}" r="{:.1}" fill="#ffe0bd" stroke="#111" stroke-width="3"/><circle cx="{:.1}" cy="{:.1}" r="{:.1}" fill="#111"/><circle cx="{:.1}" cy="{:.1}" r="{:.1}" fill="#111"/></g>"##,
        -s * 0.9,
        s * 0.8,
        s,
        -s * 2.4,
        s * 0.7,
        -s * 0.25,
        -s * 2.5,
        s * 0.1,
        s * 0.25,
        -s * 2.5,
        s * 0.1,
    );
}

/// Something standing at (`x`, `y`): a tree, a house, a flower or a
/// cloud above, sized by `scale`.
fn prop(svg: &mut String, dice: &mut Dice, x: f64, y: f64, scale: f64) {
    let s = 28.0 * scale;
    let _ = match dice.below(4) {
        0 => write!(
            svg,
            r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#7c4a1e"/><circle cx="{x:.1}" cy="{:.1}" r="{:.1}" fill="#16a34a" stroke="#111" stroke-width="3"/>"##,
            x - s * 0.18,
            y - s * 1.6,
            s * 0.36,
            s * 1.6,
            y - s * 2.1,
            s * 0.95,
        ),
        1 => write!(
            svg,
            r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#fef3c7" stroke="#111" stroke-width="3"/><polygon points="{:.1},{:.1} {x:.1},{:.1} {:.1},{:.1}" fill="#dc2626" stroke="#111" stroke-width="3"/><rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#60a5fa" stroke="#111" stroke-width="2"/>"##,
            x - s,
            y - s * 1.5,
            s * 2.0,
            s * 1.5,
            x - s * 1.25,
            y - s * 1.5,
            y - s * 2.6,
            x + s * 1.25,
            y - s * 1.5,
            x - s * 0.3,
            y - s * 1.1,
            s * 0.6,
            s * 0.55,
        ),
        2 => write!(
            svg,
            r##"<path d="M {x:.1} {y:.1} V {:.1}" stroke="#15803d" stroke-width="4"/><circle cx="{x:.1}" cy="{:.1}" r="{:.1}" fill="#f472b6" stroke="#111" stroke-width="3"/><circle cx="{x:.1}" cy="{:.1}" r="{:.1}" fill="#fde047"/>"##,
            y - s * 1.2,
            y - s * 1.4,
            s * 0.45,
            y - s * 1.4,
            s * 0.18,
        ),
        _ => write!(
            svg,
            r##"<g fill="#fff" opacity=".85"><circle cx="{:.1}" cy="{:.1}" r="{:.1}"/><circle cx="{x:.1}" cy="{:.1}" r="{:.1}"/><circle cx="{:.1}" cy="{:.1}" r="{:.1}"/></g>"##,
            x - s * 0.7,
            y - s * 3.6,
            s * 0.5,
            y - s * 3.9,
            s * 0.7,
            x + s * 0.7,
            y - s * 3.6,
            s * 0.5,
        ),
    };
}

/// A white box at (`x`, `y`) of `w`×`h` with `words` wrapped in it, at most
/// `max_lines` lines (the last cut with "…" when they do not fit).
#[allow(clippy::too_many_arguments)]
fn caption(
    svg: &mut String,
    words: &[String],
    x: f64,
    y: f64,
    w: f64,
    h: f64,
    size: f64,
    max_lines: usize,
) {
    // Roughly: a Latin character is half the font size wide, a wide (CJK)
    // one a whole.
    let room = ((w - size) / (size * 0.55)).floor().max(4.0) as usize;
    let lines = wrap(words, room, max_lines);
    let _ = write!(
        svg,
        r##"<rect x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" rx="12" fill="#fff" stroke="#111" stroke-width="3"/>"##
    );
    let line_h = size * 1.2;
    let top = y + h / 2.0 - line_h * (lines.len() as f64) / 2.0 + size * 0.85;
    for (k, line) in lines.iter().enumerate() {
        let _ = write!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" font-size="{size}" fill="#111" text-anchor="middle">{}</text>"##,
            x + w / 2.0,
            top + line_h * k as f64,
            xml_text(line)
        );
    }
}

/// How wide `text` is in half-widths: wide (CJK, Hangul, emoji) characters
/// count two.
fn width_of(text: &str) -> usize {
    text.chars()
        .map(|c| if (c as u32) >= 0x1100 { 2 } else { 1 })
        .sum()
}

/// Greedy word wrap to lines of `room` half-widths; a word longer than a line
/// is cut. More than `max_lines` lines: the last one ends with "…".
fn wrap(words: &[String], room: usize, max_lines: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    let mut truncated = false;
    for word in words {
        let mut word = word.clone();
        if width_of(&word) > room {
            let mut cut = String::new();
            for c in word.chars() {
                if width_of(&cut) + width_of(&c.to_string()) > room.saturating_sub(1) {
                    break;
                }
                cut.push(c);
            }
            cut.push('…');
            word = cut;
        }
        let wanted = if line.is_empty() {
            width_of(&word)
        } else {
            width_of(&line) + 1 + width_of(&word)
        };
        if wanted > room && !line.is_empty() {
            lines.push(std::mem::take(&mut line));
            if lines.len() == max_lines {
                truncated = true;
                break;
            }
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(&word);
    }
    if !truncated && !line.is_empty() {
        lines.push(line);
    }
    if truncated {
        if let Some(last) = lines.last_mut() {
            if !last.ends_with('…') {
                while width_of(last) + 1 > room {
                    last.pop();
                }
                last.push('…');
            }
        }
    }
    lines
}

/// Deterministic dice: splitmix64 seeded with FNV-1a of the parts (std's
/// hasher is seeded at random per process, so it cannot be used here).
struct Dice(u64);

impl Dice {
    fn new(parts: &[&str]) -> Self {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for part in parts {
            for byte in part.bytes().chain([0]) {
                hash ^= u64::from(byte);
                hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        Self(hash)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// A number in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text content of every `<text>` element, unescaped.
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text ")
            .skip(1)
            .map(|part| {
                let body = &part[part.find('>').expect("a text tag") + 1..];
                let body = &body[..body.find("</text>").expect("a closed text")];
                body.replace("&lt;", "<")
                    .replace("&gt;", ">")
                    .replace("&quot;", "\"")
                    .replace("&apos;", "'")
                    .replace("&amp;", "&")
            })
            .collect()
    }

    #[test]
    fn same_prompt_same_picture_and_prompts_differ() {
        let one = draw("comic", "a cat on a skateboard");
        assert_eq!(one, draw("comic", "a cat on a skateboard"));
        assert_ne!(one, draw("comic", "a cat on a surfboard"));
        assert_ne!(one, draw("image", "a cat on a skateboard"));
        assert!(
            one.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""),
            "{one}"
        );
        assert!(one.ends_with("</svg>\n"));
    }

    #[test]
    fn comic_spreads_the_words_over_four_panels() {
        let svg = draw("comic", "one two three four five six seven eight");
        // Four panels, each with its figure.
        assert_eq!(svg.matches("<g transform=\"translate(").count(), 8, "{svg}");
        let texts = texts(&svg);
        // The panel numbers, then each panel's caption.
        assert_eq!(
            texts,
            [
                "1",
                "one two",
                "2",
                "three four",
                "3",
                "five six",
                "4",
                "seven eight"
            ]
        );
    }

    #[test]
    fn image_is_one_picture_with_the_prompt() {
        let svg = draw("image", "a lighthouse in a storm");
        assert_eq!(texts(&svg), ["a lighthouse in a storm"]);
        assert_eq!(svg.matches("<svg").count(), 1);
        for kind in ["score", "video", "music", "something-new"] {
            let svg = draw(kind, "a lighthouse in a storm");
            assert_eq!(texts(&svg), ["a lighthouse in a storm"], "{kind}");
        }
    }

    #[test]
    fn markup_in_the_prompt_stays_text() {
        let prompt = "<script>alert('x')</script> & \"quotes\" ]]> <!-- \u{0}\u{7}\u{FFFF}";
        for kind in ["comic", "image", "score", "video", "music"] {
            let svg = draw(kind, prompt);
            assert!(!svg.contains("<script"), "{kind}: {svg}");
            assert!(!svg.contains("<!--"), "{kind}: {svg}");
            assert!(!svg.contains('\u{0}') && !svg.contains('\u{7}') && !svg.contains('\u{FFFF}'));
            // Every `&` starts an entity the document can hold.
            for (at, _) in svg.match_indices('&') {
                let rest = &svg[at..];
                assert!(
                    ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"]
                        .iter()
                        .any(|e| rest.starts_with(e)),
                    "{kind}: a bare & at {at}: {svg}"
                );
            }
            let joined = texts(&svg).join(" ");
            assert!(
                joined.contains("<script>alert('x')</script>"),
                "{kind}: {joined}"
            );
            assert!(
                joined.contains('&') && joined.contains("\"quotes\""),
                "{kind}: {joined}"
            );
        }
        assert_eq!(xml_text("a<b>&\"'\tc"), "a&lt;b&gt;&amp;&quot;&apos; c");
    }

    #[test]
    fn long_and_empty_prompts_are_cut_and_drawn() {
        let long = "word ".repeat(500);
        let svg = draw("image", &long);
        assert!(svg.len() < 8_000, "{}", svg.len());
        let lines = texts(&svg);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[2].ends_with('…'), "{lines:?}");
        let one_word = "x".repeat(1000);
        let lines = texts(&draw("image", &one_word));
        assert_eq!(lines.len(), 1);
        assert!(lines[0].ends_with('…'));
        assert_eq!(texts(&draw("image", "   ")), ["…"]);
        // Korean counts as wide: it wraps earlier, and nothing is lost
        // below the limit.
        let ko = "보스를 한 번에 물리쳤어요 정말 대단한 하루였어요";
        let lines = texts(&draw("image", ko));
        assert_eq!(lines.join(" "), ko);
    }
}
