//! Display presence and acknowledgements, cluster-wide: one row per
//! connected display socket (`terminal_presence`), whichever instance holds
//! it, and the highest `seq` each terminal's displays acknowledged
//! (`terminals.acked_seq`). Both only ever move forward.

use std::collections::BTreeMap;

use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter};

use super::entities::terminal_presence;
use super::{Store, StoreResult};
use crate::domain::policy::EpochMs;

/// A terminal as operators see it: its displays, where they are connected,
/// and how far they got.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct TerminalView {
    #[schema(format = Uuid)]
    pub terminal_id: String,
    pub name: String,
    /// The experience's slug.
    pub experience: String,
    /// At least one display is connected (seen recently by its instance).
    pub online: bool,
    /// Connected displays.
    pub displays: usize,
    /// The instances holding them.
    pub instances: Vec<String>,
    /// When the longest-connected display connected.
    #[serde(
        rename = "connected_since",
        serialize_with = "crate::clock::serialize_rfc3339_opt"
    )]
    #[schema(value_type = Option<String>, format = DateTime, required = true)]
    pub connected_since_ms: Option<EpochMs>,
    /// The terminal's newest numbered event.
    pub last_seq: i64,
    /// The highest `seq` a display acknowledged.
    pub acked_seq: i64,
    /// Events delivered to a connected display and not acknowledged yet.
    pub unacked: i64,
}

impl Store {
    /// A display socket connected on `instance_id`.
    pub async fn display_connected(
        &self,
        socket_id: &str,
        terminal_id: &str,
        instance_id: &str,
        after: i64,
        now: EpochMs,
    ) -> StoreResult<()> {
        let tx = self.write_tx().await?;
        tx.execute_raw(self.sql(
            "INSERT INTO terminal_presence \
             (socket_id, terminal_id, instance_id, connected_at_ms, seen_at_ms, sent_seq, acked_seq) \
             VALUES ($1, $2, $3, $4, $4, $5, $5)",
            vec![
                socket_id.into(),
                terminal_id.into(),
                instance_id.into(),
                now.into(),
                after.into(),
            ],
        ))
        .await?;
        // Resuming after `after` says the display has shown everything up
        // to it: its last acks may have died with the instance it was on
        // (progress is written at most once a second), so the terminal's
        // acked seq catches up here, never past its last seq.
        tx.execute_raw(self.sql(
            "UPDATE terminals SET acked_seq = CASE WHEN last_seq < $2 THEN last_seq ELSE $2 END \
             WHERE id = $1 AND acked_seq < $2 AND acked_seq < last_seq",
            vec![terminal_id.into(), after.into()],
        ))
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// What a display socket sent and what its display acknowledged, and
    /// the terminal's highest acknowledged `seq`, written together (one
    /// statement on PostgreSQL).
    /// Neither ever goes down: an older report that lands late changes
    /// nothing.
    pub async fn display_progress(
        &self,
        socket_id: &str,
        terminal_id: &str,
        sent_seq: i64,
        acked_seq: i64,
        now: EpochMs,
    ) -> StoreResult<()> {
        self.write_together(vec![
            self.sql(
                "UPDATE terminal_presence SET seen_at_ms = $2, \
                 sent_seq = CASE WHEN sent_seq < $3 THEN $3 ELSE sent_seq END, \
                 acked_seq = CASE WHEN acked_seq < $4 THEN $4 ELSE acked_seq END \
                 WHERE socket_id = $1",
                vec![
                    socket_id.into(),
                    now.into(),
                    sent_seq.into(),
                    acked_seq.into(),
                ],
            ),
            self.sql(
                "UPDATE terminals SET acked_seq = $2 WHERE id = $1 AND acked_seq < $2",
                vec![terminal_id.into(), acked_seq.into()],
            ),
        ])
        .await?;
        Ok(())
    }

    /// A display socket closed.
    pub async fn display_disconnected(&self, socket_id: &str) -> StoreResult<()> {
        let tx = self.write_tx().await?;
        terminal_presence::Entity::delete_by_id(socket_id.to_owned())
            .exec(&*tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The instance is alive: every display row it holds is seen now.
    pub async fn refresh_presence(&self, instance_id: &str, now: EpochMs) -> StoreResult<u64> {
        self.write_one(self.sql(
            "UPDATE terminal_presence SET seen_at_ms = $2 WHERE instance_id = $1",
            vec![instance_id.into(), now.into()],
        ))
        .await
    }

    /// Deletes the rows of displays not seen since `before` (their instance
    /// died without closing them); returns how many.
    pub async fn purge_stale_presence(&self, before: EpochMs) -> StoreResult<u64> {
        let tx = self.write_tx().await?;
        let n = terminal_presence::Entity::delete_many()
            .filter(terminal_presence::Column::SeenAtMs.lt(before))
            .exec(&*tx)
            .await?
            .rows_affected;
        tx.commit().await?;
        Ok(n)
    }

    /// Every terminal (of the experience `slug`, when given) with its
    /// displays seen since `seen_since`, by experience and name.
    pub async fn terminal_views(
        &self,
        slug: Option<&str>,
        seen_since: EpochMs,
    ) -> StoreResult<Vec<TerminalView>> {
        let mut values = vec![seen_since.into()];
        let filter = match slug {
            Some(slug) => {
                values.push(slug.into());
                "WHERE e.slug = $2"
            }
            None => "",
        };
        let rows = self
            .db()
            .query_all_raw(self.sql(
                &format!(
                    "SELECT t.id, t.name, e.slug, t.last_seq, t.acked_seq, \
                     p.instance_id, p.connected_at_ms, p.sent_seq \
                     FROM terminals t JOIN experiences e ON e.id = t.experience_id \
                     LEFT JOIN terminal_presence p ON p.terminal_id = t.id AND p.seen_at_ms >= $1 \
                     {filter} ORDER BY e.slug, t.name, t.id"
                ),
                values,
            ))
            .await?;
        let mut views: BTreeMap<(String, String, String), (TerminalView, i64)> = BTreeMap::new();
        for row in &rows {
            let id: String = row.try_get_by_index(0)?;
            let name: String = row.try_get_by_index(1)?;
            let experience: String = row.try_get_by_index(2)?;
            let (view, sent) = views
                .entry((experience.clone(), name.clone(), id.clone()))
                .or_insert_with(|| {
                    (
                        TerminalView {
                            terminal_id: id,
                            name,
                            experience,
                            online: false,
                            displays: 0,
                            instances: Vec::new(),
                            connected_since_ms: None,
                            last_seq: 0,
                            acked_seq: 0,
                            unacked: 0,
                        },
                        0,
                    )
                });
            view.last_seq = row.try_get_by_index(3)?;
            view.acked_seq = row.try_get_by_index(4)?;
            if let Some(instance) = row.try_get_by_index::<Option<String>>(5)? {
                view.online = true;
                view.displays += 1;
                if !view.instances.contains(&instance) {
                    view.instances.push(instance);
                }
                let since: i64 = row.try_get_by_index(6)?;
                view.connected_since_ms =
                    Some(view.connected_since_ms.map_or(since, |s| s.min(since)));
                *sent = (*sent).max(row.try_get_by_index::<i64>(7)?);
            }
        }
        Ok(views
            .into_values()
            .map(|(mut view, sent)| {
                view.unacked = (sent - view.acked_seq).max(0);
                view
            })
            .collect())
    }
}

/// One terminal's connected displays, as the lag needs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DisplayPositions {
    pub terminal_id: String,
    /// The experience's slug.
    pub experience: String,
    /// The terminal's newest numbered event.
    pub last_seq: i64,
    /// The lowest acked seq among its connected displays.
    pub slowest_acked: i64,
    /// Its displays connected to this instance.
    pub here: i64,
}

impl DisplayPositions {
    pub fn lag(&self) -> i64 {
        (self.last_seq - self.slowest_acked).max(0)
    }
}

impl Store {
    /// The terminals with a display seen since `seen_since`, one row each
    /// (for the outbox lag of `/metrics`).
    pub async fn display_positions(
        &self,
        instance_id: &str,
        seen_since: EpochMs,
    ) -> StoreResult<Vec<DisplayPositions>> {
        let rows = self
            .db()
            .query_all_raw(self.sql(
                "SELECT t.id, e.slug, t.last_seq, MIN(p.acked_seq), \
             SUM(CASE WHEN p.instance_id = $2 THEN 1 ELSE 0 END) \
             FROM terminal_presence p JOIN terminals t ON t.id = p.terminal_id \
             JOIN experiences e ON e.id = t.experience_id \
             WHERE p.seen_at_ms >= $1 GROUP BY t.id, e.slug, t.last_seq ORDER BY t.id",
                vec![seen_since.into(), instance_id.into()],
            ))
            .await?;
        rows.iter()
            .map(|r| {
                Ok(DisplayPositions {
                    terminal_id: r.try_get_by_index(0)?,
                    experience: r.try_get_by_index(1)?,
                    last_seq: r.try_get_by_index(2)?,
                    slowest_acked: r.try_get_by_index(3)?,
                    here: r.try_get_by_index(4)?,
                })
            })
            .collect::<Result<_, sea_orm::DbErr>>()
            .map_err(Into::into)
    }
}

/// An instance not seen for this long is dead (it renews its row every
/// second; one that shuts down deletes it at once).
pub const INSTANCE_ALIVE_MS: i64 = 5_000;

impl Store {
    /// This instance is alive at `now`; the number of live instances
    /// (PostgreSQL: the instances sharing the database). Also forgets
    /// instances dead for an hour.
    pub async fn instance_alive(&self, instance_id: &str, now: EpochMs) -> StoreResult<usize> {
        self.write_one(self.sql(
            "INSERT INTO instances (id, started_at_ms, seen_at_ms) VALUES ($1, $2, $2) \
             ON CONFLICT (id) DO UPDATE SET seen_at_ms = excluded.seen_at_ms",
            vec![instance_id.into(), now.into()],
        ))
        .await?;
        self.write_one(self.sql(
            "DELETE FROM instances WHERE seen_at_ms < $1",
            vec![(now - 3_600_000).into()],
        ))
        .await?;
        let row = self
            .db()
            .query_one_raw(self.sql(
                "SELECT COUNT(*) FROM instances WHERE seen_at_ms >= $1",
                vec![(now - INSTANCE_ALIVE_MS).into()],
            ))
            .await?;
        let live = row
            .map(|r| r.try_get_by_index::<i64>(0))
            .transpose()?
            .unwrap_or(1);
        Ok(live.max(1) as usize)
    }

    /// How many instances other than `instance_id` are alive at `now`
    /// (seen within [`INSTANCE_ALIVE_MS`]).
    pub async fn other_live_instances(&self, instance_id: &str, now: EpochMs) -> StoreResult<i64> {
        let row = self
            .db()
            .query_one_raw(self.sql(
                "SELECT COUNT(*) FROM instances WHERE seen_at_ms >= $1 AND id <> $2",
                vec![(now - INSTANCE_ALIVE_MS).into(), instance_id.into()],
            ))
            .await?;
        Ok(row
            .map(|r| r.try_get_by_index::<i64>(0))
            .transpose()?
            .unwrap_or(0))
    }

    /// This instance stops: it is dead from now on.
    pub async fn instance_gone(&self, instance_id: &str) -> StoreResult<()> {
        self.write_one(self.sql(
            "DELETE FROM instances WHERE id = $1",
            vec![instance_id.into()],
        ))
        .await?;
        Ok(())
    }
}
