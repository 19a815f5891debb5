//! Kafka's ACL nouns: [`ResourceType`], [`PatternType`], [`AclOperation`],
//! [`AclPermissionType`], the binding of a resource pattern to an access control entry
//! ([`StandardAcl`], what an `AccessControlEntryRecord` holds) and the filters that
//! DescribeAcls and DeleteAcls match bindings with ([`AclBindingFilter`]).
//!
//! The codes are Kafka's (`org.apache.kafka.common.acl`, `org.apache.kafka.common.resource`):
//! they travel on the wire and in the metadata log unchanged. A code this crate does not
//! know reads as `Unknown`, as Kafka's `fromCode` does, so that validation can refuse it
//! with Kafka's error rather than the decoder failing. Here, beside the codec, because the
//! broker, the metadata log and the clients all speak them; with the `serde` feature they
//! serialize (the controller forwards ACL changes between nodes).

use std::fmt;
use std::str::FromStr;

/// The name of the one Cluster resource (Kafka's `Resource.CLUSTER_NAME`).
pub const CLUSTER_NAME: &str = "kafka-cluster";
/// The resource name, host or principal name that matches any (Kafka's `WILDCARD`).
pub const WILDCARD: &str = "*";
/// The principal that matches any user (Kafka's `WILDCARD_PRINCIPAL`).
pub const WILDCARD_PRINCIPAL: &str = "User:*";

/// Kafka's codes and names for one of the four ACL enums, both ways. The name is the
/// Java enum constant's (`DESCRIBE_CONFIGS`); parsing also takes Kafka's command-line
/// spellings (`DescribeConfigs`, `describe-configs`), case-insensitively.
macro_rules! kafka_enum {
    ($(#[$doc:meta])* $name:ident { $($variant:ident = $code:literal, $java:literal;)+ }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
        pub enum $name {
            $($variant),+
        }

        impl $name {
            /// Every value, in code order.
            pub const ALL_VALUES: &'static [$name] = &[$($name::$variant),+];

            /// Kafka's code.
            pub fn code(self) -> i8 {
                match self {
                    $($name::$variant => $code),+
                }
            }

            /// The value of a code; an unknown code is `Unknown`, as in Kafka.
            pub fn from_code(code: i8) -> Self {
                match code {
                    $($code => $name::$variant,)+
                    _ => $name::Unknown,
                }
            }

            /// Kafka's name (the Java enum constant).
            pub fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $java),+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        impl FromStr for $name {
            type Err = String;

            fn from_str(s: &str) -> Result<Self, String> {
                let wanted = normalize(s);
                $name::ALL_VALUES
                    .iter()
                    .copied()
                    .find(|v| normalize(v.name()) == wanted)
                    .ok_or_else(|| format!("unknown {} `{s}`", stringify!($name)))
            }
        }
    };
}

fn normalize(s: &str) -> String {
    s.chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_uppercase)
        .collect()
}

kafka_enum! {
    /// What an ACL protects (Kafka's `ResourceType`).
    ResourceType {
        Unknown = 0, "UNKNOWN";
        Any = 1, "ANY";
        Topic = 2, "TOPIC";
        Group = 3, "GROUP";
        Cluster = 4, "CLUSTER";
        TransactionalId = 5, "TRANSACTIONAL_ID";
        DelegationToken = 6, "DELEGATION_TOKEN";
        User = 7, "USER";
    }
}

kafka_enum! {
    /// How an ACL's resource name matches (Kafka's `PatternType`). `Any` and `Match` are
    /// for filters only: `Any` matches any pattern type with the exact name, `Match` any
    /// pattern that would apply to the named resource.
    PatternType {
        Unknown = 0, "UNKNOWN";
        Any = 1, "ANY";
        Match = 2, "MATCH";
        Literal = 3, "LITERAL";
        Prefixed = 4, "PREFIXED";
    }
}

kafka_enum! {
    /// What a principal may do (Kafka's `AclOperation`).
    AclOperation {
        Unknown = 0, "UNKNOWN";
        Any = 1, "ANY";
        All = 2, "ALL";
        Read = 3, "READ";
        Write = 4, "WRITE";
        Create = 5, "CREATE";
        Delete = 6, "DELETE";
        Alter = 7, "ALTER";
        Describe = 8, "DESCRIBE";
        ClusterAction = 9, "CLUSTER_ACTION";
        DescribeConfigs = 10, "DESCRIBE_CONFIGS";
        AlterConfigs = 11, "ALTER_CONFIGS";
        IdempotentWrite = 12, "IDEMPOTENT_WRITE";
        CreateTokens = 13, "CREATE_TOKENS";
        DescribeTokens = 14, "DESCRIBE_TOKENS";
    }
}

kafka_enum! {
    /// Whether an ACL allows or denies (Kafka's `AclPermissionType`).
    AclPermissionType {
        Unknown = 0, "UNKNOWN";
        Any = 1, "ANY";
        Deny = 2, "DENY";
        Allow = 3, "ALLOW";
    }
}

impl ResourceType {
    /// The operations that mean something on this resource type (Kafka's
    /// `AclEntry.supportedOperations`): what KIP-430's authorized operations are made of.
    pub fn supported_operations(self) -> &'static [AclOperation] {
        use AclOperation::*;
        match self {
            ResourceType::Topic => &[
                Read,
                Write,
                Create,
                Describe,
                Delete,
                Alter,
                DescribeConfigs,
                AlterConfigs,
            ],
            ResourceType::Group => &[Read, Describe, Delete, DescribeConfigs, AlterConfigs],
            ResourceType::Cluster => &[
                Create,
                ClusterAction,
                DescribeConfigs,
                AlterConfigs,
                IdempotentWrite,
                Alter,
                Describe,
            ],
            ResourceType::TransactionalId => &[Describe, Write],
            ResourceType::DelegationToken => &[Describe],
            ResourceType::User => &[CreateTokens, DescribeTokens],
            ResourceType::Unknown | ResourceType::Any => &[],
        }
    }
}

/// One ACL: a resource pattern bound to an access control entry (Kafka's `StandardAcl`,
/// and its `AclBinding` on the wire).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct StandardAcl {
    pub resource_type: ResourceType,
    pub resource_name: String,
    pub pattern_type: PatternType,
    /// `Type:name`, e.g. `User:alice` or [`WILDCARD_PRINCIPAL`].
    pub principal: String,
    /// An IP address as Kafka writes it, or [`WILDCARD`].
    pub host: String,
    pub operation: AclOperation,
    pub permission_type: AclPermissionType,
}

impl fmt::Display for StandardAcl {
    /// Kafka's `AclBinding.toString`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "(pattern=ResourcePattern(resourceType={}, name={}, patternType={}), \
             entry=(principal={}, host={}, operation={}, permissionType={}))",
            self.resource_type,
            self.resource_name,
            self.pattern_type,
            self.principal,
            self.host,
            self.operation,
            self.permission_type
        )
    }
}

/// A filter over ACL bindings (Kafka's `AclBindingFilter`): `None` for a name, principal
/// or host matches any; `Any` for an enum matches any value.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct AclBindingFilter {
    pub resource_type: ResourceType,
    pub resource_name: Option<String>,
    pub pattern_type: PatternType,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: AclOperation,
    pub permission_type: AclPermissionType,
}

impl AclBindingFilter {
    /// The filter that matches every binding (Kafka's `AclBindingFilter.ANY`).
    pub fn any() -> Self {
        Self {
            resource_type: ResourceType::Any,
            resource_name: None,
            pattern_type: PatternType::Any,
            principal: None,
            host: None,
            operation: AclOperation::Any,
            permission_type: AclPermissionType::Any,
        }
    }

    /// A part of the filter is `Unknown`: DeleteAcls refuses it (INVALID_REQUEST).
    pub fn pattern_is_unknown(&self) -> bool {
        self.resource_type == ResourceType::Unknown || self.pattern_type == PatternType::Unknown
    }

    /// The entry part of the filter is `Unknown`.
    pub fn entry_is_unknown(&self) -> bool {
        self.operation == AclOperation::Unknown
            || self.permission_type == AclPermissionType::Unknown
    }

    /// Kafka's `AclBindingFilter.matches`: the pattern filter and the entry filter both
    /// match.
    pub fn matches(&self, acl: &StandardAcl) -> bool {
        self.matches_pattern(acl) && self.matches_entry(acl)
    }

    /// Kafka's `ResourcePatternFilter.matches`. With `Match`, a literal name matches the
    /// literal ACLs of that name and the wildcard, and the prefixed ACLs that it starts
    /// with; with `Any` or a concrete type, the name must be equal.
    fn matches_pattern(&self, acl: &StandardAcl) -> bool {
        if self.resource_type != ResourceType::Any && self.resource_type != acl.resource_type {
            return false;
        }
        if !matches!(self.pattern_type, PatternType::Any | PatternType::Match)
            && self.pattern_type != acl.pattern_type
        {
            return false;
        }
        let Some(name) = &self.resource_name else {
            return true;
        };
        if self.pattern_type == PatternType::Any || self.pattern_type == acl.pattern_type {
            return *name == acl.resource_name;
        }
        match acl.pattern_type {
            PatternType::Literal => *name == acl.resource_name || acl.resource_name == WILDCARD,
            PatternType::Prefixed => name.starts_with(&acl.resource_name),
            // Stored ACLs are literal or prefixed only (the controller refuses others).
            _ => false,
        }
    }

    /// Kafka's `AccessControlEntryFilter.matches`.
    fn matches_entry(&self, acl: &StandardAcl) -> bool {
        if self.principal.as_ref().is_some_and(|p| *p != acl.principal) {
            return false;
        }
        if self.host.as_ref().is_some_and(|h| *h != acl.host) {
            return false;
        }
        if self.operation != AclOperation::Any && self.operation != acl.operation {
            return false;
        }
        self.permission_type == AclPermissionType::Any
            || self.permission_type == acl.permission_type
    }
}

/// Whether `s` is a principal as Kafka parses one (`SecurityUtils.parseKafkaPrincipal`):
/// a type and a name around the first `:`.
pub fn is_valid_principal(s: &str) -> bool {
    s.contains(':')
}

/// A client address as Kafka's ACLs name it (Java's `InetAddress.getHostAddress`): IPv4
/// dotted, IPv6 as eight groups of lowercase hex without `::` compression, and an
/// IPv4-mapped IPv6 address as the IPv4 address it maps (Java's sockets report those as
/// IPv4 peers).
pub fn host_address(ip: std::net::IpAddr) -> String {
    match ip.to_canonical() {
        std::net::IpAddr::V4(v4) => v4.to_string(),
        std::net::IpAddr::V6(v6) => {
            let groups: Vec<String> = v6.segments().iter().map(|s| format!("{s:x}")).collect();
            groups.join(":")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(rt: ResourceType, name: &str, pt: PatternType) -> StandardAcl {
        StandardAcl {
            resource_type: rt,
            resource_name: name.into(),
            pattern_type: pt,
            principal: "User:alice".into(),
            host: "*".into(),
            operation: AclOperation::Read,
            permission_type: AclPermissionType::Allow,
        }
    }

    #[test]
    fn codes_and_names_are_kafkas() {
        assert_eq!(ResourceType::TransactionalId.code(), 5);
        assert_eq!(ResourceType::from_code(42), ResourceType::Unknown);
        assert_eq!(AclOperation::IdempotentWrite.code(), 12);
        assert_eq!(PatternType::Prefixed.code(), 4);
        assert_eq!(AclPermissionType::Allow.code(), 3);
        for op in AclOperation::ALL_VALUES {
            assert_eq!(AclOperation::from_code(op.code()), *op);
        }
        assert_eq!(
            "DescribeConfigs".parse::<AclOperation>(),
            Ok(AclOperation::DescribeConfigs)
        );
        assert_eq!(
            "transactional-id".parse::<ResourceType>(),
            Ok(ResourceType::TransactionalId)
        );
        assert_eq!("prefixed".parse::<PatternType>(), Ok(PatternType::Prefixed));
        assert!("Reed".parse::<AclOperation>().is_err());
    }

    #[test]
    fn pattern_filters_match_as_kafkas_resource_pattern_filter() {
        let literal = acl(ResourceType::Topic, "orders", PatternType::Literal);
        let prefixed = acl(ResourceType::Topic, "ord", PatternType::Prefixed);
        let wildcard = acl(ResourceType::Topic, "*", PatternType::Literal);
        let filter = |pt: PatternType, name: Option<&str>| AclBindingFilter {
            resource_type: ResourceType::Topic,
            resource_name: name.map(String::from),
            pattern_type: pt,
            ..AclBindingFilter::any()
        };
        // MATCH: everything that applies to the topic `orders`.
        let m = filter(PatternType::Match, Some("orders"));
        assert!(m.matches(&literal) && m.matches(&prefixed) && m.matches(&wildcard));
        assert!(!m.matches(&acl(ResourceType::Topic, "orders2", PatternType::Literal)));
        assert!(!m.matches(&acl(ResourceType::Group, "orders", PatternType::Literal)));
        // ANY: the exact name, whatever the pattern type.
        let a = filter(PatternType::Any, Some("ord"));
        assert!(a.matches(&prefixed) && !a.matches(&literal) && !a.matches(&wildcard));
        // A concrete type: that type and the exact name.
        let l = filter(PatternType::Literal, Some("orders"));
        assert!(l.matches(&literal) && !l.matches(&prefixed) && !l.matches(&wildcard));
        // No name: every name of the type.
        let all = filter(PatternType::Prefixed, None);
        assert!(all.matches(&prefixed) && !all.matches(&literal));
        assert!(AclBindingFilter::any().matches(&literal));
    }

    #[test]
    fn entry_filters_match_exactly_or_any() {
        let a = acl(ResourceType::Topic, "t", PatternType::Literal);
        let mut f = AclBindingFilter::any();
        f.principal = Some("User:alice".into());
        f.operation = AclOperation::Read;
        assert!(f.matches(&a));
        f.permission_type = AclPermissionType::Deny;
        assert!(!f.matches(&a));
        let mut g = AclBindingFilter::any();
        g.host = Some("10.0.0.1".into());
        assert!(!g.matches(&a), "a host filter is not a wildcard match");
    }

    #[test]
    fn host_addresses_are_written_as_java_writes_them() {
        use std::net::IpAddr;
        let v4: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(host_address(v4), "127.0.0.1");
        let v6: IpAddr = "::1".parse().unwrap();
        assert_eq!(host_address(v6), "0:0:0:0:0:0:0:1");
        let mapped: IpAddr = "::ffff:10.1.2.3".parse().unwrap();
        assert_eq!(host_address(mapped), "10.1.2.3");
    }
}
