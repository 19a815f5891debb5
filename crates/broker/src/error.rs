//! The broker's error type. Wire errors are Kafka `ErrorCode`s chosen at the edge; this
//! enum is for start-up and environmental failures.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("configuration: {0}")]
    Config(String),
    #[error("i/o on {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("metadata store: {0}")]
    Metadata(String),
    #[error("storage: {0}")]
    Storage(#[from] rill_storage::StorageError),
    /// Another process holds the data directory's lock (see `data_dir_lock`).
    #[error("{}", data_dir_locked(dir, *pid))]
    DataDirLocked { dir: String, pid: Option<u32> },
    /// The broker is closing its logs and opens no more.
    #[error("the broker is shutting down")]
    ShuttingDown,
    /// The partition's log directory failed: it is offline on this broker (KIP-858).
    #[error("log directory {0} is offline")]
    LogDirOffline(String),
}

impl BrokerError {
    pub fn io(path: impl std::fmt::Display, source: io::Error) -> Self {
        Self::Io {
            path: path.to_string(),
            source,
        }
    }
}

fn data_dir_locked(dir: &str, pid: Option<u32>) -> String {
    let holder = match pid {
        Some(pid) => format!("another process (pid {pid})"),
        None => "another process".to_string(),
    };
    format!(
        "data directory {dir} is locked by {holder}: a data directory belongs to one \
         server at a time; stop that one or give this one another --data-dir"
    )
}
