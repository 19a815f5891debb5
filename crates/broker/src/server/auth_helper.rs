//! The server's one door to the authorizer (Kafka's `AuthHelper`): [`Authz`], who sent a
//! request and the ACLs it is judged by, with the checks the request gates
//! (`request_authorization`) and handlers make.
//!
//! Without `authorizer.class.name` every check passes and KIP-430's authorized operations
//! are every operation the resource type supports, as in Kafka. With it, each check asks
//! the `StandardAuthorizer` of `rill-metadata` about the session's principal from its
//! host, against the ACLs of one image taken when the request arrived, so that a request
//! is judged by one set of ACLs throughout.
//!
//! A broker is recognised as Kafka recognises one: by its principal, which must hold
//! CLUSTER_ACTION on the cluster (usually through `super.users`) on the listener it uses
//! (`inter.broker.listener.name`). Follower fetches, OffsetForLeaderEpoch for every
//! partition, WriteTxnMarkers and the brokers' AddPartitionsToTxn need it.

use std::sync::Arc;

use rill_metadata::authorizer::all_operations;
use rill_metadata::{
    AclOperation, Action, AuthorizationResult, MetadataImage, RequestContext, ResourceType,
    StandardAuthorizer, CLUSTER_NAME,
};

use crate::network::Session;
use crate::server::Broker;

/// Who sent one request, and the ACLs it is judged by. Cheap to clone: a patch that
/// checks a response after its handler ran takes a clone with it.
#[derive(Clone)]
pub(crate) struct Authz {
    authorizer: Option<Arc<StandardAuthorizer>>,
    image: Arc<MetadataImage>,
    /// The image holds this broker's own registration: it has caught up with the metadata
    /// log, ACLs included.
    loaded: bool,
    principal: Arc<str>,
    host: Arc<str>,
}

impl Broker {
    /// The authorization context of a request on `session`.
    pub(crate) fn authz(&self, session: &Session) -> Authz {
        let image = self.image();
        let loaded = image
            .broker(self.node_id)
            .is_some_and(|b| b.incarnation_id == self.incarnation_id);
        Authz {
            authorizer: self.authorizer.clone(),
            image,
            loaded,
            principal: session.principal.clone(),
            host: session.host.clone(),
        }
    }
}

impl Authz {
    /// An authorizer is configured.
    pub(crate) fn enabled(&self) -> bool {
        self.authorizer.is_some()
    }

    fn ctx(&self) -> RequestContext<'_> {
        RequestContext {
            principal: &self.principal,
            host: &self.host,
        }
    }

    /// The image the request is judged by.
    pub(crate) fn image(&self) -> &MetadataImage {
        &self.image
    }

    /// [`Authz::authorize`] of `op` on resources of type `rt`, to call later.
    pub(crate) fn checker(
        &self,
        op: AclOperation,
        rt: ResourceType,
    ) -> impl Fn(&str) -> bool + Send + 'static {
        let a = self.clone();
        move |name| a.authorize(op, rt, name)
    }

    /// The topics of the image the principal may DESCRIBE.
    pub(crate) fn describable_topics(&self) -> std::collections::HashSet<String> {
        self.image
            .topics_by_name
            .keys()
            .filter(|n| self.topic(AclOperation::Describe, n))
            .cloned()
            .collect()
    }

    /// Whether the request may perform `op` on the literal resource `name` of type `rt`.
    pub(crate) fn authorize(&self, op: AclOperation, rt: ResourceType, name: &str) -> bool {
        let Some(authorizer) = &self.authorizer else {
            return true;
        };
        let action = Action {
            operation: op,
            resource_type: rt,
            resource_name: name,
        };
        let (result, rule) = authorizer.decide(&self.image.acls, self.loaded, self.ctx(), action);
        if result == AuthorizationResult::Denied {
            tracing::debug!(
                target: "rill::authorizer",
                principal = &*self.principal,
                host = %self.host,
                operation = %op,
                resource = %format_args!("{rt}:LITERAL:{name}"),
                rule = ?rule,
                "denied"
            );
        }
        result == AuthorizationResult::Allowed
    }

    /// [`Authz::authorize`] on the cluster resource.
    pub(crate) fn cluster(&self, op: AclOperation) -> bool {
        self.authorize(op, ResourceType::Cluster, CLUSTER_NAME)
    }

    pub(crate) fn topic(&self, op: AclOperation, name: &str) -> bool {
        self.authorize(op, ResourceType::Topic, name)
    }

    pub(crate) fn group(&self, op: AclOperation, name: &str) -> bool {
        self.authorize(op, ResourceType::Group, name)
    }

    pub(crate) fn transactional_id(&self, op: AclOperation, name: &str) -> bool {
        self.authorize(op, ResourceType::TransactionalId, name)
    }

    /// The request comes from a broker: its principal may CLUSTER_ACTION (always true
    /// without an authorizer, as in Kafka).
    pub(crate) fn is_broker(&self) -> bool {
        self.cluster(AclOperation::ClusterAction)
    }

    /// Whether the request may perform `op` on some resource of type `rt` (Kafka's
    /// `authorizeByResourceType`).
    pub(crate) fn any_of_type(&self, op: AclOperation, rt: ResourceType) -> bool {
        let Some(authorizer) = &self.authorizer else {
            return true;
        };
        authorizer.authorize_by_resource_type(&self.image.acls, self.loaded, self.ctx(), op, rt)
            == AuthorizationResult::Allowed
    }

    /// KIP-430's authorized operations on a resource.
    pub(crate) fn operations(&self, rt: ResourceType, name: &str) -> i32 {
        match &self.authorizer {
            None => all_operations(rt),
            Some(authorizer) => authorizer.authorized_operations(
                &self.image.acls,
                self.loaded,
                self.ctx(),
                rt,
                name,
            ),
        }
    }

    /// KIP-430's cluster operations, when asked for: none unless DESCRIBE is allowed.
    pub(crate) fn cluster_operations(&self) -> i32 {
        if self.cluster(AclOperation::Describe) {
            self.operations(ResourceType::Cluster, CLUSTER_NAME)
        } else {
            0
        }
    }
}
