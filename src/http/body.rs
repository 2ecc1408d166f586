//! Request bodies: JSON only (415 for another declared media type), read
//! with a size limit (413 beyond), parsed as JSON with a clear 400, and the
//! canonical hash the idempotency rules compare.

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{mime, web, Error, HttpMessage};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use super::error::ApiError;

/// JSON bodies are at most 64 KiB.
pub const MAX_BODY: usize = 64 * 1024;

/// Middleware of the endpoints that take a JSON body: a declared
/// `Content-Type` other than `application/json` (or `application/*+json`,
/// any parameters) is 415 `unsupported_media_type` before the body is
/// read. No `Content-Type` at all is read as JSON.
pub async fn json_only(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, Error> {
    if let Err(e) = json_media_type(&req) {
        return Ok(req.error_response(e).map_into_right_body());
    }
    Ok(next.call(req).await?.map_into_left_body())
}

fn json_media_type(req: &ServiceRequest) -> Result<(), ApiError> {
    let refused = || {
        let declared = req
            .headers()
            .get(actix_web::http::header::CONTENT_TYPE)
            .map(|v| {
                String::from_utf8_lossy(v.as_bytes())
                    .chars()
                    .take(100)
                    .collect::<String>()
            })
            .unwrap_or_default();
        ApiError::UnsupportedMediaType(format!(
            "the request body must be JSON (Content-Type: application/json), not {declared:?}"
        ))
    };
    match req.mime_type() {
        Ok(None) => Ok(()),
        Ok(Some(mime))
            if mime.type_() == mime::APPLICATION
                && (mime.subtype() == mime::JSON || mime.suffix() == Some(mime::JSON)) =>
        {
            Ok(())
        }
        _ => Err(refused()),
    }
}

/// Reads the whole body, refusing more than `MAX_BODY` bytes.
pub async fn read_body(mut payload: web::Payload) -> Result<web::Bytes, ApiError> {
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::InvalidJson(format!("could not read the body: {e}")))?;
        if body.len() + chunk.len() > MAX_BODY {
            return Err(ApiError::PayloadTooLarge(MAX_BODY));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// A body field that holds an RFC 3339 time, as epoch milliseconds; 422
/// naming the field otherwise.
pub fn rfc3339_ms(field: &str, text: &str) -> Result<i64, ApiError> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp_millis())
        .map_err(|_| ApiError::Validation(format!("{field} must be an RFC 3339 time")))
}

pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::InvalidJson(
            "the request body must be a JSON object".into(),
        ));
    }
    let parsed = serde_json::from_slice(body).map_err(|e| {
        ApiError::InvalidJson(format!("the body is not valid JSON for this request: {e}"))
    })?;
    // No field needs U+0000 and PostgreSQL cannot store it in text.
    if has_escaped_nul(body) {
        return Err(ApiError::Validation(
            "text in the body must not contain NUL characters (\\u0000)".into(),
        ));
    }
    Ok(parsed)
}

/// Whether valid JSON text holds the escape `\u0000` (a raw NUL byte is
/// not valid JSON). Backslashes occur only in strings, each starting an
/// escape, so skipping the character after each one finds exactly the
/// escapes.
fn has_escaped_nul(json: &[u8]) -> bool {
    let mut i = 0;
    while i < json.len() {
        if json[i] == b'\\' {
            if json[i + 1..].starts_with(b"u0000") {
                return true;
            }
            i += 2;
        } else {
            i += 1;
        }
    }
    false
}

/// Hash of the body for "same key, same body": JSON is compared by value
/// (key order and spacing do not matter), anything else byte for byte.
pub fn request_hash(body: &[u8]) -> String {
    let digest = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(value) => Sha256::digest(value.to_string()),
        Err(_) => Sha256::digest(body),
    };
    hex::encode(digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_json_hashes_equal() {
        assert_eq!(
            request_hash(br#"{"a":1,"b":2}"#),
            request_hash(br#"{ "b": 2, "a": 1 }"#)
        );
        assert_ne!(request_hash(br#"{"a":1}"#), request_hash(br#"{"a":2}"#));
    }

    #[test]
    fn escaped_nul_is_refused_and_an_escaped_backslash_is_not_one() {
        let parse = |text: &str| parse_json::<serde_json::Value>(text.as_bytes());
        assert!(matches!(
            parse(r#"{"a": "x\u0000"}"#),
            Err(ApiError::Validation(_))
        ));
        assert!(matches!(
            parse(r#"{"a\u0000": 1}"#),
            Err(ApiError::Validation(_))
        ));
        assert!(parse(r#"{"a": "\\u0000"}"#).is_ok());
        assert!(parse(r#"{"a": "\\\u0041"}"#).is_ok());
        assert!(matches!(
            parse(r#"{"a": "\\\u0000"}"#),
            Err(ApiError::Validation(_))
        ));
    }

    #[test]
    fn empty_body_is_invalid_json() {
        assert!(matches!(
            parse_json::<serde_json::Value>(b"  "),
            Err(ApiError::InvalidJson(_))
        ));
    }
}
