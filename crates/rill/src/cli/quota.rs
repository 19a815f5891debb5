//! `rill quota set|remove|list`: client quotas (like `kafka-configs.sh --alter
//! --add-config producer_byte_rate=… --entity-type users|clients`), through
//! AlterClientQuotas and DescribeClientQuotas.
//!
//! An entity is named by `--user`/`--user-default`, `--client-id`/`--client-default` (the
//! two may be combined), or `--ip`/`--ip-default`.

use clap::{Args, Subcommand};
use rill_client::{Admin, QuotaEntity, QuotaMatch};
use serde_json::json;

use super::{print_json, table, Common};

#[derive(Args, Debug, Clone, Default)]
pub struct EntityArgs {
    /// A user (the principal's name, e.g. `alice` for `User:alice`).
    #[arg(long, conflicts_with = "user_default")]
    user: Option<String>,
    /// The default user: every user without a quota of its own.
    #[arg(long)]
    user_default: bool,
    #[arg(long, conflicts_with = "client_default")]
    client_id: Option<String>,
    /// The default client id.
    #[arg(long)]
    client_default: bool,
    /// A client address (for connection_creation_rate).
    #[arg(long, conflicts_with = "ip_default")]
    ip: Option<String>,
    #[arg(long)]
    ip_default: bool,
}

impl EntityArgs {
    fn parts(&self) -> Vec<(&'static str, Option<Option<String>>)> {
        let part = |name: &Option<String>, default: bool| match (name, default) {
            (Some(n), _) => Some(Some(n.clone())),
            (None, true) => Some(None),
            (None, false) => None,
        };
        vec![
            ("user", part(&self.user, self.user_default)),
            ("client-id", part(&self.client_id, self.client_default)),
            ("ip", part(&self.ip, self.ip_default)),
        ]
    }

    fn entity(&self) -> anyhow::Result<QuotaEntity> {
        let entity: QuotaEntity = self
            .parts()
            .into_iter()
            .filter_map(|(t, p)| p.map(|n| (t.to_string(), n)))
            .collect();
        if entity.is_empty() {
            anyhow::bail!("name an entity: --user, --client-id, --ip or their --*-default");
        }
        Ok(entity)
    }
}

#[derive(Subcommand, Debug)]
pub enum QuotaCommand {
    /// Set quotas of an entity: KEY=VALUE pairs (producer_byte_rate, consumer_byte_rate,
    /// request_percentage, controller_mutation_rate; connection_creation_rate for --ip).
    Set {
        #[command(flatten)]
        entity: EntityArgs,
        #[arg(required = true, value_name = "KEY=VALUE")]
        quotas: Vec<String>,
    },
    /// Remove quotas of an entity.
    Remove {
        #[command(flatten)]
        entity: EntityArgs,
        #[arg(required = true, value_name = "KEY")]
        keys: Vec<String>,
    },
    /// The entities with quotas and their values; the entity flags filter (exactly that
    /// user, the default client id, ...).
    List {
        #[command(flatten)]
        entity: EntityArgs,
    },
}

fn describe(entity: &QuotaEntity) -> String {
    entity
        .iter()
        .map(|(t, n)| format!("{t}={}", n.as_deref().unwrap_or("<default>")))
        .collect::<Vec<_>>()
        .join(",")
}

pub async fn run(common: &Common, command: QuotaCommand) -> anyhow::Result<()> {
    let admin = Admin::new(common.client()?)?;
    let alter = |entity: QuotaEntity, ops: Vec<(String, Option<f64>)>| {
        let admin = &admin;
        async move {
            for (entity, outcome) in admin
                .alter_client_quotas(&[(entity, ops.clone())], false)
                .await?
            {
                outcome?;
                if common.json() {
                    print_json(
                        &json!({ "entity": describe(&entity), "altered": ops.iter().map(|(k, v)| json!({ "key": k, "value": v })).collect::<Vec<_>>() }),
                    );
                } else {
                    println!("Altered the quotas of {}.", describe(&entity));
                }
            }
            anyhow::Ok(())
        }
    };
    match command {
        QuotaCommand::Set { entity, quotas } => {
            let mut ops = Vec::new();
            for q in quotas {
                let (k, v) = q
                    .split_once('=')
                    .ok_or_else(|| anyhow::anyhow!("{q:?}: expected KEY=VALUE"))?;
                let v: f64 = v
                    .parse()
                    .map_err(|_| anyhow::anyhow!("{q:?}: the value is not a number"))?;
                ops.push((k.to_string(), Some(v)));
            }
            alter(entity.entity()?, ops).await
        }
        QuotaCommand::Remove { entity, keys } => {
            alter(
                entity.entity()?,
                keys.into_iter().map(|k| (k, None)).collect(),
            )
            .await
        }
        QuotaCommand::List { entity } => {
            let filter: Vec<(String, QuotaMatch)> = entity
                .parts()
                .into_iter()
                .filter_map(|(t, p)| {
                    p.map(|n| {
                        let m = match n {
                            Some(n) => QuotaMatch::Exact(n),
                            None => QuotaMatch::Default,
                        };
                        (t.to_string(), m)
                    })
                })
                .collect();
            let entries = admin.describe_client_quotas(&filter, false).await?;
            if common.json() {
                print_json(&json!(entries
                    .iter()
                    .map(|(e, values)| json!({
                        "entity": e.iter().map(|(t, n)| (t.clone(), json!(n))).collect::<serde_json::Map<_, _>>(),
                        "quotas": values.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
                    }))
                    .collect::<Vec<_>>()));
            } else {
                let mut rows = Vec::new();
                for (e, values) in &entries {
                    for (k, v) in values {
                        rows.push(vec![describe(e), k.clone(), v.to_string()]);
                    }
                }
                table::print(&["ENTITY", "QUOTA", "VALUE"], &rows);
            }
            Ok(())
        }
    }
}
