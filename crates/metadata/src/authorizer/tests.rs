//! The authorizer's cases, after Kafka's `StandardAuthorizerTest` and the
//! `authorizeByResourceType` cases of its `AuthorizerTest`, and a property test that the
//! indexed lookup decides as a scan over every ACL does.

use proptest::prelude::*;

use super::*;
use crate::acl::{
    AclOperation::*, AclPermissionType::*, PatternType::*, ResourceType::*, CLUSTER_NAME,
};

const LOCALHOST: &str = "127.0.0.1";

fn acl(
    rt: ResourceType,
    name: &str,
    pt: PatternType,
    principal: &str,
    host: &str,
    op: AclOperation,
    perm: AclPermissionType,
) -> StandardAcl {
    StandardAcl {
        resource_type: rt,
        resource_name: name.into(),
        pattern_type: pt,
        principal: principal.into(),
        host: host.into(),
        operation: op,
        permission_type: perm,
    }
}

fn cache(acls: &[StandardAcl]) -> AclCache {
    let mut c = AclCache::new();
    for (i, a) in acls.iter().enumerate() {
        assert!(c.add(Uuid::from_u64_pair(1, i as u64 + 1), a.clone()));
    }
    c
}

fn authorizer() -> StandardAuthorizer {
    StandardAuthorizer::new("User:superman", false).unwrap()
}

fn user(name: &str) -> String {
    format!("User:{name}")
}

/// The results for one principal from `host` of several actions.
fn check(
    a: &StandardAuthorizer,
    c: &AclCache,
    principal: &str,
    host: &str,
    actions: &[(AclOperation, ResourceType, &str)],
) -> Vec<AuthorizationResult> {
    let p = user(principal);
    let ctx = RequestContext {
        principal: &p,
        host,
    };
    actions
        .iter()
        .map(|(op, rt, name)| {
            a.authorize(
                c,
                true,
                ctx,
                Action {
                    operation: *op,
                    resource_type: *rt,
                    resource_name: name,
                },
            )
        })
        .collect()
}

use AuthorizationResult::{Allowed as A, Denied as D};

#[test]
fn super_users_are_read_from_the_config_and_bypass_every_acl() {
    let a = StandardAuthorizer::new(" User:alice ; User:chris;;", false).unwrap();
    assert!(a.is_super_user("User:alice") && a.is_super_user("User:chris"));
    assert!(!a.is_super_user("User:bob"));
    assert!(StandardAuthorizer::new("alice", false).is_err());
    let c = cache(&[acl(Topic, "*", Literal, "User:*", "*", All, Deny)]);
    assert_eq!(
        check(&a, &c, "alice", LOCALHOST, &[(Write, Topic, "t")]),
        [A]
    );
    assert_eq!(check(&a, &c, "bob", LOCALHOST, &[(Write, Topic, "t")]), [D]);
    // Before the image has loaded only super users pass.
    let ctx = RequestContext {
        principal: "User:chris",
        host: LOCALHOST,
    };
    let action = Action {
        operation: Read,
        resource_type: Topic,
        resource_name: "x",
    };
    assert_eq!(a.authorize(&c, false, ctx, action), A);
    let open = StandardAuthorizer::new("", true).unwrap();
    let bob = RequestContext {
        principal: "User:bob",
        host: LOCALHOST,
    };
    assert_eq!(
        open.decide(&AclCache::new(), false, bob, action),
        (D, MatchingRule::NotReady)
    );
}

#[test]
fn allow_everyone_if_no_acl_found_applies_only_to_resources_without_acls() {
    let acls = [acl(
        Topic,
        "topic1",
        Literal,
        "User:Alice",
        "*",
        Read,
        Allow,
    )];
    let c = cache(&acls);
    let open = StandardAuthorizer::new("User:alice;User:chris", true).unwrap();
    let actions = [(Read, Topic, "topic1"), (Read, Topic, "topic2")];
    assert_eq!(check(&open, &c, "Bob", LOCALHOST, &actions), [D, A]);
    let closed = StandardAuthorizer::new("User:alice;User:chris", false).unwrap();
    assert_eq!(check(&closed, &c, "Bob", LOCALHOST, &actions), [D, D]);
}

fn foo_acl(op: AclOperation, perm: AclPermissionType) -> StandardAcl {
    acl(Topic, "foo_", Prefixed, "User:bob", "*", op, perm)
}

fn one(op: AclOperation, principal: &str, rt: ResourceType, name: &str, a: StandardAcl) -> bool {
    let p = user(principal);
    let ctx = RequestContext {
        principal: &p,
        host: LOCALHOST,
    };
    // The entry's own result, as Kafka's `findResult` gives it: `None` is "no match".
    let mut c = AclCache::new();
    c.add(Uuid::from_u64_pair(9, 9), a);
    let entries: Vec<&Entry> = c.applicable(rt, name).flatten().collect();
    assert_eq!(entries.len(), 1, "the ACL applies to {name}");
    find_result(op, ctx, entries[0]).is_some()
}

#[test]
fn allow_acls_imply_describe_and_describe_configs_deny_acls_do_not() {
    for op in [Describe, Read, Write, Delete, Alter] {
        let c = cache(&[foo_acl(op, Allow)]);
        assert_eq!(
            check(
                &authorizer(),
                &c,
                "bob",
                LOCALHOST,
                &[(Describe, Topic, "foo_bar")]
            ),
            [A],
            "{op} implies DESCRIBE"
        );
    }
    assert!(!one(
        Describe,
        "bob",
        Topic,
        "foo_bar",
        foo_acl(Create, Allow)
    ));
    for op in [Read, Write, Delete, Alter] {
        assert!(!one(Describe, "bob", Topic, "foo_bar", foo_acl(op, Deny)));
    }
    let c = cache(&[foo_acl(Describe, Deny)]);
    assert_eq!(
        check(
            &authorizer(),
            &c,
            "bob",
            LOCALHOST,
            &[(Describe, Topic, "foo_bar")]
        ),
        [D]
    );
    for op in [DescribeConfigs, AlterConfigs] {
        let c = cache(&[foo_acl(op, Allow)]);
        assert_eq!(
            check(
                &authorizer(),
                &c,
                "bob",
                LOCALHOST,
                &[(DescribeConfigs, Topic, "foo_bar")]
            ),
            [A]
        );
    }
    assert!(!one(
        DescribeConfigs,
        "bob",
        Topic,
        "foo_bar",
        foo_acl(AlterConfigs, Deny)
    ));
    let c = cache(&[foo_acl(AlterConfigs, Deny)]);
    assert_eq!(
        check(
            &authorizer(),
            &c,
            "bob",
            LOCALHOST,
            &[(AlterConfigs, Topic, "foo_bar")]
        ),
        [D]
    );
    // Nothing but ALL implies WRITE.
    let c = cache(&[foo_acl(Read, Allow)]);
    assert_eq!(
        check(
            &authorizer(),
            &c,
            "bob",
            LOCALHOST,
            &[(Write, Topic, "foo_bar")]
        ),
        [D]
    );
}

#[test]
fn principals_match_exactly_or_by_the_user_wildcard() {
    assert!(one(Read, "bob", Topic, "foo_bar", foo_acl(Read, Allow)));
    assert!(!one(Read, "alice", Topic, "foo_bar", foo_acl(Read, Allow)));
    let bar = acl(Group, "bar", Literal, "User:*", "*", Read, Deny);
    assert!(one(Read, "alice", Group, "bar", bar.clone()));
    let c = cache(&[bar]);
    assert_eq!(
        check(
            &authorizer(),
            &c,
            "alice",
            LOCALHOST,
            &[(Read, Group, "bar")]
        ),
        [D]
    );
    // `User:*` is the only wildcard: another principal type's `*` is a literal name.
    let c = cache(&[acl(Group, "bar", Literal, "Group:*", "*", Read, Allow)]);
    assert_eq!(
        check(
            &authorizer(),
            &c,
            "alice",
            LOCALHOST,
            &[(Read, Group, "bar")]
        ),
        [D]
    );
}

#[test]
fn acls_are_listed_by_filter_and_removed_by_id() {
    let acls = [
        foo_acl(Read, Allow),
        foo_acl(Write, Allow),
        acl(Group, "bar", Literal, "User:*", "*", DescribeConfigs, Deny),
        acl(Group, "bar", Literal, "User:*", "*", AlterConfigs, Deny),
    ];
    let mut c = cache(&acls);
    let any = AclBindingFilter::any();
    assert_eq!(c.matching(&any).count(), 4);
    assert!(c.contains(&acls[1]));
    let removed = c.remove(&Uuid::from_u64_pair(1, 2)).unwrap();
    assert_eq!(removed, acls[1]);
    assert!(!c.contains(&acls[1]));
    assert_eq!(c.remove(&Uuid::from_u64_pair(1, 2)), None);
    let topics = AclBindingFilter {
        resource_type: Topic,
        ..AclBindingFilter::any()
    };
    let listed: Vec<&StandardAcl> = c.matching(&topics).map(|(_, a)| a).collect();
    assert_eq!(listed, [&acls[0]]);
    assert!(
        !c.add(Uuid::from_u64_pair(1, 1), acls[1].clone()),
        "id taken"
    );
}

#[test]
fn simple_authorizations() {
    let c = cache(&[
        foo_acl(Read, Allow),
        foo_acl(Write, Allow),
        acl(Group, "bar", Literal, "User:*", "*", DescribeConfigs, Allow),
        acl(Group, "bar", Literal, "User:*", "*", AlterConfigs, Allow),
    ]);
    let a = authorizer();
    assert_eq!(
        check(&a, &c, "bob", LOCALHOST, &[(Read, Topic, "foo_")]),
        [A]
    );
    assert_eq!(
        check(&a, &c, "fred", LOCALHOST, &[(AlterConfigs, Group, "bar")]),
        [A]
    );
}

#[test]
fn deny_wins_over_allow_with_operation_all() {
    let c = cache(&[
        acl(Topic, "foo", Literal, "User:alice", "*", All, Deny),
        acl(Topic, "foo", Prefixed, "User:alice", "*", Read, Allow),
        acl(Topic, "foo", Literal, "User:*", "*", All, Deny),
        acl(Topic, "foo", Prefixed, "User:*", "*", Describe, Allow),
    ]);
    let a = authorizer();
    assert_eq!(
        check(
            &a,
            &c,
            "alice",
            LOCALHOST,
            &[
                (Write, Topic, "foo"),
                (Read, Topic, "foo"),
                (Describe, Topic, "foo"),
                (Read, Topic, "foobar"),
            ]
        ),
        [D, D, D, A]
    );
    assert_eq!(
        check(
            &a,
            &c,
            "bob",
            LOCALHOST,
            &[
                (Describe, Topic, "foo"),
                (Read, Topic, "foo"),
                (Write, Topic, "foo"),
                (Describe, Topic, "foobaz"),
                (Read, Topic, "foobaz"),
            ]
        ),
        [D, D, D, A, D]
    );
}

#[test]
fn topic_acls_with_operation_all() {
    let c = cache(&[
        acl(Topic, "foo", Literal, "User:*", "*", All, Allow),
        acl(Topic, "bar", Prefixed, "User:alice", "*", All, Allow),
        acl(Topic, "baz", Literal, "User:bob", "*", All, Allow),
    ]);
    let a = authorizer();
    let t = |op, name| (op, Topic, name);
    assert_eq!(
        check(
            &a,
            &c,
            "alice",
            LOCALHOST,
            &[
                t(Write, "foo"),
                t(DescribeConfigs, "bar"),
                t(Describe, "baz")
            ]
        ),
        [A, A, D]
    );
    assert_eq!(
        check(
            &a,
            &c,
            "bob",
            LOCALHOST,
            &[t(Write, "foo"), t(Read, "bar"), t(Describe, "baz")]
        ),
        [A, D, A]
    );
    assert_eq!(
        check(
            &a,
            &c,
            "malory",
            LOCALHOST,
            &[t(Describe, "foo"), t(Write, "bar"), t(Read, "baz")]
        ),
        [A, D, D]
    );
}

#[test]
fn hosts_match_exactly_or_by_wildcard() {
    let (host1, host2) = ("192.168.1.1", "192.168.1.2");
    let c = cache(&[
        acl(Topic, "foo", Literal, "User:alice", host1, Read, Deny),
        acl(Topic, "foo", Literal, "User:alice", "*", Read, Allow),
        acl(Topic, "bar", Literal, "User:bob", host2, Read, Allow),
        acl(Topic, "bar", Literal, "User:*", LOCALHOST, Describe, Allow),
    ]);
    let a = authorizer();
    let actions = [
        (Read, Topic, "foo"),
        (Read, Topic, "bar"),
        (Describe, Topic, "bar"),
    ];
    assert_eq!(check(&a, &c, "alice", LOCALHOST, &actions), [A, D, A]);
    assert_eq!(check(&a, &c, "alice", host1, &actions), [D, D, D]);
    assert_eq!(check(&a, &c, "alice", host2, &actions), [A, D, D]);
    assert_eq!(check(&a, &c, "bob", LOCALHOST, &actions), [D, D, A]);
    assert_eq!(check(&a, &c, "bob", host1, &actions), [D, D, D]);
    assert_eq!(check(&a, &c, "bob", host2, &actions), [D, A, A]);
}

fn many_acls() -> AclCache {
    cache(&[
        acl(Topic, "green2", Literal, "User:*", "*", Read, Allow),
        acl(Topic, "green", Prefixed, "User:bob", "*", Read, Allow),
        acl(Topic, "betamax4", Literal, "User:bob", "*", Read, Allow),
        acl(Topic, "betamax", Literal, "User:bob", "*", Read, Allow),
        acl(Topic, "beta", Prefixed, "User:*", "*", Read, Allow),
        acl(Topic, "alpha", Prefixed, "User:*", "*", Read, Allow),
        acl(Topic, "alp", Prefixed, "User:bob", "*", Read, Deny),
        acl(Group, "*", Literal, "User:bob", "*", Write, Allow),
        acl(Group, "wheel", Literal, "User:*", "*", Write, Deny),
    ])
}

#[test]
fn authorization_with_many_acls() {
    let c = many_acls();
    let a = authorizer();
    assert_eq!(
        check(
            &a,
            &c,
            "bob",
            LOCALHOST,
            &[(Read, Topic, "green1"), (Write, Group, "wheel")]
        ),
        [A, D]
    );
    assert_eq!(
        check(
            &a,
            &c,
            "bob",
            LOCALHOST,
            &[
                (Read, Topic, "alpha"),
                (Write, Group, "arbitrary"),
                (Read, Topic, "ala"),
            ]
        ),
        [D, A, D]
    );
}

#[test]
fn prefixed_acls_match_names_they_begin() {
    let c = cache(&[
        acl(Topic, "fooa", Prefixed, "User:alice", "*", All, Allow),
        acl(Topic, "foobar", Literal, "User:bob", "*", All, Allow),
        acl(Topic, "f", Prefixed, "User:bob", "*", All, Allow),
    ]);
    let a = authorizer();
    assert_eq!(
        check(
            &a,
            &c,
            "bob",
            LOCALHOST,
            &[
                (Write, Topic, "foobarr"),
                (Read, Topic, "goobar"),
                (Read, Topic, "fooa")
            ]
        ),
        [A, D, A]
    );
    assert_eq!(
        check(
            &a,
            &c,
            "alice",
            LOCALHOST,
            &[
                (Describe, Topic, "fooa"),
                (Write, Topic, "bar"),
                (Read, Topic, "baz")
            ]
        ),
        [A, D, D]
    );
}

#[test]
fn a_literal_acl_whose_name_is_a_prefix_does_not_match() {
    let c = cache(&[acl(Topic, "foo", Literal, "User:bob", "*", Read, Allow)]);
    let open = StandardAuthorizer::new("", true).unwrap();
    // `foo` names its own topic only; `foobar` has no ACL at all, so the default opens it.
    assert_eq!(
        check(&open, &c, "eve", LOCALHOST, &[(Read, Topic, "foo")]),
        [D]
    );
    assert_eq!(
        check(&open, &c, "eve", LOCALHOST, &[(Read, Topic, "foobar")]),
        [A]
    );
    // Resource types are separate: a topic's ACLs say nothing of a group of that name.
    assert_eq!(
        check(&open, &c, "eve", LOCALHOST, &[(Read, Group, "foo")]),
        [A]
    );
}

#[test]
fn removing_the_last_prefixed_acl_of_a_length_forgets_the_length() {
    let mut c = cache(&[
        acl(Topic, "ab", Prefixed, "User:bob", "*", Read, Allow),
        acl(Topic, "ab", Prefixed, "User:eve", "*", Read, Allow),
    ]);
    assert_eq!(c.prefix_lengths[&Topic][&2], 1);
    c.remove(&Uuid::from_u64_pair(1, 1));
    assert_eq!(c.prefix_lengths[&Topic][&2], 1);
    c.remove(&Uuid::from_u64_pair(1, 2));
    assert!(c.prefix_lengths.is_empty() && c.prefixed.is_empty() && c.literal.is_empty());
    assert!(c.is_empty());
}

#[test]
fn multi_byte_names_are_matched_on_character_boundaries() {
    let c = cache(&[acl(Topic, "é", Prefixed, "User:bob", "*", Read, Allow)]);
    let a = authorizer();
    assert_eq!(check(&a, &c, "bob", LOCALHOST, &[(Read, Topic, "éa")]), [A]);
    // "ê" shares its first byte with "é" but does not start with it.
    assert_eq!(check(&a, &c, "bob", LOCALHOST, &[(Read, Topic, "ê")]), [D]);
}

fn by_type(a: &StandardAuthorizer, c: &AclCache, principal: &str, op: AclOperation) -> bool {
    let p = user(principal);
    let ctx = RequestContext {
        principal: &p,
        host: LOCALHOST,
    };
    a.authorize_by_resource_type(c, true, ctx, op, Topic) == A
}

#[test]
fn authorize_by_resource_type_needs_one_allow_no_deny_dominates() {
    let a = authorizer();
    let mut acls = vec![acl(Topic, "t1", Literal, "User:alice", "*", Write, Allow)];
    assert!(by_type(&a, &cache(&acls), "alice", Write));
    assert!(
        !by_type(&a, &cache(&acls), "bob", Write),
        "another principal's"
    );
    assert!(
        !by_type(&a, &cache(&acls), "alice", Read),
        "another operation's"
    );
    // A deny of an unrelated name does not dominate.
    acls.push(acl(Topic, "t2", Literal, "User:alice", "*", Write, Deny));
    assert!(by_type(&a, &cache(&acls), "alice", Write));
    // A literal deny of the same name does.
    acls.push(acl(Topic, "t1", Literal, "User:alice", "*", Write, Deny));
    assert!(!by_type(&a, &cache(&acls), "alice", Write));
    // A prefixed allow that no prefixed deny dominates.
    acls.push(acl(Topic, "pre", Prefixed, "User:alice", "*", Write, Allow));
    assert!(by_type(&a, &cache(&acls), "alice", Write));
    acls.push(acl(Topic, "pr", Prefixed, "User:alice", "*", Write, Deny));
    assert!(!by_type(&a, &cache(&acls), "alice", Write));
    // ALL, any host and the wildcard principal count; a wildcard deny denies outright.
    let all = [acl(Topic, "x", Literal, "User:*", "*", All, Allow)];
    assert!(by_type(&a, &cache(&all), "carol", Write));
    let wild = [
        acl(Topic, "*", Literal, "User:alice", "*", Write, Allow),
        acl(Topic, "*", Literal, "User:alice", "*", Write, Deny),
    ];
    assert!(!by_type(&a, &cache(&wild), "alice", Write));
    let other_host = [acl(
        Topic,
        "x",
        Literal,
        "User:alice",
        "10.0.0.9",
        Write,
        Allow,
    )];
    assert!(!by_type(&a, &cache(&other_host), "alice", Write));
    // Super users, and the open default when no ACL names the probe resource.
    assert!(by_type(&a, &AclCache::new(), "superman", Write));
    let open = StandardAuthorizer::new("", true).unwrap();
    assert!(by_type(&open, &AclCache::new(), "anyone", Write));
}

#[test]
fn authorized_operations_are_kip_430_bits_of_the_supported_set() {
    let c = cache(&[
        acl(Topic, "t", Literal, "User:bob", "*", Read, Allow),
        acl(Topic, "t", Literal, "User:bob", "*", AlterConfigs, Allow),
    ]);
    let a = authorizer();
    let ctx = RequestContext {
        principal: "User:bob",
        host: LOCALHOST,
    };
    let bits = a.authorized_operations(&c, true, ctx, Topic, "t");
    let expected = [Read, Describe, DescribeConfigs, AlterConfigs]
        .iter()
        .fold(0, |b, op| b | operation_bit(*op));
    assert_eq!(bits, expected);
    assert_eq!(
        all_operations(Group),
        [Read, Describe, Delete, DescribeConfigs, AlterConfigs]
            .iter()
            .fold(0, |b, op| b | operation_bit(*op))
    );
    let superman = RequestContext {
        principal: "User:superman",
        host: LOCALHOST,
    };
    assert_eq!(
        a.authorized_operations(&c, true, superman, Cluster, CLUSTER_NAME),
        all_operations(Cluster)
    );
}

/// Kafka's semantics read off the module's protocol, by a scan over every ACL.
fn reference(
    acls: &[StandardAcl],
    default_allowed: bool,
    principal: &str,
    host: &str,
    op: AclOperation,
    rt: ResourceType,
    name: &str,
) -> AuthorizationResult {
    let applies = |a: &StandardAcl| {
        a.resource_type == rt
            && match a.pattern_type {
                Literal => a.resource_name == name || a.resource_name == "*",
                Prefixed => name.starts_with(&a.resource_name),
                _ => false,
            }
    };
    let matches = |a: &StandardAcl| {
        (a.principal == principal || a.principal == "User:*")
            && (a.host == "*" || a.host == host)
            && (a.operation == All
                || a.operation == op
                || (a.permission_type == Allow
                    && ((op == Describe && [Read, Write, Delete, Alter].contains(&a.operation))
                        || (op == DescribeConfigs && a.operation == AlterConfigs))))
    };
    let applicable: Vec<&StandardAcl> = acls.iter().filter(|a| applies(a)).collect();
    if applicable
        .iter()
        .any(|a| matches(a) && a.permission_type == Deny)
    {
        D
    } else if applicable
        .iter()
        .any(|a| matches(a) && a.permission_type == Allow)
    {
        A
    } else if !applicable.is_empty() || !default_allowed {
        D
    } else {
        A
    }
}

fn arb_acl() -> impl Strategy<Value = StandardAcl> {
    (
        prop::sample::select(vec![Topic, Group]),
        "[ab*]{1,3}",
        prop::sample::select(vec![Literal, Prefixed]),
        prop::sample::select(vec!["User:x", "User:y", "User:*"]),
        prop::sample::select(vec!["*", "10.0.0.1", "10.0.0.2"]),
        prop::sample::select(vec![
            All,
            Read,
            Write,
            Describe,
            AlterConfigs,
            DescribeConfigs,
        ]),
        prop::sample::select(vec![Allow, Deny]),
    )
        .prop_map(|(rt, name, pt, principal, host, op, perm)| {
            acl(rt, &name, pt, principal, host, op, perm)
        })
}

proptest! {
    #[test]
    fn the_index_decides_as_a_scan_over_every_acl(
        acls in prop::collection::vec(arb_acl(), 0..24),
        removed in prop::collection::vec(any::<prop::sample::Index>(), 0..4),
        default_allowed in any::<bool>(),
        principal in prop::sample::select(vec!["User:x", "User:y", "User:z"]),
        host in prop::sample::select(vec!["10.0.0.1", "10.0.0.2"]),
        op in prop::sample::select(vec![Read, Write, Describe, AlterConfigs, DescribeConfigs]),
        rt in prop::sample::select(vec![Topic, Group]),
        name in "[ab*]{1,4}",
    ) {
        let mut c = cache(&acls);
        let mut kept = acls.clone();
        let mut ids: Vec<usize> = (0..acls.len()).collect();
        for index in removed {
            if ids.is_empty() {
                break;
            }
            let i = ids.remove(index.index(ids.len()));
            c.remove(&Uuid::from_u64_pair(1, i as u64 + 1));
            kept[i].principal = "User:removed".into();
            kept[i].resource_type = Cluster;
        }
        let a = StandardAuthorizer::new("", default_allowed).unwrap();
        let ctx = RequestContext { principal, host };
        let action = Action { operation: op, resource_type: rt, resource_name: &name };
        prop_assert_eq!(
            a.authorize(&c, true, ctx, action),
            reference(&kept, default_allowed, principal, host, op, rt, &name)
        );
    }
}
