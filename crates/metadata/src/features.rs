//! Feature levels (KIP-584, KIP-778): what this software supports and what the cluster has
//! finalized, as FeatureLevelRecords in the metadata log. ApiVersions reports both;
//! UpdateFeatures changes the finalized levels through the controller.
//!
//! A new cluster finalizes `metadata.version` and `transaction.version`. The broker's
//! behaviour is not gated on `metadata.version` (there are no older Rill versions to stay
//! compatible with); the level names the Kafka release whose APIs Rill follows, for the
//! tools and clients that read it. `transaction.version` 2 (Kafka 4's default) is what
//! makes the Java client 4.x use KIP-890's second part (EndTxn v5, Produce v12,
//! TxnOffsetCommit v5), which the broker serves whatever the level: a cluster kept at
//! level 0 (`kafka-features.sh downgrade --feature transaction.version=0`) only has its
//! clients stay at transaction version 1. The other features Kafka 4.1 knows are
//! supported at level 0 only until what they switch on is built: `group.version` 1 is
//! the KIP-848 consumer protocol (issue #20), and a client that saw it finalized would
//! use it. A feature at level 0 is not finalized, as in Kafka.

use rill_protocol::ErrorCode;

use crate::image::MetadataImage;

pub const METADATA_VERSION: &str = "metadata.version";
/// Kafka 3.3-IV3, the oldest `metadata.version` Kafka 4 accepts.
pub const METADATA_VERSION_MIN: i16 = 7;
/// Kafka 4.1-IV1, what a new cluster is finalized at (Kafka 4.1's default).
pub const METADATA_VERSION_LATEST: i16 = 27;

/// Every feature this software knows, with the levels it supports (Kafka 4.1's names).
pub const SUPPORTED_FEATURES: &[(&str, i16, i16)] = &[
    ("eligible.leader.replicas.version", 0, 0),
    (GROUP_VERSION, 0, GROUP_VERSION_LATEST),
    ("kraft.version", 0, 0),
    (
        METADATA_VERSION,
        METADATA_VERSION_MIN,
        METADATA_VERSION_LATEST,
    ),
    (TRANSACTION_VERSION, 0, TRANSACTION_VERSION_LATEST),
];

pub const TRANSACTION_VERSION: &str = "transaction.version";
pub const GROUP_VERSION: &str = "group.version";
/// Level 1 is KIP-848's consumer group protocol (`group.protocol=consumer`). Rill serves
/// the protocol at any level (it is not gated on the feature), so a cluster is not
/// finalized at it; `kafka-features upgrade --feature group.version=1` records it.
pub const GROUP_VERSION_LATEST: i16 = 1;
/// KIP-890 part 2: the epoch bumped at every commit and abort, partitions added by their
/// leaders. What a new cluster is finalized at, as in Kafka 4.
pub const TRANSACTION_VERSION_LATEST: i16 = 2;

/// UpgradeType of UpdateFeatures v1+.
pub const UPGRADE: i8 = 1;
pub const SAFE_DOWNGRADE: i8 = 2;
pub const UNSAFE_DOWNGRADE: i8 = 3;

/// One requested change: the feature, the level wanted (below 1: remove it), and how.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FeatureUpdate {
    pub feature: String,
    pub max_version_level: i16,
    pub upgrade_type: i8,
}

/// The level `feature` may be finalized at, or why not (Kafka's FeatureControlManager
/// rules as far as Rill's features go).
pub fn check_update(
    image: &MetadataImage,
    update: &FeatureUpdate,
) -> Result<(), (ErrorCode, String)> {
    let invalid = |why: String| Err((ErrorCode::INVALID_UPDATE_VERSION, why));
    let Some((_, min, max)) = SUPPORTED_FEATURES
        .iter()
        .find(|(n, _, _)| *n == update.feature)
    else {
        return invalid(format!(
            "The controller does not support the given feature {}.",
            update.feature
        ));
    };
    let current = image.features.get(&update.feature).copied().unwrap_or(0);
    let level = update.max_version_level.max(0);
    if level == current {
        return Ok(());
    }
    if !(UPGRADE..=UNSAFE_DOWNGRADE).contains(&update.upgrade_type) {
        return invalid(format!("Unknown upgrade type {}.", update.upgrade_type));
    }
    if level < current && update.upgrade_type == UPGRADE {
        return invalid(format!(
            "Can't downgrade the version of {} from {current} to {level} without setting the upgrade type to either safe or unsafe downgrade.",
            update.feature
        ));
    }
    if update.feature == METADATA_VERSION && level < current {
        return invalid("Rill does not downgrade metadata.version.".to_string());
    }
    if level != 0 && !(*min..=*max).contains(&level) {
        return invalid(format!(
            "Invalid update version {level} for feature {}. The supported range is [{min}, {max}].",
            update.feature
        ));
    }
    if update.feature == METADATA_VERSION && level == 0 {
        return invalid("metadata.version cannot be removed.".to_string());
    }
    Ok(())
}
