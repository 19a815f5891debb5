//! The topics as the group coordinator sees them (Kafka's `TopicsImage` in the group
//! coordinator's `MetadataImage`): names, ids and partition counts, handed in by the broker
//! whenever its metadata image changes them ([`crate::GroupCoordinator::update_topics`]).
//! Consumer groups resolve their subscriptions (names and regular expressions) against it
//! and assign partitions by topic id.

use std::collections::BTreeMap;

use rill_protocol::Uuid;

/// One topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicImage {
    pub id: Uuid,
    pub name: String,
    pub num_partitions: i32,
}

/// Every topic of the cluster, by name and by id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicsImage {
    by_name: BTreeMap<String, TopicImage>,
    names_by_id: BTreeMap<Uuid, String>,
}

impl TopicsImage {
    pub fn new(topics: impl IntoIterator<Item = TopicImage>) -> Self {
        let mut image = TopicsImage::default();
        for t in topics {
            image.names_by_id.insert(t.id, t.name.clone());
            image.by_name.insert(t.name.clone(), t);
        }
        image
    }

    pub fn topic(&self, name: &str) -> Option<&TopicImage> {
        self.by_name.get(name)
    }

    pub fn name_of(&self, id: &Uuid) -> Option<&str> {
        self.names_by_id.get(id).map(String::as_str)
    }

    /// Every topic, by name.
    pub fn topics(&self) -> impl Iterator<Item = &TopicImage> {
        self.by_name.values()
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}
