//! Idempotency records: one row per (scope, key). Taking keys is a single
//! `INSERT ... ON CONFLICT` for a whole batch of requests, so a duplicate
//! request learns at once that the first is still in progress and never
//! waits on a lock held across anything slow. A record whose time ran out
//! (24 h) is taken over by the next request with its key, and so is an
//! IN_PROGRESS record whose owner's lease ([`KEY_LEASE_MS`], the request
//! timeout) ran out: its request died; on PostgreSQL also one whose
//! instance is known dead (its `instances` row gone or stale for
//! [`INSTANCE_ALIVE_MS`]), at once. Finishing and releasing are fenced
//! on the owner, so a request that outlived its lease changes nothing.
//!
//! Nothing here lets someone with the database act as anyone: the key is
//! stored as a digest, and a stored answer (which may carry a token the
//! request issued) is sealed with a key derived from the Idempotency-Key
//! and the caller's token, so only the caller who sends them again reads
//! it back.

use sea_orm::sea_query::Condition;
use sea_orm::{
    ColumnTrait, ConnectionTrait, DbBackend, EntityTrait, QueryFilter, Statement, Value,
};

use super::entities::idempotency_records as records;
use super::presence::INSTANCE_ALIVE_MS;
use super::rows::{SqlType, ValueRows};
use super::{Store, StoreResult};
use crate::domain::keys::{idempotency_key_digest, replay_seal_key};
use crate::domain::policy::EpochMs;
use ring::aead;

const IN_PROGRESS: &str = "in_progress";
const COMPLETED: &str = "completed";

/// How long a request holds its key IN_PROGRESS: its time to answer. No
/// request takes longer (its statements wait on a lock at most the lock
/// timeout, a few times, and on a pool connection at most 10 s); past it,
/// the request is taken to have died and a retry runs.
pub const KEY_LEASE_MS: i64 = 30_000;
/// Expired records deleted per statement by [`Store::purge_expired_keys`].
pub const PURGE_BATCH: u64 = 1_000;

/// A request's key, in its scope (who asks, at which endpoint).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRequest {
    pub scope: String,
    /// The key's digest ([`idempotency_key_digest`]): the key itself is
    /// never stored.
    pub key: String,
    pub request_hash: String,
    /// This request (a random id): the owner of the record while it runs.
    pub owner: String,
    /// Seals the stored answer ([`replay_seal_key`]).
    pub seal: Seal,
    /// The instance running the request (PostgreSQL): when it is known
    /// dead, the key is taken over at once (see `instances`).
    pub instance: Option<String>,
}

impl KeyRequest {
    /// The key `key` of `caller` (its bearer token; empty when anonymous)
    /// in `scope`, for a request whose body hashes to `request_hash`.
    pub fn new(scope: &str, key: &str, caller: &str, request_hash: String) -> KeyRequest {
        KeyRequest {
            scope: scope.to_owned(),
            key: idempotency_key_digest(scope, key),
            request_hash,
            owner: super::new_id(),
            seal: Seal(replay_seal_key(caller, scope, key)),
            instance: None,
        }
    }

    /// The same request, run by `instance` (None on SQLite: one instance).
    pub fn on_instance(mut self, instance: Option<&str>) -> KeyRequest {
        self.instance = instance.map(str::to_owned);
        self
    }
}

/// The key that seals one stored answer (ChaCha20-Poly1305, a random
/// nonce per answer). Its `Debug` shows nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub struct Seal([u8; 32]);

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Seal(***)")
    }
}

/// Stored answers start with this, then base64url of nonce and sealed body.
const SEALED: &str = "sealed1:";

impl Seal {
    /// A seal of `key` (for secrets kept in the database, such as the
    /// webhook endpoints', with a key derived from the server's secret).
    pub fn with_key(key: [u8; 32]) -> Seal {
        Seal(key)
    }

    fn key(&self) -> aead::LessSafeKey {
        aead::LessSafeKey::new(
            aead::UnboundKey::new(&aead::CHACHA20_POLY1305, &self.0)
                .expect("a 32-byte ChaCha20-Poly1305 key"),
        )
    }

    /// `body` sealed, as stored.
    pub fn seal(&self, body: &str) -> String {
        let mut nonce = [0u8; aead::NONCE_LEN];
        rand::fill(&mut nonce);
        let mut sealed = body.as_bytes().to_vec();
        self.key()
            .seal_in_place_append_tag(
                aead::Nonce::assume_unique_for_key(nonce),
                aead::Aad::empty(),
                &mut sealed,
            )
            .expect("sealing an answer of at most a few KiB");
        let mut stored = nonce.to_vec();
        stored.extend(sealed);
        format!("{SEALED}{}", hex::encode(stored))
    }

    /// The body of a stored answer; None when it was not sealed with this
    /// key (or not sealed at all).
    pub fn open(&self, stored: &str) -> Option<String> {
        let bytes = hex::decode(stored.strip_prefix(SEALED)?).ok()?;
        if bytes.len() < aead::NONCE_LEN {
            return None;
        }
        let (nonce, sealed) = bytes.split_at(aead::NONCE_LEN);
        let nonce = aead::Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut sealed = sealed.to_vec();
        let plain = self
            .key()
            .open_in_place(nonce, aead::Aad::empty(), &mut sealed)
            .ok()?;
        String::from_utf8(plain.to_vec()).ok()
    }
}

/// An answer as it is stored for replays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredAnswer {
    pub status: u16,
    pub body: String,
}

/// What a request finds when it takes its key.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyClaim {
    /// First use: go ahead, then finish or release the key.
    Fresh,
    /// The same request finished before: answer this again.
    Replay(StoredAnswer),
    /// The same request is still running.
    InProgress,
    /// The key was used with another body.
    Mismatch,
}

impl KeyClaim {
    /// What a stored record means for `request`.
    fn of_record(record: &records::Model, request: &KeyRequest) -> KeyClaim {
        if record.request_hash != request.request_hash {
            KeyClaim::Mismatch
        } else if record.state == COMPLETED {
            let stored = record.response_body.as_deref().unwrap_or_default();
            match request.seal.open(stored) {
                Some(body) => KeyClaim::Replay(StoredAnswer {
                    status: record.response_status.unwrap_or(200) as u16,
                    body,
                }),
                // Same key and body, another caller's seal: not theirs.
                None => KeyClaim::Mismatch,
            }
        } else {
            KeyClaim::InProgress
        }
    }
}

/// The claim's condition on PostgreSQL: `synchronous_commit` off for the
/// statement's own (implicit) transaction, so its commit does not wait for
/// the disk. PostgreSQL writes WAL in order and every later synchronous
/// commit flushes it up to its own record, so once the request's
/// transaction has committed (the 202 is answered only then) the claim is
/// on disk too. The setting is transaction-local: the pooled connection
/// goes back with it on.
const CLAIM_WITHOUT_FLUSH: &str = "set_config('synchronous_commit', 'off', true) = 'off'";

impl Store {
    /// Takes the keys of a batch of requests, in one statement: a key never
    /// seen (or whose record expired) is recorded IN_PROGRESS and is
    /// `Fresh`; for the others the stored record decides. A key that comes
    /// twice in one batch is `InProgress` the second time.
    ///
    /// On PostgreSQL the claim commits without waiting for its WAL flush
    /// (see [`CLAIM_WITHOUT_FLUSH`]): it is only ever followed by the
    /// request's own transaction, which flushes it with its commit, or by
    /// a release, so a crash can lose a claim only together with the
    /// request it was for, never a claim whose request took effect.
    pub async fn claim_keys(
        &self,
        keys: &[KeyRequest],
        now: EpochMs,
        ttl_ms: i64,
    ) -> StoreResult<Vec<KeyClaim>> {
        let mut claims: Vec<Option<KeyClaim>> = vec![None; keys.len()];
        let mut first: Vec<usize> = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            if first
                .iter()
                .any(|&j| keys[j].scope == k.scope && keys[j].key == k.key)
            {
                claims[i] = Some(KeyClaim::InProgress);
            } else {
                first.push(i);
            }
        }
        if first.is_empty() {
            return Ok(claims.into_iter().flatten().collect());
        }
        let mut values: Vec<Value> = vec![
            now.into(),
            (now + ttl_ms).into(),
            (now + KEY_LEASE_MS).into(),
            (now - INSTANCE_ALIVE_MS).into(),
        ];
        let mut claimed = ValueRows::new(&[SqlType::Text; 5]);
        for &i in &first {
            claimed.push([
                keys[i].scope.clone().into(),
                keys[i].key.clone().into(),
                keys[i].request_hash.clone().into(),
                keys[i].owner.clone().into(),
                keys[i].instance.clone().into(),
            ]);
        }
        let claimed = claimed.source(self.backend(), 5, &mut values);
        let no_flush = match self.backend() {
            DbBackend::Postgres => CLAIM_WITHOUT_FLUSH,
            _ => "true",
        };
        let inserted = self
            .write_returning(self.sql(
                &format!(
                    "WITH v(scope, key, request_hash, owner, instance_id) AS ({claimed}) \
                     INSERT INTO idempotency_records \
                     (scope, key, request_hash, state, response_status, response_body, \
                     created_at_ms, expires_at_ms, owner, locked_until_ms, instance_id) \
                     SELECT v.scope, v.key, v.request_hash, '{IN_PROGRESS}', NULL, NULL, \
                     $1, $2, v.owner, $3, v.instance_id FROM v WHERE {no_flush} \
                     ON CONFLICT (scope, key) DO UPDATE SET request_hash = excluded.request_hash, \
                     state = excluded.state, response_status = NULL, response_body = NULL, \
                     created_at_ms = excluded.created_at_ms, expires_at_ms = excluded.expires_at_ms, \
                     owner = excluded.owner, locked_until_ms = excluded.locked_until_ms, \
                     instance_id = excluded.instance_id \
                     WHERE idempotency_records.expires_at_ms < $1 \
                     OR (idempotency_records.state = '{IN_PROGRESS}' \
                     AND (idempotency_records.locked_until_ms IS NULL \
                     OR idempotency_records.locked_until_ms < $1 \
                     OR (idempotency_records.instance_id IS NOT NULL AND NOT EXISTS \
                     (SELECT 1 FROM instances i WHERE i.id = idempotency_records.instance_id \
                     AND i.seen_at_ms >= $4)))) \
                     RETURNING scope, key"
                ),
                values,
            ))
            .await?;
        let mut fresh = std::collections::HashSet::new();
        for row in &inserted {
            fresh.insert((
                row.try_get_by_index::<String>(0)?,
                row.try_get_by_index::<String>(1)?,
            ));
        }
        let taken: Vec<usize> = first
            .iter()
            .copied()
            .filter(|&i| !fresh.contains(&(keys[i].scope.clone(), keys[i].key.clone())))
            .collect();
        let mut stored = Vec::new();
        if !taken.is_empty() {
            let mut any = Condition::any();
            for &i in &taken {
                any = any.add(
                    Condition::all()
                        .add(records::Column::Scope.eq(keys[i].scope.clone()))
                        .add(records::Column::Key.eq(keys[i].key.clone())),
                );
            }
            stored = records::Entity::find().filter(any).all(self.db()).await?;
        }
        for &i in &first {
            let k = &keys[i];
            claims[i] = Some(if fresh.contains(&(k.scope.clone(), k.key.clone())) {
                KeyClaim::Fresh
            } else {
                match stored.iter().find(|r| r.scope == k.scope && r.key == k.key) {
                    Some(record) => KeyClaim::of_record(record, k),
                    // Taken and purged between our insert and read: the
                    // caller may simply try again.
                    None => KeyClaim::InProgress,
                }
            });
        }
        Ok(claims.into_iter().flatten().collect())
    }

    /// Takes one key (a batch of one).
    pub async fn claim_key(
        &self,
        request: &KeyRequest,
        now: EpochMs,
        ttl_ms: i64,
    ) -> StoreResult<KeyClaim> {
        Ok(self
            .claim_keys(std::slice::from_ref(request), now, ttl_ms)
            .await?
            .pop()
            .unwrap_or(KeyClaim::InProgress))
    }

    /// Stores the answers of finished requests so repeats get them again,
    /// on `conn` (inside the caller's transaction, so the answer commits
    /// with what it reports). Only where the request still owns its record:
    /// one that outlived its lease and was taken over changes nothing.
    pub(crate) async fn finish_keys<C: ConnectionTrait>(
        conn: &C,
        answers: &[(&KeyRequest, &StoredAnswer)],
    ) -> StoreResult<()> {
        if let Some(finish) = Self::finish_keys_statement(conn.get_database_backend(), answers) {
            conn.execute_raw(finish).await?;
        }
        Ok(())
    }

    /// The statement [`finish_keys`](Self::finish_keys) runs (None: no
    /// answers). It touches a key only while its owner still holds it.
    pub(crate) fn finish_keys_statement(
        backend: DbBackend,
        answers: &[(&KeyRequest, &StoredAnswer)],
    ) -> Option<Statement> {
        let mut values = Vec::new();
        let stored = answer_rows(backend, answers, 1, &mut values)?;
        Some(super::sql_for(
            backend,
            &format!(
                "WITH v(scope, key, request_hash, status, body, owner) AS ({stored}) \
                 UPDATE idempotency_records SET state = '{COMPLETED}', \
                 response_status = v.status, response_body = v.body, \
                 owner = NULL, locked_until_ms = NULL FROM v \
                 WHERE idempotency_records.scope = v.scope AND idempotency_records.key = v.key \
                 AND idempotency_records.owner = v.owner \
                 AND idempotency_records.state = '{IN_PROGRESS}'",
            ),
            values,
        ))
    }

    /// Records the answers of requests that never claimed their keys, as
    /// finished at `now` (None: no answers): the claim and the finish in
    /// one write, for requests decided before any claim. A key that has
    /// any record (a repeat, a request still running, an expired record)
    /// is not written: that is for [`claim_keys`](Self::claim_keys) to
    /// decide, so the caller checks that every answer was recorded.
    ///
    /// `WHERE true`: SQLite reads `ON CONFLICT` after `FROM v` as a join
    /// constraint unless the `SELECT` has a `WHERE`.
    pub(crate) fn record_answers_statement(
        backend: DbBackend,
        answers: &[(&KeyRequest, &StoredAnswer)],
        now: EpochMs,
        ttl_ms: i64,
    ) -> Option<Statement> {
        let mut values = vec![now.into(), (now + ttl_ms).into()];
        let stored = answer_rows(backend, answers, 3, &mut values)?;
        Some(super::sql_for(
            backend,
            &format!(
                "WITH v(scope, key, request_hash, status, body, owner) AS ({stored}) \
                 INSERT INTO idempotency_records \
                 (scope, key, request_hash, state, response_status, response_body, \
                 created_at_ms, expires_at_ms, owner, locked_until_ms, instance_id) \
                 SELECT v.scope, v.key, v.request_hash, '{COMPLETED}', v.status, v.body, \
                 $1, $2, NULL, NULL, NULL FROM v \
                 WHERE true ON CONFLICT (scope, key) DO NOTHING",
            ),
            values,
        ))
    }

    /// Stores one answer (its own transaction).
    pub async fn finish_key(&self, key: &KeyRequest, answer: &StoredAnswer) -> StoreResult<()> {
        let tx = self.write_tx().await?;
        Self::finish_keys(&*tx, &[(key, answer)]).await?;
        tx.commit().await?;
        Ok(())
    }

    /// A request still running renews its key's lease (to `now` +
    /// [`KEY_LEASE_MS`]) while it still owns it; false when it no longer
    /// does (it outlived its lease and was taken over, or it finished).
    pub async fn renew_key(&self, key: &KeyRequest, now: EpochMs) -> StoreResult<bool> {
        let renewed = self
            .write_one(self.sql(
                &format!(
                    "UPDATE idempotency_records SET locked_until_ms = $4 \
                     WHERE scope = $1 AND key = $2 AND owner = $3 AND state = '{IN_PROGRESS}'"
                ),
                vec![
                    key.scope.clone().into(),
                    key.key.clone().into(),
                    key.owner.clone().into(),
                    (now + KEY_LEASE_MS).into(),
                ],
            ))
            .await?;
        Ok(renewed == 1)
    }

    /// Forgets keys whose requests failed in a way worth retrying (5xx, or
    /// an answer about the moment rather than the request), while they
    /// still own them.
    pub async fn release_keys(&self, keys: &[&KeyRequest]) -> StoreResult<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let mut any = Condition::any();
        for key in keys {
            any = any.add(
                Condition::all()
                    .add(records::Column::Scope.eq(key.scope.clone()))
                    .add(records::Column::Key.eq(key.key.clone()))
                    .add(records::Column::Owner.eq(key.owner.clone())),
            );
        }
        let tx = self.write_tx().await?;
        records::Entity::delete_many()
            .filter(records::Column::State.eq(IN_PROGRESS))
            .filter(any)
            .exec(&*tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Deletes up to `limit` records that expired before `now`, in one
    /// short statement (a cleanup round calls it until fewer come back, a
    /// bounded number of times), so a day's worth of keys never becomes one
    /// long delete.
    pub async fn purge_expired_keys(&self, now: EpochMs, limit: u64) -> StoreResult<u64> {
        self.write_one(self.sql(
            "DELETE FROM idempotency_records WHERE (scope, key) IN \
             (SELECT scope, key FROM idempotency_records WHERE expires_at_ms < $1 LIMIT $2)",
            vec![now.into(), (limit as i64).into()],
        ))
        .await
    }
}

/// The rows of `answers` as a row source of (scope, key, request_hash,
/// status, body, owner), each body sealed, its placeholders numbered from
/// `first` (None: no answers).
fn answer_rows(
    backend: DbBackend,
    answers: &[(&KeyRequest, &StoredAnswer)],
    first: usize,
    values: &mut Vec<Value>,
) -> Option<String> {
    if answers.is_empty() {
        return None;
    }
    let mut rows = ValueRows::new(&[
        SqlType::Text,
        SqlType::Text,
        SqlType::Text,
        SqlType::Int,
        SqlType::Text,
        SqlType::Text,
    ]);
    for (key, answer) in answers {
        rows.push([
            key.scope.clone().into(),
            key.key.clone().into(),
            key.request_hash.clone().into(),
            (answer.status as i32).into(),
            key.seal.seal(&answer.body).into(),
            key.owner.clone().into(),
        ]);
    }
    Some(rows.source(backend, first, values))
}
