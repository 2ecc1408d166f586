//! Operator accounts (`operators`): each a name, a role and the digest of
//! its token. [`Store::operator_by_token`] is read on every operator
//! request, so a revoked token is refused on the next request on every
//! instance. Creating and revoking one writes its audit record in the
//! same transaction.

use sea_orm::{ConnectionTrait, Value};

use super::audit::record;
use super::{new_id, Store, StoreResult};
use crate::domain::audit::AuditEntry;
use crate::domain::keys::token_hash;
use crate::domain::policy::EpochMs;
use crate::domain::roles::{Operator, Role};

/// An operator account as the list shows it (never its token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorAccount {
    pub id: String,
    pub name: String,
    pub role: Role,
    pub created_at_ms: EpochMs,
    /// The name of who created it.
    pub created_by: String,
    pub revoked_at_ms: Option<EpochMs>,
}

const FIELDS: &str = "id, name, role, created_at_ms, created_by, revoked_at_ms";

fn account(r: &sea_orm::QueryResult) -> StoreResult<OperatorAccount> {
    let role: String = r.try_get_by_index(2)?;
    Ok(OperatorAccount {
        id: r.try_get_by_index(0)?,
        name: r.try_get_by_index(1)?,
        role: role
            .parse()
            .map_err(|e| super::StoreError::Corrupt(format!("operator role {role:?}: {e}")))?,
        created_at_ms: r.try_get_by_index(3)?,
        created_by: r.try_get_by_index(4)?,
        revoked_at_ms: r.try_get_by_index(5)?,
    })
}

impl OperatorAccount {
    pub fn operator(&self) -> Operator {
        Operator {
            id: Some(self.id.clone()),
            name: self.name.clone(),
            role: self.role,
        }
    }
}

impl Store {
    /// The operator whose token this is, unless unknown or revoked.
    pub async fn operator_by_token(&self, token: &str) -> StoreResult<Option<Operator>> {
        let row = self
            .db()
            .query_one_raw(self.sql(
                &format!(
                    "SELECT {FIELDS} FROM operators WHERE token_hash = $1 AND revoked_at_ms IS NULL"
                ),
                vec![token_hash(token).into()],
            ))
            .await?;
        row.map(|r| account(&r).map(|a| a.operator())).transpose()
    }

    /// Whether operator `id` exists and is not revoked.
    pub async fn operator_active(&self, id: &str) -> StoreResult<bool> {
        let row = self
            .db()
            .query_one_raw(self.sql(
                "SELECT 1 FROM operators WHERE id = $1 AND revoked_at_ms IS NULL",
                vec![id.into()],
            ))
            .await?;
        Ok(row.is_some())
    }

    /// A new operator with `token` (kept only as its digest), created by
    /// `audit.operator`, recorded in the same transaction.
    pub async fn create_operator(
        &self,
        name: &str,
        role: Role,
        token: &str,
        audit: AuditEntry,
        now: EpochMs,
    ) -> StoreResult<OperatorAccount> {
        let created = OperatorAccount {
            id: new_id(),
            name: name.to_owned(),
            role,
            created_at_ms: now,
            created_by: audit.operator.name.clone(),
            revoked_at_ms: None,
        };
        let values: Vec<Value> = vec![
            created.id.clone().into(),
            created.name.clone().into(),
            role.as_str().into(),
            token_hash(token).into(),
            now.into(),
            created.created_by.clone().into(),
        ];
        let tx = self.write_tx().await?;
        tx.execute_raw(self.sql(
            "INSERT INTO operators (id, name, role, token_hash, created_at_ms, created_by) \
             VALUES ($1, $2, $3, $4, $5, $6)",
            values,
        ))
        .await?;
        let audit = AuditEntry {
            target: format!("operator:{}", created.id),
            ..audit
        };
        record(&*tx, &audit, now).await?;
        tx.commit().await?;
        Ok(created)
    }

    /// Every operator account, oldest first.
    pub async fn operator_accounts(&self) -> StoreResult<Vec<OperatorAccount>> {
        let rows = self
            .db()
            .query_all_raw(self.sql(
                &format!("SELECT {FIELDS} FROM operators ORDER BY created_at_ms, id"),
                vec![],
            ))
            .await?;
        rows.iter().map(account).collect()
    }

    /// Revokes operator `id` (recorded with `audit` in the same
    /// transaction when it was not revoked yet); the account as it stands,
    /// None when there is no such operator.
    pub async fn revoke_operator(
        &self,
        id: &str,
        audit: &AuditEntry,
        now: EpochMs,
    ) -> StoreResult<Option<OperatorAccount>> {
        let tx = self.write_tx().await?;
        let revoked = tx
            .execute_raw(self.sql(
                "UPDATE operators SET revoked_at_ms = $1 WHERE id = $2 AND revoked_at_ms IS NULL",
                vec![now.into(), id.into()],
            ))
            .await?
            .rows_affected();
        let row = tx
            .query_one_raw(self.sql(
                &format!("SELECT {FIELDS} FROM operators WHERE id = $1"),
                vec![id.into()],
            ))
            .await?;
        let revoked_now = match (&row, revoked) {
            (Some(r), 1) => Some(account(r)?),
            _ => None,
        };
        if let Some(account) = revoked_now {
            let audit = audit
                .clone()
                .detail(format!("{} ({})", account.name, account.role));
            record(&*tx, &audit, now).await?;
        }
        tx.commit().await?;
        row.map(|r| account(&r)).transpose()
    }
}
