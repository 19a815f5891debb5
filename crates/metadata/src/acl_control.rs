//! CreateAcls and DeleteAcls as the controller decides them (Kafka's `AclControlManager`,
//! with the checks its `AclApis` makes first): records out, one result per creation or
//! filter, pure like the rest of the controller.
//!
//! - A creation is refused with INVALID_REQUEST when its Cluster resource is not named
//!   `kafka-cluster`, its name is empty, its resource type is UNKNOWN or ANY, its pattern
//!   type is not LITERAL or PREFIXED, its operation is UNKNOWN or ANY, its permission is
//!   not ALLOW or DENY, or its principal is not `Type:name`; the others succeed, and a
//!   binding already stored (or named twice) is stored once.
//! - A filter with an UNKNOWN part is INVALID_REQUEST; the others delete every stored
//!   binding they match (a binding two filters match is in both results and removed
//!   once). One request writes at most [`MAX_RECORDS_PER_USER_OP`] records: creations
//!   past that are refused one by one and a filter matching more fails (Kafka fails the
//!   whole creation request instead).

use std::collections::BTreeSet;

use rill_protocol::{ErrorCode, Uuid};

use crate::acl::{
    is_valid_principal, AclOperation, AclPermissionType, PatternType, ResourceType, StandardAcl,
    CLUSTER_NAME,
};
use crate::api::{
    AclCreateResult, AclDeleteResult, ControllerResponse, ControllerResult, CreateAclsRequest,
    DeleteAclsRequest,
};
use crate::controller::Scratch;
use crate::image::{acl_record, MetadataImage};
use crate::record::MetadataRecord;

/// The most records one request may write (Kafka's `QuorumController.MAX_RECORDS_PER_USER_OP`).
pub const MAX_RECORDS_PER_USER_OP: usize = 10_000;

/// Why a new binding is refused, with Kafka's message.
fn validate_new_acl(acl: &StandardAcl) -> Result<(), String> {
    if acl.resource_type == ResourceType::Cluster && acl.resource_name != CLUSTER_NAME {
        return Err(format!(
            "The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
        ));
    }
    if acl.resource_name.is_empty() {
        return Err("Invalid empty resource name".into());
    }
    if matches!(acl.resource_type, ResourceType::Unknown | ResourceType::Any) {
        return Err(format!("Invalid resourceType {}", acl.resource_type));
    }
    if !matches!(
        acl.pattern_type,
        PatternType::Literal | PatternType::Prefixed
    ) {
        return Err(format!("Invalid patternType {}", acl.pattern_type));
    }
    if matches!(acl.operation, AclOperation::Unknown | AclOperation::Any) {
        return Err(format!("Invalid operation {}", acl.operation));
    }
    if !matches!(
        acl.permission_type,
        AclPermissionType::Allow | AclPermissionType::Deny
    ) {
        return Err(format!("Invalid permissionType {}", acl.permission_type));
    }
    if !is_valid_principal(&acl.principal) {
        return Err(format!(
            "Could not parse principal from `{}` (no colon is present separating the \
             principal type from the principal name)",
            acl.principal
        ));
    }
    Ok(())
}

pub(crate) fn create_acls(
    req: CreateAclsRequest,
    image: &MetadataImage,
    new_id: &mut dyn FnMut(&MetadataImage) -> Uuid,
) -> ControllerResult {
    let mut s = Scratch::new(image);
    let mut results = Vec::with_capacity(req.creations.len());
    let mut written = 0usize;
    for acl in req.creations {
        if let Err(message) = validate_new_acl(&acl) {
            results.push(AclCreateResult {
                error_code: ErrorCode::INVALID_REQUEST,
                error_message: Some(message),
            });
            continue;
        }
        if !s.image().acls.contains(&acl) {
            if written == MAX_RECORDS_PER_USER_OP {
                results.push(AclCreateResult {
                    error_code: ErrorCode::INVALID_REQUEST,
                    error_message: Some(format!(
                        "Cannot create more than {MAX_RECORDS_PER_USER_OP} acls in a single \
                         request"
                    )),
                });
                continue;
            }
            let id = new_id(s.image());
            s.emit(MetadataRecord::AccessControlEntry(acl_record(id, &acl)));
            written += 1;
        }
        results.push(AclCreateResult {
            error_code: ErrorCode::NONE,
            error_message: None,
        });
    }
    s.finish(ControllerResponse::CreateAcls(results))
}

pub(crate) fn delete_acls(req: DeleteAclsRequest, image: &MetadataImage) -> ControllerResult {
    use rill_protocol::generated::metadata::RemoveAccessControlEntryRecord;
    let mut removed: BTreeSet<Uuid> = BTreeSet::new();
    let mut results = Vec::with_capacity(req.filters.len());
    for filter in &req.filters {
        let fail = |message: &str| AclDeleteResult {
            error_code: ErrorCode::INVALID_REQUEST,
            error_message: Some(message.to_string()),
            deleted: Vec::new(),
        };
        if filter.pattern_is_unknown() {
            results.push(fail("Unknown patternFilter."));
            continue;
        }
        if filter.entry_is_unknown() {
            results.push(fail("Unknown entryFilter."));
            continue;
        }
        // Matched against the ACLs as they are before this request, as Kafka does.
        let matched: Vec<(&Uuid, &StandardAcl)> = image.acls.matching(filter).collect();
        if matched.len() > MAX_RECORDS_PER_USER_OP {
            results.push(AclDeleteResult {
                error_code: ErrorCode::UNKNOWN_SERVER_ERROR,
                error_message: Some(format!(
                    "Cannot remove more than {MAX_RECORDS_PER_USER_OP} acls in a single delete \
                     operation."
                )),
                deleted: Vec::new(),
            });
            continue;
        }
        removed.extend(matched.iter().map(|(id, _)| **id));
        results.push(AclDeleteResult {
            error_code: ErrorCode::NONE,
            error_message: None,
            deleted: matched.into_iter().map(|(_, acl)| acl.clone()).collect(),
        });
    }
    let mut s = Scratch::new(image);
    for id in removed {
        s.emit(MetadataRecord::RemoveAccessControlEntry(
            RemoveAccessControlEntryRecord {
                id,
                ..Default::default()
            },
        ));
    }
    s.finish(ControllerResponse::DeleteAcls(results))
}
