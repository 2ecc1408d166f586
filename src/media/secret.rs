//! The server's own secret, which media URLs are signed under
//! (`domain::media::ServerSecret`): read from its file, or made into it
//! (mode 0600) the first time; and the check, at start, that the
//! instances of one database have the same one. The database keeps only
//! the secret's fingerprint, never the secret: a copy of the database
//! signs nothing.

use std::io::Write;
use std::path::Path;

use crate::domain::media::ServerSecret;
use crate::domain::policy::EpochMs;
use crate::store::{Store, StoreError};

/// The `server_keys` row that holds the fingerprint of the instances'
/// secret.
pub const FINGERPRINT: &str = "server_secret_fingerprint";

/// Why the server's secret cannot be had, or is not the other instances'.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("the server secret file {path}: {source}")]
    File {
        path: String,
        source: std::io::Error,
    },
    #[error("the server secret file {path}: {reason}")]
    Invalid { path: String, reason: String },
    #[error(
        "this instance's server secret differs from the one the other live instances of this \
         database use, so the photo URLs each signs would be refused by the others: give every \
         instance the same STAGEHAND_SECRET or STAGEHAND_SECRET_FILE (to change the secret, stop \
         every instance first)"
    )]
    Disagrees,
    #[error("checking the server secret: {0}")]
    Store(#[from] StoreError),
}

/// The secret in the file at `path`, or a new random one written there
/// (readable by its owner only) when there is no file yet. Two instances
/// that start at once on one folder read the same secret: the file is
/// written whole under another name and then linked into place, which
/// fails for the second, who then reads the first's.
pub fn read_or_make(path: &Path) -> Result<ServerSecret, SecretError> {
    let shown = || path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => {
            warn_when_others_may_read(path);
            ServerSecret::new(&text).map_err(|reason| SecretError::Invalid {
                path: shown(),
                reason,
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => make(path),
        Err(source) => Err(SecretError::File {
            path: shown(),
            source,
        }),
    }
}

/// Writes a new secret to `path` (see [`read_or_make`]).
fn make(path: &Path) -> Result<ServerSecret, SecretError> {
    let file_error = |source| SecretError::File {
        path: path.display().to_string(),
        source,
    };
    let mut random = [0u8; 32];
    rand::fill(&mut random);
    let secret = ServerSecret::from_random(random);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "stagehand.secret".to_owned());
    let staged = path.with_file_name(format!(".{name}.{}", crate::store::new_id()));
    let written = owner_only_file(&staged)
        .and_then(|mut file| {
            file.write_all(format!("{}\n", secret.expose()).as_bytes())?;
            file.sync_all()
        })
        .and_then(|()| std::fs::hard_link(&staged, path));
    let _ = std::fs::remove_file(&staged);
    match written {
        Ok(()) => {
            tracing::info!(file = %path.display(), "made the server secret (signs media URLs; keep this file out of database copies, and give every instance of one database the same one)");
            Ok(secret)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => read_or_make(path),
        Err(e) => Err(file_error(e)),
    }
}

/// A new file at `path` only its owner may read.
fn owner_only_file(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)
}

/// Says so when the secret file is readable by other users.
fn warn_when_others_may_read(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(path) {
            if meta.permissions().mode() & 0o077 != 0 {
                tracing::warn!(file = %path.display(), "the server secret file may be read by other users: chmod 600 it");
            }
        }
    }
}

/// Checks that `secret` is the one this database's other live instances
/// use (their fingerprint is in `server_keys`). The first instance records
/// its own. On PostgreSQL, a different one while another instance is
/// alive is [`SecretError::Disagrees`]: this instance says it is alive
/// before it looks, so of two that start at once with different secrets
/// the second to look sees the first. With none alive (and on SQLite, one
/// process by construction) the secret was changed on purpose, or its
/// file lost: the new one is recorded, and URLs signed under the old one
/// are refused from now on.
pub async fn check_agreement(
    store: &Store,
    secret: &ServerSecret,
    instance_id: &str,
    now: EpochMs,
) -> Result<(), SecretError> {
    let ours = secret.fingerprint();
    if store.is_postgres() {
        store.instance_alive(instance_id, now).await?;
    }
    let recorded = store.server_key(FINGERPRINT, &ours).await?;
    if recorded == ours {
        return Ok(());
    }
    if store.is_postgres() && store.other_live_instances(instance_id, now).await? > 0 {
        store.instance_gone(instance_id).await?;
        return Err(SecretError::Disagrees);
    }
    store.replace_server_key(FINGERPRINT, &ours).await?;
    tracing::warn!("the server secret is not the one this database was last used with: photo URLs signed before are refused from now on");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_file_is_made_once_for_its_owner_and_read_back() {
        let dir = tempfile::tempdir().expect("a folder");
        let path = dir.path().join("stagehand.secret");
        let made = read_or_make(&path).expect("made");
        assert_eq!(read_or_make(&path).expect("read"), made);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no staged file left behind");
        std::fs::write(&path, "short").unwrap();
        assert!(matches!(
            read_or_make(&path),
            Err(SecretError::Invalid { .. })
        ));
    }
}
