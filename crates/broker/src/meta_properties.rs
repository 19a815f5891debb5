//! `meta.properties`: the identity of a data directory (cluster id and node id), written
//! at its first start and checked at every later one, as Kafka does.
//!
//! Kafka makes the operator run `kafka-storage format` with one cluster id on every node.
//! Rill needs no such step: a single-node cluster draws a random id, and the nodes of a
//! multi-node cluster derive the same id from the one thing they must already agree on,
//! `controller.quorum.voters` (`cluster.id` in the config overrides both). A node that
//! names its voters explicitly derives the id even when there is one voter, so that a
//! broker-only node and the single controller it follows agree too. A directory
//! that was formatted for another node id is refused, so that two nodes can never share
//! (or swap) their logs by a configuration slip.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use rill_protocol::Uuid;

use crate::config::BrokerConfig;
use crate::error::BrokerError;

const FILE: &str = "meta.properties";

/// The node id an earlier start stored in `data_dir`, if any (a broker whose id was
/// generated keeps it across restarts this way).
pub fn stored_node_id(data_dir: &Path) -> Result<Option<i32>, BrokerError> {
    Ok(read(data_dir)?.map(|props| props.node_id))
}

/// What a valid `meta.properties` holds.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MetaProperties {
    cluster_id: String,
    node_id: i32,
    /// KIP-858's `directory.id`; absent in files written before it.
    directory_id: Option<Uuid>,
}

impl MetaProperties {
    fn text(&self) -> String {
        let mut text = format!(
            "version=1\ncluster.id={}\nnode.id={}\n",
            self.cluster_id, self.node_id
        );
        if let Some(id) = self.directory_id {
            text.push_str(&format!("directory.id={id}\n"));
        }
        text
    }
}

/// The `meta.properties` of `data_dir`, `None` when there is none yet. A file that
/// exists but is not one (not text, no `node.id` or `cluster.id`, a `node.id` that is
/// no number) is an error that says which, rather than a directory taken for another
/// node's or a new one's.
fn read(data_dir: &Path) -> Result<Option<MetaProperties>, BrokerError> {
    let path = data_dir.join(FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(BrokerError::io(path.display(), e)),
    };
    let unreadable = |what: &str| {
        BrokerError::Config(format!(
            "{} is unreadable: {what}; it should hold the lines version=1, \
             cluster.id=<id> and node.id=<number> written at the directory's first start \
             (restore it, or move the directory aside to start this node afresh)",
            path.display()
        ))
    };
    let text = String::from_utf8(bytes).map_err(|_| unreadable("it is not text"))?;
    let props = parse(&text);
    let node_id = match props.get("node.id") {
        None => return Err(unreadable("it has no node.id")),
        Some(v) => v
            .parse::<i32>()
            .map_err(|_| unreadable(&format!("its node.id {v:?} is not a number")))?,
    };
    let cluster_id = match props.get("cluster.id") {
        Some(id) if !id.is_empty() => id.clone(),
        _ => return Err(unreadable("it has no cluster.id")),
    };
    let directory_id = match props.get("directory.id") {
        None => None,
        Some(v) => Some(
            v.parse::<Uuid>()
                .ok()
                .filter(|id| !rill_metadata::directory_id::reserved(*id))
                .ok_or_else(|| unreadable(&format!("its directory.id {v:?} is no directory id")))?,
        ),
    };
    Ok(Some(MetaProperties {
        cluster_id,
        node_id,
        directory_id,
    }))
}

/// Writes `props` to `dir`'s file atomically and durably.
fn write(dir: &Path, props: &MetaProperties) -> Result<(), BrokerError> {
    let path = dir.join(FILE);
    let tmp = path.with_extension("properties.tmp");
    let text = props.text();
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(dir)?.sync_all()
    };
    write().map_err(|e| BrokerError::io(path.display(), e))
}

/// A new directory id (Kafka's `DirectoryId.random`): never one of the reserved ids, nor
/// one whose text starts with a dash (which a command line would take for an option).
fn random_directory_id() -> Uuid {
    loop {
        let id = Uuid(*uuid::Uuid::new_v4().as_bytes());
        if !rill_metadata::directory_id::reserved(id) && !id.to_string().starts_with('-') {
            return id;
        }
    }
}

/// The directory ids of `dirs` (each of `log.dirs`), in order: each directory's
/// `meta.properties` is checked against this node's cluster id and node id, and written
/// (or given its `directory.id`) when it lacks one. Called once the metadata log's
/// directory has its file ([`load_or_create`]).
pub fn load_or_create_log_dirs(
    dirs: &[PathBuf],
    cluster_id: &str,
    node_id: i32,
) -> Result<Vec<Uuid>, BrokerError> {
    let mut ids: Vec<Uuid> = Vec::with_capacity(dirs.len());
    for dir in dirs {
        std::fs::create_dir_all(dir).map_err(|e| BrokerError::io(dir.display(), e))?;
        let props = match read(dir)? {
            Some(stored) => {
                check_owner(dir, &stored, cluster_id, node_id)?;
                match stored.directory_id {
                    Some(_) => stored,
                    None => {
                        let with_id = MetaProperties {
                            directory_id: Some(random_directory_id()),
                            ..stored
                        };
                        write(dir, &with_id)?;
                        with_id
                    }
                }
            }
            None => {
                let new = MetaProperties {
                    cluster_id: cluster_id.to_string(),
                    node_id,
                    directory_id: Some(random_directory_id()),
                };
                write(dir, &new)?;
                new
            }
        };
        let id = props.directory_id.unwrap_or_else(random_directory_id);
        if let Some(i) = ids.iter().position(|other| *other == id) {
            return Err(BrokerError::Config(format!(
                "{} and {} have the same directory.id {id} in {FILE}: one is a copy of the \
                 other; move the copy aside",
                dirs[i].display(),
                dir.display()
            )));
        }
        ids.push(id);
    }
    Ok(ids)
}

/// Refuses a directory another node or another cluster wrote.
fn check_owner(
    dir: &Path,
    stored: &MetaProperties,
    cluster_id: &str,
    node_id: i32,
) -> Result<(), BrokerError> {
    if stored.node_id != node_id {
        return Err(BrokerError::Config(format!(
            "{} belongs to node {}, but this is node {node_id}: a data directory \
             serves the node it was first started as (start with --node-id {}, or \
             give this node its own --data-dir)",
            dir.display(),
            stored.node_id,
            stored.node_id
        )));
    }
    if stored.cluster_id != cluster_id {
        return Err(BrokerError::Config(format!(
            "{} belongs to cluster {}, but this node is in cluster {cluster_id}",
            dir.display(),
            stored.cluster_id
        )));
    }
    Ok(())
}

/// Returns the cluster id of `data_dir`, creating `meta.properties` on the first start.
pub fn load_or_create(
    data_dir: &Path,
    config: &BrokerConfig,
    node_id: i32,
    voters: &BTreeMap<u64, SocketAddr>,
) -> Result<String, BrokerError> {
    match read(data_dir)? {
        Some(stored) => {
            if stored.node_id != node_id {
                check_owner(data_dir, &stored, &stored.cluster_id, node_id)?;
            }
            let cluster_id = stored.cluster_id.clone();
            if let Some(configured) = config.get("cluster.id") {
                if configured != cluster_id {
                    return Err(BrokerError::Config(format!(
                        "{} belongs to cluster {cluster_id}, but cluster.id in the config is \
                         {configured}",
                        data_dir.display()
                    )));
                }
            }
            Ok(cluster_id)
        }
        None => {
            let cluster_id = match config.get("cluster.id") {
                Some(id) => id.to_string(),
                None if voters.len() > 1 || voters_configured(config) => derived_cluster_id(voters),
                None => base64_id(*uuid::Uuid::new_v4().as_bytes()),
            };
            write(
                data_dir,
                &MetaProperties {
                    cluster_id: cluster_id.clone(),
                    node_id,
                    directory_id: Some(random_directory_id()),
                },
            )?;
            Ok(cluster_id)
        }
    }
}

fn parse(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// `controller.quorum.voters` is set (rather than the implicit quorum of this node alone).
fn voters_configured(config: &BrokerConfig) -> bool {
    !config
        .get("controller.quorum.voters")
        .unwrap_or_default()
        .trim()
        .is_empty()
}

/// A cluster id every voter computes alike: a hash of the sorted voter list.
fn derived_cluster_id(voters: &BTreeMap<u64, SocketAddr>) -> String {
    let text: Vec<String> = voters.iter().map(|(id, a)| format!("{id}@{a}")).collect();
    let text = text.join(",");
    let a = crc32c::crc32c(text.as_bytes());
    let b = crc32c::crc32c_append(a, b"rill");
    let c = crc32c::crc32c_append(b, text.as_bytes());
    let d = crc32c::crc32c_append(c, b"cluster");
    let mut bytes = [0u8; 16];
    for (i, w) in [a, b, c, d].iter().enumerate() {
        bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_be_bytes());
    }
    base64_id(bytes)
}

/// Kafka prints cluster ids as URL-safe base64 without padding (22 characters).
fn base64_id(bytes: [u8; 16]) -> String {
    rill_protocol::Uuid(bytes).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn voters(n: u64) -> BTreeMap<u64, SocketAddr> {
        (1..=n)
            .map(|i| (i, SocketAddr::from(([127, 0, 0, 1], 9000 + i as u16))))
            .collect()
    }

    #[test]
    fn created_once_then_checked() {
        let dir = tempfile::tempdir().unwrap();
        let config = BrokerConfig::default();
        let id = load_or_create(dir.path(), &config, 1, &voters(1)).unwrap();
        assert_eq!(id.len(), 22);
        assert_eq!(
            load_or_create(dir.path(), &config, 1, &voters(1)).unwrap(),
            id
        );
        let other = load_or_create(dir.path(), &config, 2, &voters(1))
            .unwrap_err()
            .to_string();
        assert!(
            other.contains("belongs to node 1, but this is node 2"),
            "{other}"
        );
        assert!(!other.contains("Some("), "{other}");
    }

    #[test]
    fn a_file_that_is_no_meta_properties_says_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let config = BrokerConfig::default();
        let path = dir.path().join(FILE);
        for (contents, why) in [
            (&b"garbage\x01\x02"[..], "it has no node.id"),
            (b"\xff\xfe\x00", "it is not text"),
            (
                b"version=1\nnode.id=one\ncluster.id=x\n",
                "its node.id \"one\" is not a number",
            ),
            (b"version=1\nnode.id=1\n", "it has no cluster.id"),
        ] {
            std::fs::write(&path, contents).unwrap();
            for e in [
                load_or_create(dir.path(), &config, 1, &voters(1)).unwrap_err(),
                stored_node_id(dir.path()).unwrap_err(),
            ] {
                let e = e.to_string();
                assert!(e.contains("is unreadable") && e.contains(why), "{e}");
                assert!(!e.contains("None"), "{e}");
            }
        }
    }

    #[test]
    fn voters_of_one_cluster_agree_on_its_id() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let config = BrokerConfig::default();
        let x = load_or_create(a.path(), &config, 1, &voters(3)).unwrap();
        let y = load_or_create(b.path(), &config, 2, &voters(3)).unwrap();
        assert_eq!(x, y);
        assert_ne!(x, derived_cluster_id(&voters(2)));
    }

    #[test]
    fn a_broker_only_node_agrees_with_its_single_controller() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let mut config = BrokerConfig::default();
        config.set("controller.quorum.voters", "1@127.0.0.1:9001");
        let controller = load_or_create(a.path(), &config, 1, &voters(1)).unwrap();
        let broker = load_or_create(b.path(), &config, 2, &voters(1)).unwrap();
        assert_eq!(controller, broker);
    }

    #[test]
    fn every_log_dir_gets_its_own_directory_id_once() {
        let root = tempfile::tempdir().unwrap();
        let dirs: Vec<PathBuf> = (0..3).map(|i| root.path().join(format!("d{i}"))).collect();
        let config = BrokerConfig::default();
        std::fs::create_dir_all(&dirs[0]).unwrap();
        let cluster = load_or_create(&dirs[0], &config, 4, &voters(1)).unwrap();
        let ids = load_or_create_log_dirs(&dirs, &cluster, 4).unwrap();
        assert_eq!(ids.len(), 3);
        assert!(ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2]);
        assert_eq!(load_or_create_log_dirs(&dirs, &cluster, 4).unwrap(), ids);
        let text = std::fs::read_to_string(dirs[2].join(FILE)).unwrap();
        assert!(text.contains(&format!("directory.id={}", ids[2])), "{text}");
        assert!(text.contains(&format!("cluster.id={cluster}")), "{text}");
        assert!(text.contains("node.id=4"), "{text}");

        // A file from before directory ids gets one; the rest of it is kept.
        std::fs::write(
            dirs[1].join(FILE),
            format!("version=1\ncluster.id={cluster}\nnode.id=4\n"),
        )
        .unwrap();
        let again = load_or_create_log_dirs(&dirs, &cluster, 4).unwrap();
        assert_eq!((again[0], again[2]), (ids[0], ids[2]));
        assert_ne!(again[1], ids[1]);

        // Another node's directory, another cluster's, or a copy are refused.
        let e = load_or_create_log_dirs(&dirs, &cluster, 5)
            .unwrap_err()
            .to_string();
        assert!(e.contains("belongs to node 4"), "{e}");
        let e = load_or_create_log_dirs(&dirs, "other", 4)
            .unwrap_err()
            .to_string();
        assert!(e.contains("belongs to cluster"), "{e}");
        std::fs::copy(dirs[0].join(FILE), dirs[2].join(FILE)).unwrap();
        let e = load_or_create_log_dirs(&dirs, &cluster, 4)
            .unwrap_err()
            .to_string();
        assert!(e.contains("same directory.id"), "{e}");
    }
}
