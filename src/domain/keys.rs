//! Keys: the AI idempotency key derivation (rule 5), the hash under which
//! tokens are stored, and how Idempotency-Keys and their stored answers are
//! kept (a digest of the key; the answer sealed with a key only its caller
//! can derive).
//!
//! AI attempt 0 uses the saga's `ai_base_key`; attempt n uses
//! UUIDv5(`ai_base_key`, n). Two workers on the same attempt therefore send
//! the same key, and the provider hands back the same job instead of
//! starting a second one.

use sha2::{Digest, Sha256};
use uuid::Uuid;

/// How a terminal's or participant's token is stored: SHA-256, in hex. A
/// token carries 244 random bits, so a plain hash is enough to make a leaked
/// table useless. (The migration that hashed the tokens of the day uses the
/// same function.)
pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// The identifier a provider may use to attribute a policy violation to one
/// end user rather than to the whole account (OpenAI's
/// `safety_identifier`): SHA-256 of the session id under a fixed label, in
/// hex. Stable for every request of one session, different between
/// sessions, and it reveals neither the session id nor anything the guest
/// typed.
pub fn safety_identifier(session_id: &str) -> String {
    hex::encode(
        Sha256::new()
            .chain_update(b"stagehand safety identifier\0")
            .chain_update(session_id.as_bytes())
            .finalize(),
    )
}

/// How an Idempotency-Key is stored: SHA-256 of its scope and the key, in
/// hex. The key itself never reaches the database: for session creation
/// it is the caller's only secret.
pub fn idempotency_key_digest(scope: &str, key: &str) -> String {
    hex::encode(
        Sha256::new()
            .chain_update(b"stagehand idempotency key\0")
            .chain_update(scope.as_bytes())
            .chain_update([0])
            .chain_update(key.as_bytes())
            .finalize(),
    )
}

/// The key that seals a stored answer of `scope` and Idempotency-Key
/// `key` for `caller` (the caller's bearer token; empty for anonymous
/// session creation, whose key carries at least 122 random bits): only
/// someone who sends the same key with the same token can read the answer
/// back, so a stolen database holds no token it issued. Distinct from
/// [`idempotency_key_digest`] by its domain prefix.
pub fn replay_seal_key(caller: &str, scope: &str, key: &str) -> [u8; 32] {
    Sha256::new()
        .chain_update(b"stagehand replay seal\0")
        .chain_update(caller.as_bytes())
        .chain_update([0])
        .chain_update(scope.as_bytes())
        .chain_update([0])
        .chain_update(key.as_bytes())
        .finalize()
        .into()
}

/// The `Idempotency-Key` for AI attempt `attempt` of a saga. The name hashed
/// into the v5 UUID is the attempt number in decimal ASCII.
pub fn ai_attempt_key(base: Uuid, attempt: u32) -> Uuid {
    if attempt == 0 {
        base
    } else {
        Uuid::new_v5(&base, attempt.to_string().as_bytes())
    }
}

/// The `Idempotency-Key` for attempt `attempt` of call `call` of a fan-out
/// saga. Call 0 has exactly the keys of a single-call saga
/// ([`ai_attempt_key`]), so a saga of one call is unchanged; call `i` > 0
/// uses UUIDv5(`ai_base_key`, "call-{i}/{attempt}"), a name no single-call
/// key uses (those are bare decimal numbers).
pub fn ai_call_key(base: Uuid, call: u32, attempt: u32) -> Uuid {
    if call == 0 {
        ai_attempt_key(base, attempt)
    } else {
        Uuid::new_v5(&base, format!("call-{call}/{attempt}").as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_safety_identifier_is_stable_per_session_and_reveals_nothing() {
        let session = "3f2b8c1e-5d4a-4e2f-9a7b-0c1d2e3f4a5b";
        let id = safety_identifier(session);
        assert_eq!(id.len(), 64);
        assert!(id
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_eq!(id, safety_identifier(session), "stable");
        assert_ne!(id, safety_identifier("another session"));
        assert!(!id.contains("3f2b8c1e"));
        assert_ne!(id, token_hash(session), "not the plain hash of the id");
    }

    #[test]
    fn stored_keys_and_seals_depend_on_every_input() {
        let d = idempotency_key_digest("s", "k");
        assert_eq!(d.len(), 64);
        assert!(!d.contains('k'));
        assert_ne!(d, idempotency_key_digest("s", "k2"));
        assert_ne!(d, idempotency_key_digest("s2", "k"));
        assert_ne!(
            idempotency_key_digest("sk", ""),
            idempotency_key_digest("s", "k")
        );
        let seal = replay_seal_key("t", "s", "k");
        assert_ne!(seal, replay_seal_key("u", "s", "k"));
        assert_ne!(seal, replay_seal_key("t", "s", "k2"));
        assert_ne!(hex::encode(seal), d, "the seal is not the stored digest");
    }

    #[test]
    fn token_hash_is_sha256_hex() {
        assert_eq!(
            token_hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    const BASE: &str = "6ba7b810-9dad-11d1-80b4-00c04fd430c8";

    #[test]
    fn attempt_zero_is_the_base_key() {
        let base = Uuid::parse_str(BASE).unwrap();
        assert_eq!(ai_attempt_key(base, 0), base);
    }

    #[test]
    fn later_attempts_are_v5_of_the_attempt_number() {
        let base = Uuid::parse_str(BASE).unwrap();
        // Vectors: UUIDv5 with the base as namespace and "1"/"2" as name
        // (the same as Python's uuid.uuid5(base, "1")).
        assert_eq!(
            ai_attempt_key(base, 1).to_string(),
            "b04965e6-a9bb-591f-8f8a-1adcb2c8dc39"
        );
        assert_eq!(
            ai_attempt_key(base, 2).to_string(),
            "4b166dbe-d99d-5091-abdd-95b83330ed3a"
        );
        assert_eq!(ai_attempt_key(base, 1).get_version_num(), 5);
    }

    #[test]
    fn keys_are_stable_and_distinct() {
        let base = Uuid::parse_str(BASE).unwrap();
        let keys: Vec<Uuid> = (0..10).map(|n| ai_attempt_key(base, n)).collect();
        let again: Vec<Uuid> = (0..10).map(|n| ai_attempt_key(base, n)).collect();
        assert_eq!(keys, again);
        let mut dedup = keys.clone();
        dedup.sort();
        dedup.dedup();
        assert_eq!(dedup.len(), keys.len());
        let other = Uuid::new_v5(&Uuid::NAMESPACE_OID, b"other saga");
        assert_ne!(ai_attempt_key(other, 1), ai_attempt_key(base, 1));
    }

    #[test]
    fn call_keys_keep_call_zero_and_are_distinct() {
        let base = Uuid::parse_str(BASE).unwrap();
        for attempt in 0..5 {
            assert_eq!(ai_call_key(base, 0, attempt), ai_attempt_key(base, attempt));
        }
        let mut keys: Vec<Uuid> = (0..30)
            .flat_map(|call| (0..3).map(move |attempt| ai_call_key(base, call, attempt)))
            .collect();
        let n = keys.len();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), n);
        assert_eq!(
            ai_call_key(base, 1, 0),
            Uuid::new_v5(&base, b"call-1/0"),
            "call 1, attempt 0"
        );
    }
}
