//! Feature levels on the wire (KIP-584): the supported and finalized features ApiVersions
//! v3+ carries, and UpdateFeatures, which the controller decides
//! (`rill_metadata::features`, `QuorumController::update_features`).
//!
//! UpdateFeatures v0-1 answer per feature; v2 (KIP-1022) only at the top level, with the
//! first refusal's error. `allow_downgrade` of v0 maps to a safe downgrade, as in Kafka.

use rill_metadata::features::{FeatureUpdate, SAFE_DOWNGRADE, SUPPORTED_FEATURES, UPGRADE};
use rill_metadata::{ControllerEvent, ControllerResponse, UpdateFeaturesRequest as CtlUpdate};
use rill_protocol::generated::api_versions_response::{
    ApiVersionsResponse, FinalizedFeatureKey, SupportedFeatureKey,
};
use rill_protocol::generated::update_features_request::UpdateFeaturesRequest;
use rill_protocol::generated::update_features_response::{
    UpdatableFeatureResult, UpdateFeaturesResponse,
};
use rill_protocol::ErrorCode;

use crate::server::Broker;

impl Broker {
    /// Adds the feature levels to an ApiVersions answer: every feature this broker
    /// supports, and those the cluster finalized above level 0, with the metadata offset
    /// they were read at as the epoch (clients keep the answer with the highest).
    pub(crate) fn with_features(&self, mut body: ApiVersionsResponse) -> ApiVersionsResponse {
        let image = self.image();
        body.supported_features = SUPPORTED_FEATURES
            .iter()
            .map(|(name, min, max)| SupportedFeatureKey {
                name: (*name).to_string(),
                min_version: *min,
                max_version: *max,
                ..Default::default()
            })
            .collect();
        body.finalized_features = image
            .features
            .iter()
            .filter(|(_, level)| **level > 0)
            .map(|(name, level)| FinalizedFeatureKey {
                name: name.clone(),
                max_version_level: *level,
                min_version_level: *level,
                ..Default::default()
            })
            .collect();
        body.finalized_features_epoch = if body.finalized_features.is_empty() {
            -1
        } else {
            image.last_offset()
        };
        body
    }

    pub(crate) async fn handle_update_features(
        &self,
        request: UpdateFeaturesRequest,
        version: i16,
    ) -> UpdateFeaturesResponse {
        let updates = request
            .feature_updates
            .iter()
            .map(|u| FeatureUpdate {
                feature: u.feature.clone(),
                max_version_level: u.max_version_level,
                upgrade_type: match version {
                    0 if u.allow_downgrade => SAFE_DOWNGRADE,
                    0 => UPGRADE,
                    _ => u.upgrade_type,
                },
            })
            .collect();
        let event = ControllerEvent::UpdateFeatures(CtlUpdate {
            updates,
            validate_only: request.validate_only,
        });
        let results = match self.controller_call(event).await {
            Ok(ControllerResponse::UpdateFeatures(results)) => results,
            Ok(other) => {
                tracing::error!(?other, "unexpected controller answer to UpdateFeatures");
                return UpdateFeaturesResponse {
                    error_code: ErrorCode::UNKNOWN_SERVER_ERROR.code(),
                    ..Default::default()
                };
            }
            Err(code) => {
                return UpdateFeaturesResponse {
                    error_code: code.code(),
                    ..Default::default()
                }
            }
        };
        // As Kafka's controller answers: one refusal fails the whole update, with the
        // top-level error and no per-feature results; a success lists every feature
        // with NONE up to version 1 (version 2 answers with the top-level error only).
        if let Some(refused) = results.iter().find(|r| r.error_code != ErrorCode::NONE) {
            return UpdateFeaturesResponse {
                error_code: refused.error_code.code(),
                error_message: Some(format!(
                    "The update failed for all features since the following feature had an \
                     error: {}",
                    refused.error_message.as_deref().unwrap_or_default()
                )),
                ..Default::default()
            };
        }
        UpdateFeaturesResponse {
            results: if version <= 1 {
                results
                    .into_iter()
                    .map(|r| UpdatableFeatureResult {
                        feature: r.feature,
                        error_code: ErrorCode::NONE.code(),
                        ..Default::default()
                    })
                    .collect()
            } else {
                Vec::new()
            },
            ..Default::default()
        }
    }
}
