//! The replicated state machine: committed entries decoded into metadata records and
//! applied to this node's [`MetadataImage`]; snapshots are the image's own records.
//!
//! The records' offsets count records, not Raft log entries: entry `n` holding a batch
//! of `k` records advances the offset by `k`, blank and membership entries by none. So
//! the offsets are the same on every node and do not depend on Raft's bookkeeping, and
//! a broker's "current metadata offset" means the same thing everywhere.
//!
//! The snapshot file (`snapshot` in the quorum directory) is two frames in the log
//! store's framing: the postcard-encoded `SnapshotMeta`, then the image snapshot
//! ([`MetadataImage::to_snapshot`]).

use std::collections::VecDeque;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, StorageError, StorageIOError,
    StoredMembership,
};
use tokio::sync::watch;

use super::log_store::{read_frame, write_frame};
use super::{MetadataApplied, TypeConfig};
use crate::image::MetadataImage;
use crate::record::{decode_batch, MetadataRecord};

type NodeId = u64;

/// How many committed records are kept in memory for [`super::MetadataQuorum::read_committed`];
/// a reader further behind gets the whole image instead.
pub(crate) const RETAINED_RECORDS: usize = 100_000;

pub(crate) struct SmState {
    pub last_applied: Option<LogId<NodeId>>,
    pub membership: StoredMembership<NodeId, BasicNode>,
    pub image: MetadataImage,
    /// The most recent committed records with their offsets, oldest first.
    pub tail: VecDeque<(i64, MetadataRecord)>,
    snapshot: Option<(SnapshotMeta<NodeId, BasicNode>, Vec<u8>)>,
    snapshot_seq: u64,
}

/// State shared between the state machine openraft drives and the quorum handle.
pub(crate) struct Shared {
    pub state: Mutex<SmState>,
    /// The offset the next committed record will get, for subscribers.
    pub committed: watch::Sender<i64>,
    /// When this node, as leader, last heard from each follower (`describe.rs`).
    pub contacts: super::describe::FollowerContacts,
}

impl Shared {
    pub fn lock(&self) -> std::sync::MutexGuard<'_, SmState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// openraft's `RaftStateMachine` over a [`MetadataImage`].
#[derive(Clone)]
pub struct StateMachineStore {
    pub(crate) shared: Arc<Shared>,
    dir: PathBuf,
}

fn io_err(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

impl StateMachineStore {
    /// Opens the state machine, starting from the snapshot in `dir` if there is one.
    pub fn open(dir: &Path) -> std::io::Result<StateMachineStore> {
        let mut state = SmState {
            last_applied: None,
            membership: StoredMembership::default(),
            image: MetadataImage::new(),
            tail: VecDeque::new(),
            snapshot: None,
            snapshot_seq: 0,
        };
        match std::fs::read(dir.join("snapshot")) {
            Ok(buf) => {
                let meta_bytes = read_frame(&buf, 0)
                    .ok_or_else(|| io_err("snapshot file: corrupt meta frame"))?;
                let data = read_frame(&buf, 8 + meta_bytes.len())
                    .ok_or_else(|| io_err("snapshot file: corrupt data frame"))?;
                let meta: SnapshotMeta<NodeId, BasicNode> =
                    postcard::from_bytes(meta_bytes).map_err(io_err)?;
                state.image =
                    MetadataImage::from_snapshot(Bytes::copy_from_slice(data)).map_err(io_err)?;
                state.last_applied = meta.last_log_id;
                state.membership = meta.last_membership.clone();
                state.snapshot = Some((meta, data.to_vec()));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let (committed, _) = watch::channel(state.image.next_offset);
        Ok(StateMachineStore {
            shared: Arc::new(Shared {
                state: Mutex::new(state),
                committed,
                contacts: Default::default(),
            }),
            dir: dir.to_path_buf(),
        })
    }

    fn save_snapshot(
        &self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        data: &[u8],
    ) -> std::io::Result<()> {
        let meta_bytes = postcard::to_allocvec(meta).map_err(io_err)?;
        let tmp = self.dir.join("snapshot.tmp");
        let mut f = std::fs::File::create(&tmp)?;
        write_frame(&mut f, &meta_bytes)?;
        write_frame(&mut f, data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, self.dir.join("snapshot"))?;
        std::fs::File::open(&self.dir)?.sync_all()
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let (meta, data) = {
            let mut st = self.shared.lock();
            let data = st
                .image
                .to_snapshot()
                .map_err(|e| StorageIOError::read_state_machine(&io_err(e)))?
                .to_vec();
            st.snapshot_seq += 1;
            let snapshot_id = format!(
                "{}-{}",
                st.last_applied.map_or(0, |l| l.index),
                st.snapshot_seq
            );
            let meta = SnapshotMeta {
                last_log_id: st.last_applied,
                last_membership: st.membership.clone(),
                snapshot_id,
            };
            st.snapshot = Some((meta.clone(), data.clone()));
            (meta, data)
        };
        self.save_snapshot(&meta, &data)
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = StateMachineStore;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>), StorageError<NodeId>>
    {
        let st = self.shared.lock();
        Ok((st.last_applied, st.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<MetadataApplied>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut out = Vec::new();
        let next = {
            let mut st = self.shared.lock();
            for entry in entries {
                st.last_applied = Some(entry.log_id);
                let first_offset = st.image.next_offset;
                match entry.payload {
                    EntryPayload::Blank => {}
                    EntryPayload::Normal(data) => match decode_batch(Bytes::from(data.batch)) {
                        Ok(records) => {
                            for record in records {
                                let offset = st.image.next_offset;
                                if let Err(e) = st.image.apply(&record) {
                                    // Every replica skips the same record alike.
                                    tracing::error!(offset, error = %e, "committed metadata record skipped");
                                }
                                st.tail.push_back((offset, record));
                                if st.tail.len() > RETAINED_RECORDS {
                                    st.tail.pop_front();
                                }
                            }
                        }
                        Err(e) => {
                            tracing::error!(log_id = %entry.log_id, error = %e, "undecodable metadata batch skipped");
                        }
                    },
                    EntryPayload::Membership(m) => {
                        st.membership = StoredMembership::new(Some(entry.log_id), m);
                    }
                }
                out.push(MetadataApplied {
                    first_offset,
                    next_offset: st.image.next_offset,
                });
            }
            st.image.next_offset
        };
        self.shared.committed.send_replace(next);
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        let data = snapshot.into_inner();
        let image = MetadataImage::from_snapshot(Bytes::from(data.clone()))
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &io_err(e)))?;
        self.save_snapshot(meta, &data)
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        let next = {
            let mut st = self.shared.lock();
            st.image = image;
            st.last_applied = meta.last_log_id;
            st.membership = meta.last_membership.clone();
            // Readers behind the snapshot get the image itself.
            st.tail.clear();
            st.snapshot = Some((meta.clone(), data));
            st.image.next_offset
        };
        self.shared.committed.send_replace(next);
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let st = self.shared.lock();
        Ok(st.snapshot.as_ref().map(|(meta, data)| Snapshot {
            meta: meta.clone(),
            snapshot: Box::new(Cursor::new(data.clone())),
        }))
    }
}
