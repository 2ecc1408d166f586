//! Text put into markup (the simulator's SVG pictures, the HTML part of a
//! guest's mail): one escape, so that nothing a guest or an organiser
//! typed becomes markup.

/// `text` as XML character data: `& < > " '` escaped, and characters XML 1.0
/// cannot hold (controls, U+FFFE, U+FFFF) dropped, so that nothing in it is
/// markup and the document stays well-formed.
pub fn xml_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(' '),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => {}
            c => out.push(c),
        }
    }
    out
}
