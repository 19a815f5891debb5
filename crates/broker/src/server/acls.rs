//! DescribeAcls, CreateAcls and DeleteAcls (Kafka's `AclApis`).
//!
//! DescribeAcls answers from this broker's image; CreateAcls and DeleteAcls go to the
//! controller (`rill_metadata`'s ACL control), which validates them and writes
//! `AccessControlEntryRecord`s and `RemoveAccessControlEntryRecord`s, so that every broker
//! applies the same ACLs. Without an authorizer the three answer SECURITY_DISABLED, as
//! Kafka does. The cluster operation each needs (DESCRIBE, ALTER) is checked by the
//! request gates before these run.
//!
//! A filter or creation with a field of code 0 (Kafka's UNKNOWN) closes the connection:
//! Kafka's request classes refuse it while parsing, before any handler, and a request that
//! does not parse closes the connection there. An unrecognised code is read as UNKNOWN
//! after that point, and the controller answers it with INVALID_REQUEST.

use std::collections::BTreeMap;

use rill_metadata::{
    AclBindingFilter, AclOperation, AclPermissionType, ControllerEvent, ControllerResponse,
    CreateAclsRequest as CtlCreate, DeleteAclsRequest as CtlDelete, PatternType, ResourceType,
    StandardAcl,
};
use rill_protocol::generated::create_acls_request::CreateAclsRequest;
use rill_protocol::generated::create_acls_response::{AclCreationResult, CreateAclsResponse};
use rill_protocol::generated::delete_acls_request::{DeleteAclsFilter, DeleteAclsRequest};
use rill_protocol::generated::delete_acls_response::{
    DeleteAclsFilterResult, DeleteAclsMatchingAcl, DeleteAclsResponse,
};
use rill_protocol::generated::describe_acls_request::DescribeAclsRequest;
use rill_protocol::generated::describe_acls_response::{
    AclDescription, DescribeAclsResource, DescribeAclsResponse,
};
use rill_protocol::generated::RequestBody;
use rill_protocol::ErrorCode;

use crate::server::Broker;

const UNKNOWN: i8 = 0;

/// Kafka's parse-time checks of the three requests (see the module docs): `Err` closes
/// the connection.
pub(crate) fn validate(request: &RequestBody) -> Result<(), String> {
    let unknown = |fields: [i8; 4]| fields.contains(&UNKNOWN);
    match request {
        RequestBody::DescribeAcls(r)
            if unknown([
                r.resource_type_filter,
                r.pattern_type_filter,
                r.operation,
                r.permission_type,
            ]) =>
        {
            Err("DescribeAclsRequest contains UNKNOWN elements".into())
        }
        RequestBody::CreateAcls(r)
            if r.creations.iter().any(|c| {
                unknown([
                    c.resource_type,
                    c.resource_pattern_type,
                    c.operation,
                    c.permission_type,
                ])
            }) =>
        {
            Err("CreatableAcls contain unknown elements".into())
        }
        RequestBody::DeleteAcls(r)
            if r.filters.iter().any(|f| {
                unknown([
                    f.resource_type_filter,
                    f.pattern_type_filter,
                    f.operation,
                    f.permission_type,
                ])
            }) =>
        {
            Err("Filters contain UNKNOWN elements".into())
        }
        _ => Ok(()),
    }
}

fn describe_filter(r: &DescribeAclsRequest) -> AclBindingFilter {
    AclBindingFilter {
        resource_type: ResourceType::from_code(r.resource_type_filter),
        resource_name: r.resource_name_filter.clone(),
        pattern_type: PatternType::from_code(r.pattern_type_filter),
        principal: r.principal_filter.clone(),
        host: r.host_filter.clone(),
        operation: AclOperation::from_code(r.operation),
        permission_type: AclPermissionType::from_code(r.permission_type),
    }
}

fn delete_filter(f: &DeleteAclsFilter) -> AclBindingFilter {
    AclBindingFilter {
        resource_type: ResourceType::from_code(f.resource_type_filter),
        resource_name: f.resource_name_filter.clone(),
        pattern_type: PatternType::from_code(f.pattern_type_filter),
        principal: f.principal_filter.clone(),
        host: f.host_filter.clone(),
        operation: AclOperation::from_code(f.operation),
        permission_type: AclPermissionType::from_code(f.permission_type),
    }
}

/// The bindings grouped by resource pattern, as DescribeAcls answers them.
fn resources<'a>(acls: impl Iterator<Item = &'a StandardAcl>) -> Vec<DescribeAclsResource> {
    let mut by_pattern: BTreeMap<(i8, &str, i8), Vec<AclDescription>> = BTreeMap::new();
    for acl in acls {
        by_pattern
            .entry((
                acl.resource_type.code(),
                acl.resource_name.as_str(),
                acl.pattern_type.code(),
            ))
            .or_default()
            .push(AclDescription {
                principal: acl.principal.clone(),
                host: acl.host.clone(),
                operation: acl.operation.code(),
                permission_type: acl.permission_type.code(),
                ..Default::default()
            });
    }
    by_pattern
        .into_iter()
        .map(
            |((resource_type, name, pattern_type), acls)| DescribeAclsResource {
                resource_type,
                resource_name: name.to_string(),
                pattern_type,
                acls,
                ..Default::default()
            },
        )
        .collect()
}

impl Broker {
    pub(crate) fn handle_describe_acls(&self, r: DescribeAclsRequest) -> DescribeAclsResponse {
        if self.authorizer.is_none() {
            return DescribeAclsResponse {
                error_code: ErrorCode::SECURITY_DISABLED.code(),
                error_message: Some("No Authorizer is configured on the broker".into()),
                ..Default::default()
            };
        }
        let filter = describe_filter(&r);
        let image = self.image();
        DescribeAclsResponse {
            resources: resources(image.acls.matching(&filter).map(|(_, acl)| acl)),
            ..Default::default()
        }
    }

    pub(crate) async fn handle_create_acls(&self, r: CreateAclsRequest) -> CreateAclsResponse {
        let failed = |code: ErrorCode, message: &str| CreateAclsResponse {
            results: r
                .creations
                .iter()
                .map(|_| AclCreationResult {
                    error_code: code.code(),
                    error_message: Some(message.to_string()),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        if self.authorizer.is_none() {
            return failed(ErrorCode::SECURITY_DISABLED, "No Authorizer is configured.");
        }
        let creations = r
            .creations
            .iter()
            .map(|c| StandardAcl {
                resource_type: ResourceType::from_code(c.resource_type),
                resource_name: c.resource_name.clone(),
                pattern_type: PatternType::from_code(c.resource_pattern_type),
                principal: c.principal.clone(),
                host: c.host.clone(),
                operation: AclOperation::from_code(c.operation),
                permission_type: AclPermissionType::from_code(c.permission_type),
            })
            .collect();
        match self
            .controller_call(ControllerEvent::CreateAcls(CtlCreate { creations }))
            .await
        {
            Ok(ControllerResponse::CreateAcls(results)) => CreateAclsResponse {
                results: results
                    .into_iter()
                    .map(|r| AclCreationResult {
                        error_code: r.error_code.code(),
                        error_message: r.error_message,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            },
            Ok(_) => failed(
                ErrorCode::UNKNOWN_SERVER_ERROR,
                "unexpected controller answer",
            ),
            Err(code) => failed(code, code.name()),
        }
    }

    pub(crate) async fn handle_delete_acls(&self, r: DeleteAclsRequest) -> DeleteAclsResponse {
        let failed = |code: ErrorCode, message: &str| DeleteAclsResponse {
            filter_results: r
                .filters
                .iter()
                .map(|_| DeleteAclsFilterResult {
                    error_code: code.code(),
                    error_message: Some(message.to_string()),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        if self.authorizer.is_none() {
            return failed(ErrorCode::SECURITY_DISABLED, "No Authorizer is configured.");
        }
        let filters = r.filters.iter().map(delete_filter).collect();
        match self
            .controller_call(ControllerEvent::DeleteAcls(CtlDelete { filters }))
            .await
        {
            Ok(ControllerResponse::DeleteAcls(results)) => DeleteAclsResponse {
                filter_results: results
                    .into_iter()
                    .map(|r| DeleteAclsFilterResult {
                        error_code: r.error_code.code(),
                        error_message: r.error_message,
                        matching_acls: r
                            .deleted
                            .into_iter()
                            .map(|acl| DeleteAclsMatchingAcl {
                                resource_type: acl.resource_type.code(),
                                resource_name: acl.resource_name,
                                pattern_type: acl.pattern_type.code(),
                                principal: acl.principal,
                                host: acl.host,
                                operation: acl.operation.code(),
                                permission_type: acl.permission_type.code(),
                                ..Default::default()
                            })
                            .collect(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            },
            Ok(_) => failed(
                ErrorCode::UNKNOWN_SERVER_ERROR,
                "unexpected controller answer",
            ),
            Err(code) => failed(code, code.name()),
        }
    }
}
