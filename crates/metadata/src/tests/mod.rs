//! Tests of the image, the record codec and the controller, with a harness that plays
//! the broker shell: it hands events to the controller, applies the records to the image
//! (checking the invariants every time), and keeps the clock.

mod controller;
mod delegation_tokens;
mod directories;
mod image;
mod observer;
mod quorum;
mod simulation;
mod submit;
mod voters;

use rill_protocol::{ErrorCode, Uuid};

use crate::*;

/// A loopback address no other test of this process was given. The port is found free
/// and bound later by the quorum under test, so two tests running side by side could
/// otherwise be handed the same one in between (a clash CI met once).
pub(crate) fn free_addr() -> std::net::SocketAddr {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        if GIVEN.lock().unwrap().insert(addr.port()) {
            return addr;
        }
    }
}

/// A controller, the image it decides from, and the time.
pub(crate) struct Harness {
    pub controller: QuorumController,
    pub image: MetadataImage,
    pub now: i64,
    /// Every record applied so far, to replay.
    pub log: Vec<MetadataRecord>,
    /// Each broker's epoch, as its registration answered.
    pub epochs: std::collections::BTreeMap<i32, i64>,
}

impl Harness {
    pub fn new() -> Self {
        Self::with_config(ControllerConfig::default())
    }

    /// A formatted cluster: metadata.version is finalized before the first event, as
    /// the first controller's first tick does.
    pub fn with_config(config: ControllerConfig) -> Self {
        let mut h = Self {
            controller: QuorumController::new(config),
            image: MetadataImage::new(),
            now: 0,
            log: Vec::new(),
            epochs: Default::default(),
        };
        let bootstrap = QuorumController::new(ControllerConfig::default()).tick(&h.image, 0, 0);
        h.commit(&bootstrap);
        h
    }

    pub fn commit(&mut self, result: &ControllerResult) {
        let before = self.image.clone();
        for r in &result.records {
            self.image.apply(r).unwrap();
            self.log.push(r.clone());
        }
        if let Err(e) = check_image_invariants(&self.image) {
            panic!(
                "{e}\nbefore: {before:?}\nrecords: {:?}\nresponse: {:?}",
                result.records, result.response
            );
        }
    }

    pub fn run(&mut self, event: ControllerEvent) -> ControllerResult {
        let result = self
            .controller
            .handle(event, &self.image, self.now, self.now);
        self.commit(&result);
        result
    }

    pub fn tick(&mut self) -> ControllerResult {
        let result = self.controller.tick(&self.image, self.now, self.now);
        self.commit(&result);
        result
    }

    pub fn register_with(&mut self, id: i32, incarnation: u64) -> BrokerRegistrationResponse {
        let r = self.run(ControllerEvent::BrokerRegistration(
            BrokerRegistrationRequest {
                broker_id: id,
                incarnation_id: Uuid::from_u64_pair(id as u64, incarnation),
                listeners: vec![Endpoint {
                    name: "PLAINTEXT".into(),
                    host: "127.0.0.1".into(),
                    port: 9092,
                    security_protocol: 0,
                }],
                rack: None,
                log_dirs: vec![],
            },
        ));
        let ControllerResponse::BrokerRegistration(resp) = r.response else {
            panic!("{r:?}")
        };
        if resp.error_code == ErrorCode::NONE {
            self.epochs.insert(resp.broker_id, resp.broker_epoch);
        }
        resp
    }

    pub fn register(&mut self, id: i32) -> BrokerRegistrationResponse {
        self.register_with(id, 1)
    }

    pub fn heartbeat_full(
        &mut self,
        id: i32,
        want_fence: bool,
        want_shut_down: bool,
    ) -> BrokerHeartbeatResponse {
        let epoch = self.epochs.get(&id).copied().unwrap_or(-1);
        let r = self.run(ControllerEvent::BrokerHeartbeat(BrokerHeartbeatRequest {
            broker_id: id,
            broker_epoch: epoch,
            current_metadata_offset: self.image.last_offset(),
            want_fence,
            want_shut_down,
            offline_log_dirs: vec![],
        }));
        let ControllerResponse::BrokerHeartbeat(resp) = r.response else {
            panic!("{r:?}")
        };
        resp
    }

    pub fn heartbeat(&mut self, id: i32) -> BrokerHeartbeatResponse {
        self.heartbeat_full(id, false, false)
    }

    /// Registers and unfences brokers `ids`.
    pub fn brokers(&mut self, ids: &[i32]) {
        for id in ids {
            assert_eq!(self.register(*id).error_code, ErrorCode::NONE);
        }
        for id in ids {
            assert!(!self.heartbeat(*id).is_fenced);
        }
    }

    pub fn create_topic(&mut self, name: &str, partitions: i32, rf: i16) -> CreatableTopicResult {
        let r = self.run(ControllerEvent::CreateTopics(CreateTopicsRequest {
            topics: vec![CreatableTopic::new(name, partitions, rf)],
            validate_only: false,
        }));
        let ControllerResponse::CreateTopics(mut v) = r.response else {
            panic!("{r:?}")
        };
        v.remove(0)
    }

    pub fn partition(&self, topic: &str, p: i32) -> PartitionRegistration {
        self.image.partition(topic, p).unwrap().clone()
    }

    /// The leader of `topic-p` asks for ISR `isr`.
    pub fn alter_isr(&mut self, topic: &str, p: i32, isr: &[i32]) -> AlterPartitionResponse {
        let part = self.partition(topic, p);
        let topic_id = self.image.topic(topic).unwrap().id;
        self.alter_isr_raw(
            part.leader,
            topic_id,
            p,
            part.leader_epoch,
            part.partition_epoch,
            isr,
        )
    }

    pub fn alter_isr_raw(
        &mut self,
        broker: i32,
        topic_id: Uuid,
        p: i32,
        leader_epoch: i32,
        partition_epoch: i32,
        isr: &[i32],
    ) -> AlterPartitionResponse {
        let epoch = self.epochs.get(&broker).copied().unwrap_or(-1);
        let r = self.run(ControllerEvent::AlterPartition(AlterPartitionRequest {
            broker_id: broker,
            broker_epoch: epoch,
            partitions: vec![AlterPartitionData {
                topic_id,
                partition_index: p,
                leader_epoch,
                partition_epoch,
                new_isr: isr.iter().map(|b| (*b, -1)).collect(),
                leader_recovery_state: 0,
            }],
        }));
        let ControllerResponse::AlterPartition(resp) = r.response else {
            panic!("{r:?}")
        };
        resp
    }

    /// Replaying the whole log from empty gives the same image.
    pub fn check_replay(&self) {
        let mut replayed = MetadataImage::new();
        for r in &self.log {
            replayed.apply(r).unwrap();
        }
        assert_eq!(replayed, self.image);
    }
}
