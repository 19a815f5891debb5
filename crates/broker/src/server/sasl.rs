//! SCRAM credentials: DescribeUserScramCredentials and AlterUserScramCredentials, and the
//! lookup the network's SASL/SCRAM authenticator makes (`network::sasl`).
//!
//! Kafka's client salts the password itself and sends the salted password; the broker
//! derives StoredKey and ServerKey from it and hands only those (with the salt and the
//! iterations) to the controller, which writes them to the metadata log as
//! `UserScramCredentialRecord`s. Every broker then authenticates against its own image.

use rill_metadata::{
    AlterUserScramCredentialsRequest as CtlAlter, ControllerEvent, ControllerResponse,
    MetadataImage, ScramCredentialUpsertion as CtlUpsertion,
};
use rill_protocol::generated::alter_user_scram_credentials_request::AlterUserScramCredentialsRequest;
use rill_protocol::generated::alter_user_scram_credentials_response::{
    AlterUserScramCredentialsResponse, AlterUserScramCredentialsResult,
};
use rill_protocol::generated::describe_user_scram_credentials_request::DescribeUserScramCredentialsRequest;
use rill_protocol::generated::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResponse, DescribeUserScramCredentialsResult,
};
use rill_protocol::ErrorCode;

use crate::network::scram::{ScramCredential, ScramMechanism};
use crate::server::Broker;

/// A user's stored SCRAM credential for one mechanism, from the metadata image.
pub(crate) fn scram_credential(
    image: &MetadataImage,
    user: &str,
    mechanism: ScramMechanism,
) -> Option<ScramCredential> {
    crate::network::scram::image_credential(image, user, mechanism)
}

impl Broker {
    pub(crate) fn handle_describe_user_scram_credentials(
        &self,
        request: DescribeUserScramCredentialsRequest,
    ) -> DescribeUserScramCredentialsResponse {
        let image = self.image();
        let describe = |user: &str| -> Vec<CredentialInfo> {
            image
                .scram_credentials
                .range((user.to_string(), i8::MIN)..=(user.to_string(), i8::MAX))
                .map(|((_, mechanism), c)| CredentialInfo {
                    mechanism: *mechanism,
                    iterations: c.iterations,
                    ..Default::default()
                })
                .collect()
        };
        let results = match request.users.filter(|u| !u.is_empty()) {
            // Null or empty: every user with a credential.
            None => all_users(&image)
                .into_iter()
                .map(|user| DescribeUserScramCredentialsResult {
                    credential_infos: describe(&user),
                    user,
                    ..Default::default()
                })
                .collect(),
            Some(users) => {
                let mut results = Vec::with_capacity(users.len());
                for (i, u) in users.iter().enumerate() {
                    let name = &u.name;
                    if users[..i].iter().any(|p| &p.name == name) {
                        continue;
                    }
                    let infos = describe(name);
                    let result = if users.iter().filter(|p| &p.name == name).count() > 1 {
                        DescribeUserScramCredentialsResult {
                            user: name.clone(),
                            error_code: ErrorCode::DUPLICATE_RESOURCE.code(),
                            error_message: Some(format!(
                                "Cannot describe SCRAM credentials for the same user twice in \
                                 a single request: {name}"
                            )),
                            ..Default::default()
                        }
                    } else if infos.is_empty() {
                        DescribeUserScramCredentialsResult {
                            user: name.clone(),
                            error_code: ErrorCode::RESOURCE_NOT_FOUND.code(),
                            error_message: Some(format!(
                                "Attempt to describe a user credential that does not exist: \
                                 {name}"
                            )),
                            ..Default::default()
                        }
                    } else {
                        DescribeUserScramCredentialsResult {
                            user: name.clone(),
                            credential_infos: infos,
                            ..Default::default()
                        }
                    };
                    results.push(result);
                }
                results
            }
        };
        DescribeUserScramCredentialsResponse {
            results,
            ..Default::default()
        }
    }

    pub(crate) async fn handle_alter_user_scram_credentials(
        &self,
        request: AlterUserScramCredentialsRequest,
    ) -> AlterUserScramCredentialsResponse {
        let mut upsertions = Vec::with_capacity(request.upsertions.len());
        for u in &request.upsertions {
            // An unknown mechanism or bad iterations are the controller's to refuse; the
            // keys are derived only for the mechanisms there are.
            let (stored_key, server_key) = match ScramMechanism::from_kafka_type(u.mechanism) {
                Some(m) => {
                    let c = m.credential(&u.salt, &u.salted_password, u.iterations);
                    (c.stored_key, c.server_key)
                }
                None => (vec![0], vec![0]),
            };
            upsertions.push(CtlUpsertion {
                name: u.name.clone(),
                mechanism: u.mechanism,
                salt: u.salt.to_vec(),
                stored_key,
                server_key,
                iterations: u.iterations,
            });
        }
        let event = ControllerEvent::AlterUserScramCredentials(CtlAlter {
            deletions: request
                .deletions
                .iter()
                .map(|d| (d.name.clone(), d.mechanism))
                .collect(),
            upsertions,
        });
        let users: Vec<String> = {
            let mut seen: Vec<String> = Vec::new();
            for name in request
                .deletions
                .iter()
                .map(|d| &d.name)
                .chain(request.upsertions.iter().map(|u| &u.name))
            {
                if !seen.contains(name) {
                    seen.push(name.clone());
                }
            }
            seen
        };
        let results = match self.controller_call(event).await {
            Ok(ControllerResponse::AlterUserScramCredentials(results)) => results
                .into_iter()
                .map(|r| AlterUserScramCredentialsResult {
                    user: r.user,
                    error_code: r.error_code.code(),
                    error_message: r.error_message,
                    ..Default::default()
                })
                .collect(),
            Ok(_) => failed(&users, ErrorCode::UNKNOWN_SERVER_ERROR),
            Err(code) => failed(&users, code),
        };
        AlterUserScramCredentialsResponse {
            results,
            ..Default::default()
        }
    }
}

fn all_users(image: &MetadataImage) -> Vec<String> {
    let mut users: Vec<String> = image
        .scram_credentials
        .keys()
        .map(|(u, _)| u.clone())
        .collect();
    users.dedup();
    users
}

fn failed(users: &[String], code: ErrorCode) -> Vec<AlterUserScramCredentialsResult> {
    users
        .iter()
        .map(|user| AlterUserScramCredentialsResult {
            user: user.clone(),
            error_code: code.code(),
            error_message: Some(code.name().to_string()),
            ..Default::default()
        })
        .collect()
}
