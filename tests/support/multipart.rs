//! A reader of `multipart/form-data` bodies (RFC 7578) for the fakes of
//! the vendors' APIs: OpenAI's image edit and Replicate's Files API take
//! one. Strict where the RFC is (a boundary in the `Content-Type`, each
//! part a `Content-Disposition: form-data` with a `name`, CRLF line ends),
//! and it reads nothing else, so a malformed request is refused rather
//! than guessed at.

/// One part of a form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub name: String,
    /// Set for a file part.
    pub filename: Option<String>,
    /// The part's own `Content-Type`, if it has one.
    pub content_type: Option<String>,
    pub bytes: Vec<u8>,
}

impl Part {
    /// The part's bytes as text (a plain field).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// Whether a request's `Content-Type` is `multipart/form-data`.
pub fn is_form(content_type: Option<&str>) -> bool {
    content_type.is_some_and(|ct| {
        ct.trim()
            .to_ascii_lowercase()
            .starts_with("multipart/form-data")
    })
}

/// The parts of `body`, sent with `content_type`; `Err` says what is wrong.
pub fn parse(content_type: &str, body: &[u8]) -> Result<Vec<Part>, String> {
    if !is_form(Some(content_type)) {
        return Err(format!("not multipart/form-data: {content_type:?}"));
    }
    let boundary = content_type
        .split(';')
        .skip(1)
        .filter_map(|param| param.trim().split_once('='))
        .find(|(name, _)| name.eq_ignore_ascii_case("boundary"))
        .map(|(_, value)| value.trim_matches('"').to_owned())
        .filter(|b| !b.is_empty())
        .ok_or("no boundary in the Content-Type")?;
    let opening = format!("--{boundary}");
    let closing = format!("\r\n--{boundary}");
    let mut rest = body
        .strip_prefix(opening.as_bytes())
        .ok_or("the body does not start with the boundary")?;
    let mut parts = Vec::new();
    loop {
        if rest.starts_with(b"--") {
            return Ok(parts);
        }
        rest = rest
            .strip_prefix(b"\r\n")
            .ok_or("a boundary not followed by CRLF")?;
        let end = find(rest, closing.as_bytes()).ok_or("a part without its closing boundary")?;
        parts.push(part(&rest[..end])?);
        rest = &rest[end + closing.len()..];
    }
}

fn part(raw: &[u8]) -> Result<Part, String> {
    let head_end = find(raw, b"\r\n\r\n").ok_or("a part without a blank line after its headers")?;
    let head = std::str::from_utf8(&raw[..head_end]).map_err(|_| "part headers are not UTF-8")?;
    let mut disposition = None;
    let mut content_type = None;
    for line in head.split("\r\n") {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| format!("a part header without a colon: {line:?}"))?;
        match name.trim().to_ascii_lowercase().as_str() {
            "content-disposition" => disposition = Some(value.trim().to_owned()),
            "content-type" => content_type = Some(value.trim().to_owned()),
            _ => {}
        }
    }
    let disposition = disposition.ok_or("a part without Content-Disposition")?;
    let mut params = disposition.split(';').map(str::trim);
    if params.next() != Some("form-data") {
        return Err(format!("a part that is not form-data: {disposition:?}"));
    }
    let mut name = None;
    let mut filename = None;
    for param in params {
        if let Some((key, value)) = param.split_once('=') {
            let value = value.trim().trim_matches('"').to_owned();
            match key.trim() {
                "name" => name = Some(value),
                "filename" => filename = Some(value),
                _ => {}
            }
        }
    }
    Ok(Part {
        name: name.ok_or("a part without a name")?,
        filename,
        content_type,
        bytes: raw[head_end + 4..].to_vec(),
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}
