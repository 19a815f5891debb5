//! The cluster metadata of a single node: topics (name, id, partition count, config
//! overrides), the cluster id and the producer-id allocator, kept in one JSON document
//! under `<data dir>/__cluster_metadata/` and replaced atomically on every change.
//!
//! This is the single-node stand-in for the replicated metadata log: changes go through
//! [`MetadataStore::update`], which persists before it returns, so a topic that a client
//! saw created survives `kill -9`.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use rill_protocol::primitives::Uuid;
use serde::{Deserialize, Serialize};

use crate::error::BrokerError;

/// Producer ids are handed out from blocks; the store persists the end of the current
/// block before any id in it is used, so a restart never reuses an id.
const PRODUCER_ID_BLOCK: i64 = 1000;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TopicMeta {
    pub name: String,
    /// The topic id as 32 hex digits.
    pub id: String,
    pub partitions: i32,
    pub replication_factor: i16,
    /// Topic-level overrides only; defaults come from the broker config.
    pub configs: BTreeMap<String, String>,
    #[serde(default)]
    pub internal: bool,
}

impl TopicMeta {
    pub fn topic_id(&self) -> Uuid {
        uuid_from_hex(&self.id).unwrap_or_default()
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MetadataImage {
    pub cluster_id: String,
    pub topics: BTreeMap<String, TopicMeta>,
    /// First producer id not yet covered by a persisted block.
    pub producer_id_block_end: i64,
}

pub struct MetadataStore {
    path: PathBuf,
    image: MetadataImage,
    next_producer_id: i64,
    /// Whether `open` found no metadata and started a new cluster.
    pub created: bool,
    /// Topic names by id, rebuilt on every change, so that Fetch v13+ and Metadata v10+
    /// resolve ids without scanning (changes are rare, lookups are on the data path).
    names_by_id: HashMap<Uuid, String>,
}

impl MetadataStore {
    pub fn open(data_dir: &Path) -> Result<Self, BrokerError> {
        let dir = data_dir.join("__cluster_metadata");
        fs::create_dir_all(&dir).map_err(|e| BrokerError::io(dir.display(), e))?;
        let path = dir.join("metadata.json");
        let mut created = false;
        let image = match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| BrokerError::Metadata(format!("{}: {e}", path.display())))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                created = true;
                MetadataImage {
                    cluster_id: random_uuid().to_string(),
                    ..MetadataImage::default()
                }
            }
            Err(e) => return Err(BrokerError::io(path.display(), e)),
        };
        let next_producer_id = image.producer_id_block_end;
        let names_by_id = index_ids(&image);
        let store = Self {
            path,
            image,
            next_producer_id,
            created,
            names_by_id,
        };
        store.persist()?;
        Ok(store)
    }

    pub fn image(&self) -> &MetadataImage {
        &self.image
    }

    /// Applies a change and persists it before returning; on a persistence failure the
    /// in-memory image is left as it was.
    pub fn update<T>(
        &mut self,
        change: impl FnOnce(&mut MetadataImage) -> T,
    ) -> Result<T, BrokerError> {
        let mut next = self.image.clone();
        let out = change(&mut next);
        let previous = std::mem::replace(&mut self.image, next);
        if let Err(e) = self.persist() {
            self.image = previous;
            return Err(e);
        }
        self.names_by_id = index_ids(&self.image);
        Ok(out)
    }

    /// The name of the topic with this id.
    pub fn topic_name(&self, id: &Uuid) -> Option<&str> {
        self.names_by_id.get(id).map(String::as_str)
    }

    pub fn next_producer_id(&mut self) -> Result<i64, BrokerError> {
        if self.next_producer_id >= self.image.producer_id_block_end {
            let start = self.next_producer_id;
            self.update(|img| img.producer_id_block_end = start + PRODUCER_ID_BLOCK)?;
        }
        let id = self.next_producer_id;
        self.next_producer_id += 1;
        Ok(id)
    }

    fn persist(&self) -> Result<(), BrokerError> {
        let tmp = self.path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(&self.image)
            .map_err(|e| BrokerError::Metadata(e.to_string()))?;
        let write = || -> std::io::Result<()> {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            fs::rename(&tmp, &self.path)?;
            if let Some(dir) = self.path.parent() {
                fs::File::open(dir)?.sync_all()?;
            }
            Ok(())
        };
        write().map_err(|e| BrokerError::io(self.path.display(), e))
    }
}

fn index_ids(image: &MetadataImage) -> HashMap<Uuid, String> {
    image
        .topics
        .values()
        .map(|t| (t.topic_id(), t.name.clone()))
        .collect()
}

/// A random (version 4) id, as Kafka makes topic and cluster ids.
pub fn random_uuid() -> Uuid {
    Uuid(*uuid::Uuid::new_v4().as_bytes())
}

pub fn uuid_to_hex(id: Uuid) -> String {
    id.0.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn uuid_from_hex(hex: &str) -> Option<Uuid> {
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(Uuid(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_and_producer_ids_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = MetadataStore::open(dir.path()).unwrap();
        let cluster_id = store.image().cluster_id.clone();
        store
            .update(|img| {
                img.topics.insert(
                    "t".into(),
                    TopicMeta {
                        name: "t".into(),
                        id: uuid_to_hex(random_uuid()),
                        partitions: 3,
                        replication_factor: 1,
                        configs: BTreeMap::new(),
                        internal: false,
                    },
                )
            })
            .unwrap();
        let id = store.image().topics["t"].topic_id();
        assert_eq!(store.topic_name(&id), Some("t"));
        assert_eq!(store.topic_name(&random_uuid()), None);
        let first = store.next_producer_id().unwrap();
        let second = store.next_producer_id().unwrap();
        assert_eq!(second, first + 1);
        drop(store);
        let mut store = MetadataStore::open(dir.path()).unwrap();
        assert_eq!(store.image().cluster_id, cluster_id);
        assert_eq!(store.image().topics["t"].partitions, 3);
        assert!(
            store.next_producer_id().unwrap() > second,
            "producer ids are never reused"
        );
    }

    #[test]
    fn uuid_hex_round_trip() {
        let id = random_uuid();
        assert_eq!(uuid_from_hex(&uuid_to_hex(id)), Some(id));
        assert_eq!(uuid_from_hex("zz"), None);
    }
}
