//! The remote store (Kafka's `RemoteStorageManager`): an S3-compatible bucket through the
//! `object_store` crate. It copies a segment's files, fetches one of them back to a local
//! file, and deletes a segment's objects or a whole topic's.
//!
//! Objects are named `<prefix><topic>-<topic id>/<partition>/<start offset, 20 digits>-
//! <segment id>.<suffix>`, one per file of the copy (`log`, `index`, `timeindex`,
//! `txnindex`, `snapshot`, `leader-epoch-checkpoint`): a copy is never overwritten by
//! another (each attempt has a new segment id), so an upload retried after any failure
//! is idempotent, and a half-finished one is a set of objects no metadata names as
//! finished, deleted by the next leader (see `rill_metadata::remote_log`).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig};
use rill_protocol::Uuid;
use rill_storage::RemoteCopyCandidate;
use tokio::io::AsyncWriteExt;

use crate::config::BrokerConfig;
use crate::error::BrokerError;

/// Files up to this size go in one PUT; larger ones as a multipart upload of parts of
/// this size, at most [`UPLOAD_PARTS_IN_FLIGHT`] at a time (bounds the memory an upload
/// takes whatever `segment.bytes` is).
const UPLOAD_PART_BYTES: usize = 16 * 1024 * 1024;
const UPLOAD_PARTS_IN_FLIGHT: usize = 2;

/// A store request that takes longer than this fails (and is retried by the task that
/// made it, with backoff): a store that hangs never holds a task forever.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What went wrong with the store: the message of `object_store`'s error.
#[derive(Debug, thiserror::Error)]
pub enum RemoteStorageError {
    #[error("remote store: {0}")]
    Store(#[from] object_store::Error),
    #[error("remote copy i/o on {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// The store's settings: `remote.log.storage.s3.*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteStorageConfig {
    pub bucket: String,
    pub prefix: String,
    /// An S3-compatible store's URL (`http://127.0.0.1:9000`); AWS's when unset.
    pub endpoint: Option<String>,
    pub region: String,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
}

impl RemoteStorageConfig {
    /// The store's settings when `remote.log.storage.system.enable` is on, `None` when it
    /// is off; a bucket is required then.
    pub fn from_config(config: &BrokerConfig) -> Result<Option<Self>, BrokerError> {
        if !config.parse::<bool>("remote.log.storage.system.enable")? {
            return Ok(None);
        }
        let get = |k: &str| {
            config
                .get(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let bucket = get("remote.log.storage.s3.bucket").ok_or_else(|| {
            BrokerError::Config(
                "remote.log.storage.system.enable is on but remote.log.storage.s3.bucket is \
                 not set"
                    .into(),
            )
        })?;
        let mut prefix = get("remote.log.storage.s3.prefix").unwrap_or_default();
        if !prefix.is_empty() && !prefix.ends_with('/') {
            prefix.push('/');
        }
        Ok(Some(Self {
            bucket,
            prefix,
            endpoint: get("remote.log.storage.s3.endpoint"),
            region: get("remote.log.storage.s3.region").unwrap_or_else(|| "us-east-1".into()),
            access_key_id: get("remote.log.storage.s3.access.key.id"),
            secret_access_key: get("remote.log.storage.s3.secret.access.key"),
        }))
    }
}

/// Where a partition's objects live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemotePartition {
    pub topic: String,
    pub topic_id: Uuid,
    pub partition: i32,
}

/// The files of one copy, by the suffix of their object's name.
pub const LOG: &str = "log";
pub const OFFSET_INDEX: &str = "index";
pub const TIME_INDEX: &str = "timeindex";
pub const TXN_INDEX: &str = "txnindex";
pub const PRODUCER_SNAPSHOT: &str = "snapshot";
pub const LEADER_EPOCH_CHECKPOINT: &str = "leader-epoch-checkpoint";
const ALL_SUFFIXES: [&str; 6] = [
    LOG,
    OFFSET_INDEX,
    TIME_INDEX,
    TXN_INDEX,
    PRODUCER_SNAPSHOT,
    LEADER_EPOCH_CHECKPOINT,
];

pub struct RemoteStorageManager {
    store: Arc<dyn ObjectStore>,
    prefix: String,
}

impl std::fmt::Debug for RemoteStorageManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteStorageManager")
            .field("store", &self.store.to_string())
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl RemoteStorageManager {
    /// The S3 store `config` names. Nothing is sent until the first request.
    pub fn new(config: &RemoteStorageConfig) -> Result<Self, BrokerError> {
        // reqwest's rustls takes the process's default provider: ring, as the listeners.
        let _ = rustls::crypto::ring::default_provider().install_default();
        // Credentials and settings of the environment (`AWS_*`, as the AWS SDKs read
        // them), overridden by what the broker config sets.
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(&config.bucket)
            .with_region(&config.region)
            .with_client_options(
                ClientOptions::new()
                    .with_timeout(REQUEST_TIMEOUT)
                    .with_connect_timeout(CONNECT_TIMEOUT),
            )
            // Retries are the tasks' (with `remote.log.manager.task.retry.backoff.*`):
            // one quick retry here for a dropped connection, no minutes-long loop.
            .with_retry(RetryConfig {
                max_retries: 1,
                retry_timeout: Duration::from_secs(10),
                ..Default::default()
            });
        if let Some(endpoint) = &config.endpoint {
            b = b
                .with_endpoint(endpoint)
                .with_allow_http(endpoint.starts_with("http://"));
        }
        if let (Some(id), Some(secret)) = (&config.access_key_id, &config.secret_access_key) {
            b = b.with_access_key_id(id).with_secret_access_key(secret);
        }
        let store = b
            .build()
            .map_err(|e| BrokerError::Config(format!("remote.log.storage.s3.*: {e}")))?;
        Ok(Self {
            store: Arc::new(store),
            prefix: config.prefix.clone(),
        })
    }

    /// A store of the caller's (tests).
    #[cfg(test)]
    pub fn with_store(store: Arc<dyn ObjectStore>, prefix: &str) -> Self {
        Self {
            store,
            prefix: prefix.to_string(),
        }
    }

    fn partition_prefix(&self, p: &RemotePartition) -> String {
        format!("{}{}-{}/{}/", self.prefix, p.topic, p.topic_id, p.partition)
    }

    /// The object of one file of a copy.
    pub fn object(
        &self,
        p: &RemotePartition,
        start_offset: i64,
        segment_id: Uuid,
        suffix: &str,
    ) -> ObjectPath {
        ObjectPath::from(format!(
            "{}{start_offset:020}-{segment_id}.{suffix}",
            self.partition_prefix(p)
        ))
    }

    /// Uploads every file of `c` as the copy `segment_id`; returns the bytes sent. The
    /// `.log` goes last, so that a copy whose log object exists is whole (the metadata
    /// says so anyway: only COPY_SEGMENT_FINISHED is read).
    pub async fn copy_log_segment_data(
        &self,
        p: &RemotePartition,
        segment_id: Uuid,
        c: &RemoteCopyCandidate,
        leader_epoch_checkpoint: Bytes,
    ) -> Result<u64, RemoteStorageError> {
        let mut sent = 0;
        let object = |suffix| self.object(p, c.base_offset, segment_id, suffix);
        for (suffix, file) in [
            (OFFSET_INDEX, Some(&c.offset_index_file)),
            (TIME_INDEX, Some(&c.time_index_file)),
            (TXN_INDEX, c.txn_index_file.as_ref()),
            (PRODUCER_SNAPSHOT, c.producer_snapshot_file.as_ref()),
        ] {
            if let Some(file) = file {
                sent += self.upload_file(&object(suffix), file).await?;
            }
        }
        sent += leader_epoch_checkpoint.len() as u64;
        self.store
            .put(
                &object(LEADER_EPOCH_CHECKPOINT),
                PutPayload::from(leader_epoch_checkpoint),
            )
            .await?;
        sent += self.upload_file(&object(LOG), &c.log_file).await?;
        Ok(sent)
    }

    async fn upload_file(&self, to: &ObjectPath, file: &Path) -> Result<u64, RemoteStorageError> {
        let io = |e| RemoteStorageError::Io {
            path: file.display().to_string(),
            source: e,
        };
        let mut f = tokio::fs::File::open(file).await.map_err(io)?;
        let len = f.metadata().await.map_err(io)?.len();
        if len <= UPLOAD_PART_BYTES as u64 {
            let mut buf = Vec::with_capacity(len as usize);
            tokio::io::AsyncReadExt::read_to_end(&mut f, &mut buf)
                .await
                .map_err(io)?;
            self.store.put(to, PutPayload::from(buf)).await?;
            return Ok(len);
        }
        let upload = self.store.put_multipart(to).await?;
        let mut writer =
            object_store::WriteMultipart::new_with_chunk_size(upload, UPLOAD_PART_BYTES);
        let mut buf = vec![0u8; UPLOAD_PART_BYTES];
        let mut sent = 0u64;
        loop {
            let n = match tokio::io::AsyncReadExt::read(&mut f, &mut buf).await {
                Ok(n) => n,
                Err(e) => {
                    let _ = writer.abort().await;
                    return Err(io(e));
                }
            };
            if n == 0 {
                break;
            }
            if let Err(e) = writer.wait_for_capacity(UPLOAD_PARTS_IN_FLIGHT).await {
                let _ = writer.abort().await;
                return Err(e.into());
            }
            writer.write(&buf[..n]);
            sent += n as u64;
        }
        writer.finish().await?;
        Ok(sent)
    }

    /// Downloads one file of a copy into `dest` (written whole, then renamed into place);
    /// `Ok(false)` when the store has no such object (an optional file of the copy).
    pub async fn fetch_to_file(
        &self,
        p: &RemotePartition,
        start_offset: i64,
        segment_id: Uuid,
        suffix: &str,
        dest: &Path,
    ) -> Result<bool, RemoteStorageError> {
        let object = self.object(p, start_offset, segment_id, suffix);
        let got = match self.store.get(&object).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        let tmp = dest.with_extension(format!("{suffix}.download"));
        let io = |e| RemoteStorageError::Io {
            path: tmp.display().to_string(),
            source: e,
        };
        let mut out = tokio::fs::File::create(&tmp).await.map_err(io)?;
        let mut stream = got.into_stream();
        while let Some(chunk) = stream.next().await {
            out.write_all(&chunk?).await.map_err(io)?;
        }
        out.flush().await.map_err(io)?;
        drop(out);
        tokio::fs::rename(&tmp, dest)
            .await
            .map_err(|e| RemoteStorageError::Io {
                path: dest.display().to_string(),
                source: e,
            })?;
        Ok(true)
    }

    /// One small file of a copy in memory (the leader-epoch checkpoint, the producer
    /// snapshot); `None` when the copy has none.
    pub async fn fetch_bytes(
        &self,
        p: &RemotePartition,
        start_offset: i64,
        segment_id: Uuid,
        suffix: &str,
    ) -> Result<Option<Bytes>, RemoteStorageError> {
        let object = self.object(p, start_offset, segment_id, suffix);
        match self.store.get(&object).await {
            Ok(g) => Ok(Some(g.bytes().await?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes every object of a copy (those that exist: a half-made copy has fewer).
    pub async fn delete_log_segment_data(
        &self,
        p: &RemotePartition,
        start_offset: i64,
        segment_id: Uuid,
    ) -> Result<(), RemoteStorageError> {
        for suffix in ALL_SUFFIXES {
            match self
                .store
                .delete(&self.object(p, start_offset, segment_id, suffix))
                .await
            {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Deletes every object of a deleted topic's partition; returns how many there were.
    pub async fn delete_partition(&self, p: &RemotePartition) -> Result<u64, RemoteStorageError> {
        let prefix = ObjectPath::from(self.partition_prefix(p));
        let mut listed = self.store.list(Some(&prefix));
        let mut doomed = Vec::new();
        while let Some(meta) = listed.next().await {
            doomed.push(meta?.location);
        }
        for object in &doomed {
            match self.store.delete(object).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(doomed.len() as u64)
    }
}
