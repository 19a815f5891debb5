//! The authorizer: Kafka's `StandardAuthorizer` semantics over the ACLs of the metadata
//! image ([`AclCache`]), pure (no I/O, no clock). The broker asks it, for every request,
//! whether the session's principal from its host may perform an operation on a resource.
//!
//! # Protocol (Kafka's `StandardAuthorizerData.authorize`)
//!
//! 1. A principal named in `super.users` may do anything, before any ACL is looked at.
//! 2. Before the image has loaded (the broker has not caught up with the metadata log),
//!    everyone else is refused: an image without its ACLs must not let
//!    `allow.everyone.if.no.acl.found` open every resource.
//! 3. The ACLs that apply to a resource are those of its type whose pattern matches its
//!    name: LITERAL with the same name, LITERAL `*`, and PREFIXED with a name the
//!    resource's name starts with.
//! 4. Of those, an ACL matches the request when its principal is the session's or
//!    `User:*`, its host is the client's address or `*`, and its operation is the one
//!    asked, or ALL, or (for an ALLOW ACL only) one that implies it: READ, WRITE, DELETE
//!    and ALTER imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS.
//! 5. Any matching DENY denies; else any matching ALLOW allows; else, when some ACL
//!    applies to the resource (whoever it names), the answer is DENIED; only a resource
//!    that no ACL applies to gets `allow.everyone.if.no.acl.found`.
//!
//! # Why the lookups are fast
//!
//! Kafka walks a set sorted by reversed resource name. Here the ACLs are kept in hash
//! maps by (resource type, name), literal and prefixed apart, with the lengths of the
//! prefixed names of each type: a lookup probes the literal name, the wildcard and one
//! prefix of the resource name per distinct prefix length, and looks only at the ACLs of
//! those names, however many others there are. The result is the same set of ACLs that
//! Kafka's walk visits, so the decision is the same.

use std::collections::{BTreeMap, HashMap, HashSet};

use rill_protocol::Uuid;

use crate::acl::{
    AclBindingFilter, AclOperation, AclPermissionType, PatternType, ResourceType, StandardAcl,
    WILDCARD, WILDCARD_PRINCIPAL,
};

/// The key `authorizer.class.name` takes to enable the authorizer, as in Kafka.
pub const STANDARD_AUTHORIZER_CLASS: &str =
    "org.apache.kafka.metadata.authorizer.StandardAuthorizer";

/// Kafka's `AuthorizationResult`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthorizationResult {
    Allowed,
    Denied,
}

/// Who asks, and from where (what the authorizer reads of Kafka's
/// `AuthorizableRequestContext`).
#[derive(Debug, Clone, Copy)]
pub struct RequestContext<'a> {
    /// `User:alice`.
    pub principal: &'a str,
    /// The client's address as [`crate::acl::host_address`] writes it.
    pub host: &'a str,
}

/// What is asked (Kafka's `Action`, on a literal resource).
#[derive(Debug, Clone, Copy)]
pub struct Action<'a> {
    pub operation: AclOperation,
    pub resource_type: ResourceType,
    pub resource_name: &'a str,
}

/// The access control entry of one stored ACL, as the lookup reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    id: Uuid,
    principal: String,
    host: String,
    operation: AclOperation,
    permission_type: AclPermissionType,
}

/// The ACLs of the metadata image: by id (what the records name) and indexed for
/// [`StandardAuthorizer::authorize`] (Kafka's `AclCache`).
#[derive(Debug, Clone, Default)]
pub struct AclCache {
    by_id: BTreeMap<Uuid, StandardAcl>,
    /// LITERAL ACLs (the wildcard `*` among them) by resource type and name.
    literal: HashMap<ResourceType, HashMap<String, Vec<Entry>>>,
    /// PREFIXED ACLs by resource type and prefix.
    prefixed: HashMap<ResourceType, HashMap<String, Vec<Entry>>>,
    /// How many distinct prefixes of each byte length each resource type has.
    prefix_lengths: HashMap<ResourceType, BTreeMap<usize, usize>>,
}

impl PartialEq for AclCache {
    /// Two caches are equal when they hold the same ACLs under the same ids; the index
    /// follows from those.
    fn eq(&self, other: &Self) -> bool {
        self.by_id == other.by_id
    }
}

impl Eq for AclCache {}

impl AclCache {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    pub fn get(&self, id: &Uuid) -> Option<&StandardAcl> {
        self.by_id.get(id)
    }

    /// Every ACL with its id, in id order.
    pub fn iter(&self) -> impl Iterator<Item = (&Uuid, &StandardAcl)> {
        self.by_id.iter()
    }

    /// Whether an equal ACL is stored (under any id).
    pub fn contains(&self, acl: &StandardAcl) -> bool {
        self.section(acl.pattern_type, acl.resource_type, &acl.resource_name)
            .is_some_and(|entries| {
                entries.iter().any(|e| {
                    e.principal == acl.principal
                        && e.host == acl.host
                        && e.operation == acl.operation
                        && e.permission_type == acl.permission_type
                })
            })
    }

    /// The ACLs a filter matches, in id order (Kafka's `acls(filter)`).
    pub fn matching<'a>(
        &'a self,
        filter: &'a AclBindingFilter,
    ) -> impl Iterator<Item = (&'a Uuid, &'a StandardAcl)> + 'a {
        self.by_id.iter().filter(|(_, acl)| filter.matches(acl))
    }

    /// Adds an ACL; `false` (and nothing changes) when the id is taken.
    pub fn add(&mut self, id: Uuid, acl: StandardAcl) -> bool {
        if self.by_id.contains_key(&id) {
            return false;
        }
        let entry = Entry {
            id,
            principal: acl.principal.clone(),
            host: acl.host.clone(),
            operation: acl.operation,
            permission_type: acl.permission_type,
        };
        let map = match acl.pattern_type {
            PatternType::Prefixed => &mut self.prefixed,
            // The controller stores LITERAL and PREFIXED only; anything else read from a
            // log is kept by id (so that it can be described and removed) and indexed
            // as literal, where a lookup by name never meets it unless the name is equal.
            _ => &mut self.literal,
        };
        let entries = map
            .entry(acl.resource_type)
            .or_default()
            .entry(acl.resource_name.clone())
            .or_default();
        if entries.is_empty() && acl.pattern_type == PatternType::Prefixed {
            *self
                .prefix_lengths
                .entry(acl.resource_type)
                .or_default()
                .entry(acl.resource_name.len())
                .or_default() += 1;
        }
        entries.push(entry);
        self.by_id.insert(id, acl);
        true
    }

    /// Removes an ACL by id, returning it.
    pub fn remove(&mut self, id: &Uuid) -> Option<StandardAcl> {
        let acl = self.by_id.remove(id)?;
        let map = match acl.pattern_type {
            PatternType::Prefixed => &mut self.prefixed,
            _ => &mut self.literal,
        };
        if let Some(names) = map.get_mut(&acl.resource_type) {
            if let Some(entries) = names.get_mut(&acl.resource_name) {
                entries.retain(|e| e.id != *id);
                if entries.is_empty() {
                    names.remove(&acl.resource_name);
                    if acl.pattern_type == PatternType::Prefixed {
                        remove_prefix_length(
                            &mut self.prefix_lengths,
                            acl.resource_type,
                            acl.resource_name.len(),
                        );
                    }
                }
            }
            if names.is_empty() {
                map.remove(&acl.resource_type);
            }
        }
        Some(acl)
    }

    fn section(&self, pattern: PatternType, rt: ResourceType, name: &str) -> Option<&[Entry]> {
        let map = match pattern {
            PatternType::Prefixed => &self.prefixed,
            _ => &self.literal,
        };
        map.get(&rt)?.get(name).map(Vec::as_slice)
    }

    /// Every entry whose pattern applies to the resource `name` of type `rt` (step 3 of
    /// the module's protocol), section by section.
    fn applicable<'a>(
        &'a self,
        rt: ResourceType,
        name: &'a str,
    ) -> impl Iterator<Item = &'a [Entry]> + 'a {
        let literal = self.literal.get(&rt);
        let exact = literal.and_then(|m| m.get(name)).map(Vec::as_slice);
        let wildcard = (name != WILDCARD)
            .then(|| literal.and_then(|m| m.get(WILDCARD)))
            .flatten()
            .map(Vec::as_slice);
        let prefixed = self.prefixed.get(&rt);
        let prefixes = self
            .prefix_lengths
            .get(&rt)
            .into_iter()
            .flat_map(move |lengths| lengths.range(..=name.len()).map(|(len, _)| *len))
            .filter(move |len| name.is_char_boundary(*len))
            .filter_map(move |len| prefixed.and_then(|m| m.get(&name[..len])))
            .map(Vec::as_slice);
        exact.into_iter().chain(wildcard).chain(prefixes)
    }
}

fn remove_prefix_length(
    lengths: &mut HashMap<ResourceType, BTreeMap<usize, usize>>,
    rt: ResourceType,
    len: usize,
) {
    if let Some(by_len) = lengths.get_mut(&rt) {
        if let Some(count) = by_len.get_mut(&len) {
            *count -= 1;
            if *count == 0 {
                by_len.remove(&len);
            }
        }
        if by_len.is_empty() {
            lengths.remove(&rt);
        }
    }
}

/// Why a decision was made (Kafka's `MatchingRule`), for the audit log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchingRule {
    SuperUser,
    /// An ACL matched: its id.
    Acl(Uuid),
    /// No ACL applies to the resource: `allow.everyone.if.no.acl.found` decided.
    Default,
    /// ACLs apply to the resource but none matched the request.
    NoMatchingAcl,
    /// The image has not loaded yet.
    NotReady,
}

/// The authorizer's configuration (Kafka's `super.users` and
/// `allow.everyone.if.no.acl.found`).
#[derive(Debug, Clone, Default)]
pub struct StandardAuthorizer {
    super_users: HashSet<String>,
    default_result_allowed: bool,
}

impl StandardAuthorizer {
    /// Reads `super.users` (principals separated by `;`) and whether a resource with no
    /// ACL is open to everyone. A super user that is not `Type:name` is refused, as
    /// Kafka refuses it at start-up.
    pub fn new(super_users: &str, allow_everyone_if_no_acl_found: bool) -> Result<Self, String> {
        let mut users = HashSet::new();
        for user in super_users
            .split(';')
            .map(str::trim)
            .filter(|u| !u.is_empty())
        {
            if !crate::acl::is_valid_principal(user) {
                return Err(format!(
                    "super.users: expected a principal as Type:name, got `{user}`"
                ));
            }
            users.insert(user.to_string());
        }
        Ok(Self {
            super_users: users,
            default_result_allowed: allow_everyone_if_no_acl_found,
        })
    }

    pub fn is_super_user(&self, principal: &str) -> bool {
        self.super_users.contains(principal)
    }

    /// Whether the request may perform the action (see the module's protocol).
    /// `loaded` is false until the image holding the ACLs has caught up.
    pub fn authorize(
        &self,
        acls: &AclCache,
        loaded: bool,
        ctx: RequestContext<'_>,
        action: Action<'_>,
    ) -> AuthorizationResult {
        self.decide(acls, loaded, ctx, action).0
    }

    /// [`StandardAuthorizer::authorize`] with the rule that decided.
    pub fn decide(
        &self,
        acls: &AclCache,
        loaded: bool,
        ctx: RequestContext<'_>,
        action: Action<'_>,
    ) -> (AuthorizationResult, MatchingRule) {
        if self.is_super_user(ctx.principal) {
            return (AuthorizationResult::Allowed, MatchingRule::SuperUser);
        }
        if !loaded {
            return (AuthorizationResult::Denied, MatchingRule::NotReady);
        }
        let mut allow = None;
        let mut has_resource_acls = false;
        for section in acls.applicable(action.resource_type, action.resource_name) {
            for entry in section {
                has_resource_acls = true;
                match find_result(action.operation, ctx, entry) {
                    Some(AuthorizationResult::Denied) => {
                        return (AuthorizationResult::Denied, MatchingRule::Acl(entry.id));
                    }
                    Some(AuthorizationResult::Allowed) => allow = Some(entry.id),
                    None => {}
                }
            }
        }
        match allow {
            Some(id) => (AuthorizationResult::Allowed, MatchingRule::Acl(id)),
            None if has_resource_acls => (AuthorizationResult::Denied, MatchingRule::NoMatchingAcl),
            None if self.default_result_allowed => {
                (AuthorizationResult::Allowed, MatchingRule::Default)
            }
            None => (AuthorizationResult::Denied, MatchingRule::Default),
        }
    }

    /// Whether the request may perform `op` on at least one resource of the type (Kafka's
    /// `Authorizer.authorizeByResourceType`, its default implementation): a literal
    /// resource that no ACL names is tried first (so super users and an open default
    /// pass), then the ALLOW ACLs of the principal are looked for one that no DENY
    /// dominates (a literal DENY of the same name, or a PREFIXED DENY of a prefix of its
    /// name); a wildcard DENY denies, a wildcard ALLOW allows.
    pub fn authorize_by_resource_type(
        &self,
        acls: &AclCache,
        loaded: bool,
        ctx: RequestContext<'_>,
        op: AclOperation,
        rt: ResourceType,
    ) -> AuthorizationResult {
        let probe = Action {
            operation: op,
            resource_type: rt,
            resource_name: "hardcode",
        };
        if self.authorize(acls, loaded, ctx, probe) == AuthorizationResult::Allowed {
            return AuthorizationResult::Allowed;
        }
        if !loaded {
            return AuthorizationResult::Denied;
        }
        let mut deny_literal: HashSet<&str> = HashSet::new();
        let mut deny_prefixed: HashSet<&str> = HashSet::new();
        let mut allow_literal: Vec<&str> = Vec::new();
        let mut allow_prefixed: Vec<&str> = Vec::new();
        let mut wildcard_allow = false;
        for (pattern, map) in [
            (PatternType::Literal, acls.literal.get(&rt)),
            (PatternType::Prefixed, acls.prefixed.get(&rt)),
        ] {
            for (name, entries) in map.into_iter().flatten() {
                for e in entries {
                    if e.host != ctx.host && e.host != WILDCARD {
                        continue;
                    }
                    if e.principal != ctx.principal && e.principal != WILDCARD_PRINCIPAL {
                        continue;
                    }
                    if e.operation != op && e.operation != AclOperation::All {
                        continue;
                    }
                    let literal = pattern == PatternType::Literal;
                    match e.permission_type {
                        AclPermissionType::Deny if literal && name == WILDCARD => {
                            return AuthorizationResult::Denied;
                        }
                        AclPermissionType::Deny if literal => {
                            deny_literal.insert(name);
                        }
                        AclPermissionType::Deny => {
                            deny_prefixed.insert(name);
                        }
                        AclPermissionType::Allow if literal && name == WILDCARD => {
                            wildcard_allow = true;
                        }
                        AclPermissionType::Allow if literal => allow_literal.push(name),
                        AclPermissionType::Allow => allow_prefixed.push(name),
                        _ => {}
                    }
                }
            }
        }
        if wildcard_allow {
            return AuthorizationResult::Allowed;
        }
        let dominated = |name: &str| {
            name.char_indices()
                .map(|(i, c)| &name[..i + c.len_utf8()])
                .any(|prefix| deny_prefixed.contains(prefix))
        };
        let literal_ok = allow_literal
            .iter()
            .any(|name| !deny_literal.contains(name) && !dominated(name));
        if literal_ok || allow_prefixed.iter().any(|name| !dominated(name)) {
            AuthorizationResult::Allowed
        } else {
            AuthorizationResult::Denied
        }
    }

    /// The operations of `rt`'s supported set that the request may perform on the
    /// resource, as KIP-430's bit field (bit `1 << code` per operation).
    pub fn authorized_operations(
        &self,
        acls: &AclCache,
        loaded: bool,
        ctx: RequestContext<'_>,
        rt: ResourceType,
        name: &str,
    ) -> i32 {
        rt.supported_operations()
            .iter()
            .filter(|op| {
                let action = Action {
                    operation: **op,
                    resource_type: rt,
                    resource_name: name,
                };
                self.authorize(acls, loaded, ctx, action) == AuthorizationResult::Allowed
            })
            .fold(0, |bits, op| bits | operation_bit(*op))
    }
}

/// KIP-430's bit for one operation.
pub fn operation_bit(op: AclOperation) -> i32 {
    1i32 << op.code()
}

/// The bit field of every operation a resource type supports: what KIP-430 answers when
/// no authorizer is configured (Kafka's `AuthHelper.authorizedOperations` without one).
pub fn all_operations(rt: ResourceType) -> i32 {
    rt.supported_operations()
        .iter()
        .fold(0, |bits, op| bits | operation_bit(*op))
}

/// Step 4 of the module's protocol for one entry whose resource pattern applies: `None`
/// when it does not match the request.
fn find_result(
    op: AclOperation,
    ctx: RequestContext<'_>,
    entry: &Entry,
) -> Option<AuthorizationResult> {
    if entry.principal != ctx.principal && entry.principal != WILDCARD_PRINCIPAL {
        return None;
    }
    if entry.host != WILDCARD && entry.host != ctx.host {
        return None;
    }
    let allow = entry.permission_type == AclPermissionType::Allow;
    if entry.operation != AclOperation::All {
        let implied = if allow {
            match op {
                AclOperation::Describe => matches!(
                    entry.operation,
                    AclOperation::Describe
                        | AclOperation::Read
                        | AclOperation::Write
                        | AclOperation::Delete
                        | AclOperation::Alter
                ),
                AclOperation::DescribeConfigs => matches!(
                    entry.operation,
                    AclOperation::DescribeConfigs | AclOperation::AlterConfigs
                ),
                _ => entry.operation == op,
            }
        } else {
            entry.operation == op
        };
        if !implied {
            return None;
        }
    }
    match entry.permission_type {
        AclPermissionType::Allow => Some(AuthorizationResult::Allowed),
        AclPermissionType::Deny => Some(AuthorizationResult::Denied),
        // Not stored by the controller; an entry of another type matches nothing.
        _ => None,
    }
}

#[cfg(test)]
mod tests;
