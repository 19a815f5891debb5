//! `rill acl add|list|remove`: ACLs in `kafka-acls.sh`'s vocabulary (`--allow-principal`,
//! `--deny-principal`, `--allow-host`, `--deny-host`, `--operation`, `--topic`, `--group`,
//! `--cluster`, `--transactional-id`, `--delegation-token`, `--user-principal`,
//! `--resource-pattern-type`, `--producer`,
//! `--consumer`), through CreateAcls, DescribeAcls and DeleteAcls.
//!
//! As in Kafka's `AclCommand`: `add` needs a principal and a resource, the operation is
//! ALL and the host `*` unless given; `remove` with principals removes exactly those
//! bindings, without any it removes every binding of the resources named; `list` lists
//! what matches the resources (every binding when none is named).

use clap::{Args, Subcommand};
use rill_client::acl::{
    AclBindingFilter, AclOperation, AclPermissionType, PatternType, ResourceType, StandardAcl,
    CLUSTER_NAME, WILDCARD,
};
use rill_client::Admin;
use serde_json::json;

use super::{print_json, table, Common};

#[derive(Subcommand, Debug)]
pub enum AclCommand {
    /// Add ACLs: each principal and host, for each operation, on each resource.
    Add(AclArgs),
    /// List the ACLs of the resources named (every ACL when none is).
    List(AclArgs),
    /// Remove the ACLs named (or, without a principal, every ACL of the resources).
    Remove(AclArgs),
}

#[derive(Args, Debug)]
pub struct AclArgs {
    /// A principal to allow (`User:alice`, or `User:*` for everyone); repeatable.
    #[arg(long = "allow-principal")]
    allow_principals: Vec<String>,
    /// A principal to deny; repeatable. A DENY wins over any ALLOW.
    #[arg(long = "deny-principal")]
    deny_principals: Vec<String>,
    /// A host the allowed principals may connect from (default `*`); repeatable.
    #[arg(long = "allow-host")]
    allow_hosts: Vec<String>,
    /// A host the denied principals are denied from (default `*`); repeatable.
    #[arg(long = "deny-host")]
    deny_hosts: Vec<String>,
    /// Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs,
    /// AlterConfigs, IdempotentWrite, CreateTokens, DescribeTokens or All; repeatable.
    #[arg(long = "operation")]
    operations: Vec<String>,
    /// A topic (`*` for every topic); repeatable.
    #[arg(long = "topic")]
    topics: Vec<String>,
    /// A consumer group (`*` for every group); repeatable.
    #[arg(long = "group")]
    groups: Vec<String>,
    /// The cluster resource.
    #[arg(long)]
    cluster: bool,
    /// A transactional id (`*` for every one); repeatable.
    #[arg(long = "transactional-id")]
    transactional_ids: Vec<String>,
    /// A delegation token's id (`*` for every token); repeatable.
    #[arg(long = "delegation-token")]
    delegation_tokens: Vec<String>,
    /// A user principal, as the resource of CreateTokens and DescribeTokens
    /// (`User:alice`); repeatable.
    #[arg(long = "user-principal")]
    user_principals: Vec<String>,
    /// literal or prefixed (add, remove); any or match also for list and remove. Kafka's
    /// default: literal, and any for list.
    #[arg(long = "resource-pattern-type")]
    pattern_type: Option<String>,
    /// Only the ACLs of this principal (list).
    #[arg(long)]
    principal: Option<String>,
    /// The ACLs a producer needs: WRITE, DESCRIBE and CREATE on the topics (and
    /// IDEMPOTENT_WRITE on the cluster with --idempotent).
    #[arg(long)]
    producer: bool,
    /// With --producer: IDEMPOTENT_WRITE on the cluster too.
    #[arg(long)]
    idempotent: bool,
    /// The ACLs a consumer needs: READ and DESCRIBE on the topics, READ on the groups.
    #[arg(long)]
    consumer: bool,
}

impl AclArgs {
    fn pattern_type(&self, default: PatternType) -> anyhow::Result<PatternType> {
        match &self.pattern_type {
            None => Ok(default),
            Some(s) => s.parse().map_err(|e: String| anyhow::anyhow!(e)),
        }
    }

    /// The resources named, as (type, name).
    fn resources(&self) -> Vec<(ResourceType, String)> {
        let mut out: Vec<(ResourceType, String)> = Vec::new();
        out.extend(self.topics.iter().map(|t| (ResourceType::Topic, t.clone())));
        out.extend(self.groups.iter().map(|g| (ResourceType::Group, g.clone())));
        out.extend(
            self.transactional_ids
                .iter()
                .map(|t| (ResourceType::TransactionalId, t.clone())),
        );
        out.extend(
            self.delegation_tokens
                .iter()
                .map(|t| (ResourceType::DelegationToken, t.clone())),
        );
        out.extend(
            self.user_principals
                .iter()
                .map(|u| (ResourceType::User, u.clone())),
        );
        if self.cluster || (self.producer && self.idempotent) {
            out.push((ResourceType::Cluster, CLUSTER_NAME.to_string()));
        }
        out
    }

    /// The operations asked for on a resource type: `--producer`'s and `--consumer`'s
    /// sets, else `--operation`'s (ALL when none).
    fn operations_for(&self, rt: ResourceType) -> anyhow::Result<Vec<AclOperation>> {
        if self.producer || self.consumer {
            let mut ops = Vec::new();
            match rt {
                ResourceType::Topic => {
                    if self.producer {
                        ops.extend([
                            AclOperation::Write,
                            AclOperation::Describe,
                            AclOperation::Create,
                        ]);
                    }
                    if self.consumer {
                        ops.extend([AclOperation::Read, AclOperation::Describe]);
                    }
                }
                ResourceType::Group if self.consumer => ops.push(AclOperation::Read),
                ResourceType::Cluster if self.producer && self.idempotent => {
                    ops.push(AclOperation::IdempotentWrite)
                }
                ResourceType::TransactionalId if self.producer => {
                    ops.extend([AclOperation::Write, AclOperation::Describe])
                }
                _ => {}
            }
            ops.sort();
            ops.dedup();
            return Ok(ops);
        }
        if self.operations.is_empty() {
            return Ok(vec![AclOperation::All]);
        }
        self.operations
            .iter()
            .map(|o| o.parse().map_err(|e: String| anyhow::anyhow!(e)))
            .collect()
    }

    /// (principal, host, permission) for each principal and host given.
    fn entries(&self) -> Vec<(String, String, AclPermissionType)> {
        let hosts = |given: &[String]| -> Vec<String> {
            if given.is_empty() {
                vec![WILDCARD.to_string()]
            } else {
                given.to_vec()
            }
        };
        let mut out = Vec::new();
        for p in &self.allow_principals {
            for h in hosts(&self.allow_hosts) {
                out.push((p.clone(), h, AclPermissionType::Allow));
            }
        }
        for p in &self.deny_principals {
            for h in hosts(&self.deny_hosts) {
                out.push((p.clone(), h, AclPermissionType::Deny));
            }
        }
        out
    }

    /// The bindings `add` creates and `remove` removes when principals are given.
    fn bindings(&self, pattern_type: PatternType) -> anyhow::Result<Vec<StandardAcl>> {
        let mut out = Vec::new();
        for (rt, name) in self.resources() {
            let ops = self.operations_for(rt)?;
            for (principal, host, permission_type) in self.entries() {
                for op in &ops {
                    out.push(StandardAcl {
                        resource_type: rt,
                        resource_name: name.clone(),
                        pattern_type,
                        principal: principal.clone(),
                        host: host.clone(),
                        operation: *op,
                        permission_type,
                    });
                }
            }
        }
        Ok(out)
    }
}

fn exact(acl: &StandardAcl) -> AclBindingFilter {
    AclBindingFilter {
        resource_type: acl.resource_type,
        resource_name: Some(acl.resource_name.clone()),
        pattern_type: acl.pattern_type,
        principal: Some(acl.principal.clone()),
        host: Some(acl.host.clone()),
        operation: acl.operation,
        permission_type: acl.permission_type,
    }
}

fn print_acls(common: &Common, acls: &[StandardAcl]) {
    if common.json() {
        print_json(&json!(acls
            .iter()
            .map(|a| json!({
                "resource_type": a.resource_type.name(),
                "resource_name": a.resource_name,
                "pattern_type": a.pattern_type.name(),
                "principal": a.principal,
                "host": a.host,
                "operation": a.operation.name(),
                "permission_type": a.permission_type.name(),
            }))
            .collect::<Vec<_>>()));
    } else {
        let rows: Vec<Vec<String>> = acls
            .iter()
            .map(|a| {
                vec![
                    a.resource_type.to_string(),
                    a.resource_name.clone(),
                    a.pattern_type.to_string(),
                    a.principal.clone(),
                    a.host.clone(),
                    a.operation.to_string(),
                    a.permission_type.to_string(),
                ]
            })
            .collect();
        table::print(
            &[
                "RESOURCE TYPE",
                "NAME",
                "PATTERN TYPE",
                "PRINCIPAL",
                "HOST",
                "OPERATION",
                "PERMISSION",
            ],
            &rows,
        );
    }
}

pub async fn run(common: &Common, command: AclCommand) -> anyhow::Result<()> {
    let admin = Admin::new(common.client()?)?;
    match command {
        AclCommand::Add(args) => {
            if args.resources().is_empty() {
                anyhow::bail!("name a resource: --topic, --group, --cluster or --transactional-id");
            }
            if args.entries().is_empty() {
                anyhow::bail!("name a principal: --allow-principal or --deny-principal");
            }
            let pattern_type = args.pattern_type(PatternType::Literal)?;
            let bindings = args.bindings(pattern_type)?;
            for outcome in admin.create_acls(&bindings).await? {
                outcome?;
            }
            if common.json() {
                print_acls(common, &bindings);
            } else {
                println!("Added {} ACL(s):", bindings.len());
                print_acls(common, &bindings);
            }
            Ok(())
        }
        AclCommand::List(args) => {
            let pattern_type = args.pattern_type(PatternType::Any)?;
            let resources = args.resources();
            let filters: Vec<AclBindingFilter> = if resources.is_empty() {
                vec![AclBindingFilter {
                    pattern_type,
                    principal: args.principal.clone(),
                    ..AclBindingFilter::any()
                }]
            } else {
                resources
                    .into_iter()
                    .map(|(rt, name)| AclBindingFilter {
                        resource_type: rt,
                        resource_name: Some(name),
                        pattern_type,
                        principal: args.principal.clone(),
                        ..AclBindingFilter::any()
                    })
                    .collect()
            };
            let mut acls = Vec::new();
            for f in &filters {
                for acl in admin.describe_acls(f).await? {
                    if !acls.contains(&acl) {
                        acls.push(acl);
                    }
                }
            }
            print_acls(common, &acls);
            Ok(())
        }
        AclCommand::Remove(args) => {
            let resources = args.resources();
            if resources.is_empty() {
                anyhow::bail!("name a resource: --topic, --group, --cluster or --transactional-id");
            }
            let filters: Vec<AclBindingFilter> = if args.entries().is_empty() {
                let pattern_type = args.pattern_type(PatternType::Literal)?;
                resources
                    .into_iter()
                    .map(|(rt, name)| AclBindingFilter {
                        resource_type: rt,
                        resource_name: Some(name),
                        pattern_type,
                        ..AclBindingFilter::any()
                    })
                    .collect()
            } else {
                let pattern_type = args.pattern_type(PatternType::Literal)?;
                args.bindings(pattern_type)?.iter().map(exact).collect()
            };
            let mut removed = Vec::new();
            for outcome in admin.delete_acls(&filters).await? {
                removed.extend(outcome?);
            }
            if !common.json() {
                println!("Removed {} ACL(s):", removed.len());
            }
            print_acls(common, &removed);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        command: AclCommand,
    }

    fn args(line: &[&str]) -> AclArgs {
        let mut argv = vec!["rill"];
        argv.extend_from_slice(line);
        match Cli::parse_from(argv).command {
            AclCommand::Add(a) | AclCommand::List(a) | AclCommand::Remove(a) => a,
        }
    }

    #[test]
    fn add_makes_one_binding_per_principal_host_operation_and_resource() {
        let a = args(&[
            "add",
            "--allow-principal",
            "User:alice",
            "--deny-principal",
            "User:bob",
            "--operation",
            "Write",
            "--operation",
            "describe-configs",
            "--topic",
            "orders-",
            "--group",
            "g",
            "--resource-pattern-type",
            "prefixed",
        ]);
        let pt = a.pattern_type(PatternType::Literal).unwrap();
        let bindings = a.bindings(pt).unwrap();
        assert_eq!(bindings.len(), 2 * 2 * 2);
        assert!(bindings
            .iter()
            .all(|b| b.pattern_type == PatternType::Prefixed));
        assert!(bindings.iter().any(|b| b.principal == "User:bob"
            && b.permission_type == AclPermissionType::Deny
            && b.operation == AclOperation::DescribeConfigs
            && b.resource_type == ResourceType::Group));
        assert!(bindings.iter().all(|b| b.host == "*"));
    }

    #[test]
    fn operation_defaults_to_all_and_producer_consumer_expand() {
        let a = args(&["add", "--allow-principal", "User:a", "--cluster"]);
        let b = a.bindings(PatternType::Literal).unwrap();
        assert_eq!(b.len(), 1);
        assert_eq!(
            (
                b[0].resource_type,
                b[0].resource_name.as_str(),
                b[0].operation
            ),
            (ResourceType::Cluster, CLUSTER_NAME, AclOperation::All)
        );
        let c = args(&[
            "add",
            "--allow-principal",
            "User:c",
            "--consumer",
            "--topic",
            "t",
            "--group",
            "g",
        ]);
        let ops: Vec<(ResourceType, AclOperation)> = c
            .bindings(PatternType::Literal)
            .unwrap()
            .iter()
            .map(|b| (b.resource_type, b.operation))
            .collect();
        assert_eq!(
            ops,
            [
                (ResourceType::Topic, AclOperation::Read),
                (ResourceType::Topic, AclOperation::Describe),
                (ResourceType::Group, AclOperation::Read),
            ]
        );
        assert!(args(&["add", "--operation", "Reed", "--topic", "t"])
            .operations_for(ResourceType::Topic)
            .is_err());
    }
}
