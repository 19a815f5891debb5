//! ACLs on the admin client: CreateAcls and DeleteAcls (sent to the controller, as
//! Kafka's admin client sends them) and DescribeAcls (any broker: each answers from its
//! own image of the metadata log). The bindings and filters are `rill-protocol`'s
//! [`StandardAcl`] and [`AclBindingFilter`], Kafka's `AclBinding` and `AclBindingFilter`.

use rill_protocol::acl::{
    AclBindingFilter, AclOperation, AclPermissionType, PatternType, ResourceType, StandardAcl,
};
use rill_protocol::generated::create_acls_request::AclCreation;
use rill_protocol::generated::delete_acls_request::DeleteAclsFilter;
use rill_protocol::generated::{CreateAclsRequest, DeleteAclsRequest, DescribeAclsRequest};

use super::Admin;
use crate::error::{check, Result};

/// Kafka 4.1 offers versions 1 to 3 of the three; 3 adds nothing a client must send.
const ACLS_VERSION: i16 = 3;

impl Admin {
    /// Creates ACL bindings (CreateAcls): per binding, in order, `Ok(())` or the error the
    /// controller gave it (INVALID_REQUEST for a bad binding, SECURITY_DISABLED when the
    /// cluster has no authorizer, CLUSTER_AUTHORIZATION_FAILED without ALTER on it).
    pub async fn create_acls(&self, acls: &[StandardAcl]) -> Result<Vec<Result<()>>> {
        let request = CreateAclsRequest {
            creations: acls
                .iter()
                .map(|a| AclCreation {
                    resource_type: a.resource_type.code(),
                    resource_name: a.resource_name.clone(),
                    resource_pattern_type: a.pattern_type.code(),
                    principal: a.principal.clone(),
                    host: a.host.clone(),
                    operation: a.operation.code(),
                    permission_type: a.permission_type.code(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let response = self.send_controller(&request, ACLS_VERSION).await?;
        Ok(response
            .results
            .into_iter()
            .zip(acls)
            .map(|(r, acl)| {
                check(r.error_code, || match r.error_message {
                    Some(m) => format!("creating ACL {acl}: {m}"),
                    None => format!("creating ACL {acl}"),
                })
            })
            .collect())
    }

    /// The ACL bindings a filter matches (DescribeAcls).
    pub async fn describe_acls(&self, filter: &AclBindingFilter) -> Result<Vec<StandardAcl>> {
        let request = DescribeAclsRequest {
            resource_type_filter: filter.resource_type.code(),
            resource_name_filter: filter.resource_name.clone(),
            pattern_type_filter: filter.pattern_type.code(),
            principal_filter: filter.principal.clone(),
            host_filter: filter.host.clone(),
            operation: filter.operation.code(),
            permission_type: filter.permission_type.code(),
            ..Default::default()
        };
        let response = self.net.send_any(&request, ACLS_VERSION).await?;
        let message = response.error_message;
        check(response.error_code, || match message {
            Some(m) => format!("describing ACLs: {m}"),
            None => "describing ACLs".to_string(),
        })?;
        Ok(response
            .resources
            .into_iter()
            .flat_map(|r| {
                let (rt, name, pt) = (r.resource_type, r.resource_name, r.pattern_type);
                r.acls.into_iter().map(move |a| StandardAcl {
                    resource_type: ResourceType::from_code(rt),
                    resource_name: name.clone(),
                    pattern_type: PatternType::from_code(pt),
                    principal: a.principal,
                    host: a.host,
                    operation: AclOperation::from_code(a.operation),
                    permission_type: AclPermissionType::from_code(a.permission_type),
                })
            })
            .collect())
    }

    /// Deletes the ACL bindings each filter matches (DeleteAcls): per filter, in order,
    /// the bindings it deleted or its error.
    pub async fn delete_acls(
        &self,
        filters: &[AclBindingFilter],
    ) -> Result<Vec<Result<Vec<StandardAcl>>>> {
        let request = DeleteAclsRequest {
            filters: filters
                .iter()
                .map(|f| DeleteAclsFilter {
                    resource_type_filter: f.resource_type.code(),
                    resource_name_filter: f.resource_name.clone(),
                    pattern_type_filter: f.pattern_type.code(),
                    principal_filter: f.principal.clone(),
                    host_filter: f.host.clone(),
                    operation: f.operation.code(),
                    permission_type: f.permission_type.code(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let response = self.send_controller(&request, ACLS_VERSION).await?;
        Ok(response
            .filter_results
            .into_iter()
            .map(|r| {
                check(r.error_code, || match r.error_message {
                    Some(m) => format!("deleting ACLs: {m}"),
                    None => "deleting ACLs".to_string(),
                })?;
                Ok(r.matching_acls
                    .into_iter()
                    .map(|m| StandardAcl {
                        resource_type: ResourceType::from_code(m.resource_type),
                        resource_name: m.resource_name,
                        pattern_type: PatternType::from_code(m.pattern_type),
                        principal: m.principal,
                        host: m.host,
                        operation: AclOperation::from_code(m.operation),
                        permission_type: AclPermissionType::from_code(m.permission_type),
                    })
                    .collect())
            })
            .collect())
    }
}
