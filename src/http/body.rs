//! Request bodies: read with a size limit (413 beyond), parsed as JSON with a
//! clear 400, and the canonical hash the idempotency rules compare.

use actix_web::web;
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use super::error::ApiError;

/// JSON bodies are at most 64 KiB.
pub const MAX_BODY: usize = 64 * 1024;

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

pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::InvalidJson(
            "the request body must be a JSON object".into(),
        ));
    }
    serde_json::from_slice(body).map_err(|e| {
        ApiError::InvalidJson(format!("the body is not valid JSON for this request: {e}"))
    })
}

/// Hash of the body for "same key, same body": JSON is compared by value
/// (key order and spacing do not matter), anything else byte for byte.
pub fn request_hash(body: &[u8]) -> String {
    let canonical = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(value) => value.to_string().into_bytes(),
        Err(_) => body.to_vec(),
    };
    hex::encode(Sha256::digest(&canonical))
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
    fn empty_body_is_invalid_json() {
        assert!(matches!(
            parse_json::<serde_json::Value>(b"  "),
            Err(ApiError::InvalidJson(_))
        ));
    }
}
