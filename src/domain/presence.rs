//! When a display counts as present: the hub refreshes its displays'
//! presence rows every [`PRESENCE_REFRESH`], and a row not refreshed for
//! [`PRESENCE_STALE_MS`] belongs to an instance that died. The hub, the
//! cleanup, the operators' views and the metrics all read it from here.

use std::time::Duration;

/// How often an instance tells the database its displays are still
/// connected. A presence row not seen for three times this is offline.
pub const PRESENCE_REFRESH: Duration = Duration::from_secs(10);
/// A presence row not refreshed for this long belongs to an instance that
/// died: operators see the display offline and cleanup deletes the row.
pub const PRESENCE_STALE_MS: i64 = 3 * PRESENCE_REFRESH.as_millis() as i64;
