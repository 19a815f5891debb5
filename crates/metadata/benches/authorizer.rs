//! Criterion benchmark of the authorizer: the cost of one authorize call, which every
//! request with an authorizer configured makes at least once (per topic, group or
//! transactional id it names), with 10,000 ACLs stored beside a cache of 10.
//!
//! Run with `cargo bench -p rill-metadata --bench authorizer`. Under `cargo test
//! --all-targets` each benchmark runs once, as a smoke test.
#![allow(clippy::expect_used)] // benchmark inputs are built here: a failure is a bug in the bench

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use rill_metadata::{
    AclCache, AclOperation, AclPermissionType, Action, PatternType, RequestContext, ResourceType,
    StandardAcl, StandardAuthorizer,
};
use rill_protocol::Uuid;

/// `n` ACLs the way a large deployment has them: per user a literal topic, a prefixed
/// topic family and a group (READ, WRITE, DESCRIBE alternating), plus a few DENYs.
fn acls(n: usize) -> AclCache {
    let mut cache = AclCache::new();
    for i in 0..n {
        let user = i / 3;
        let (rt, name, pt) = match i % 3 {
            0 => (
                ResourceType::Topic,
                format!("topic-{user}"),
                PatternType::Literal,
            ),
            1 => (
                ResourceType::Topic,
                format!("team-{user}."),
                PatternType::Prefixed,
            ),
            _ => (
                ResourceType::Group,
                format!("group-{user}"),
                PatternType::Literal,
            ),
        };
        let operation = [
            AclOperation::Read,
            AclOperation::Write,
            AclOperation::Describe,
        ][i % 3];
        let permission_type = if i % 97 == 0 {
            AclPermissionType::Deny
        } else {
            AclPermissionType::Allow
        };
        let acl = StandardAcl {
            resource_type: rt,
            resource_name: name,
            pattern_type: pt,
            principal: format!("User:user-{user}"),
            host: "*".into(),
            operation,
            permission_type,
        };
        assert!(cache.add(Uuid::from_u64_pair(7, i as u64 + 1), acl));
    }
    cache
}

fn authorize(c: &mut Criterion) {
    let authorizer = StandardAuthorizer::new("User:admin", false).expect("super.users parses");
    let ctx = RequestContext {
        principal: "User:user-1234",
        host: "10.1.2.3",
    };
    for n in [10usize, 10_000] {
        let cache = acls(n);
        let cases = [
            (
                "literal_allowed",
                ResourceType::Topic,
                "topic-1234",
                AclOperation::Read,
            ),
            (
                "prefixed_allowed",
                ResourceType::Topic,
                "team-1234.orders",
                AclOperation::Write,
            ),
            (
                "no_acl_denied",
                ResourceType::Topic,
                "unrelated-topic",
                AclOperation::Read,
            ),
            (
                "group_describe",
                ResourceType::Group,
                "group-1234",
                AclOperation::Describe,
            ),
        ];
        for (name, rt, resource, op) in cases {
            let action = Action {
                operation: op,
                resource_type: rt,
                resource_name: resource,
            };
            c.bench_function(&format!("authorize/{n}_acls/{name}"), |b| {
                b.iter(|| authorizer.authorize(black_box(&cache), true, ctx, black_box(action)))
            });
        }
        c.bench_function(&format!("authorize_by_resource_type/{n}_acls"), |b| {
            b.iter(|| {
                authorizer.authorize_by_resource_type(
                    black_box(&cache),
                    true,
                    ctx,
                    AclOperation::Write,
                    ResourceType::Topic,
                )
            })
        });
    }
}

criterion_group!(benches, authorize);
criterion_main!(benches);
