//! `rill user create|delete|list`: SCRAM users (like `kafka-configs.sh --alter
//! --add-config 'SCRAM-SHA-512=[password=…]' --entity-type users`), through
//! AlterUserScramCredentials and DescribeUserScramCredentials.
//!
//! The password is salted here (a random 32-byte salt, PBKDF2 with the mechanism's HMAC)
//! and only the salted password goes to the broker, as Kafka's admin client does.

use clap::Subcommand;
use rill_broker::network::scram::{random_bytes, ScramMechanism, MIN_ITERATIONS};
use rill_client::{Admin, ScramCredentialUpsertion};
use serde_json::json;

use super::{print_json, table, Common};

#[derive(Subcommand, Debug)]
pub enum UserCommand {
    /// Create a SCRAM user, or set its password for the given mechanisms.
    Create {
        name: String,
        /// The password; read from the environment variable RILL_USER_PASSWORD when not
        /// given, so that it need not appear in the process list.
        #[arg(long, env = "RILL_USER_PASSWORD", hide_env_values = true)]
        password: String,
        /// SCRAM-SHA-256 and/or SCRAM-SHA-512; repeatable.
        #[arg(long = "mechanism", default_values_t = [String::from("SCRAM-SHA-512")])]
        mechanisms: Vec<String>,
        /// PBKDF2 iterations (Kafka's bounds: 4096 to 16384).
        #[arg(long, default_value_t = MIN_ITERATIONS)]
        iterations: i32,
    },
    /// Delete a user's SCRAM credentials (every mechanism it has unless --mechanism).
    Delete {
        name: String,
        #[arg(long = "mechanism")]
        mechanisms: Vec<String>,
    },
    /// The SCRAM users and their mechanisms.
    List,
}

fn mechanism(name: &str) -> anyhow::Result<ScramMechanism> {
    ScramMechanism::from_name(&name.to_ascii_uppercase()).ok_or_else(|| {
        anyhow::anyhow!("unknown mechanism {name:?}: use SCRAM-SHA-256 or SCRAM-SHA-512")
    })
}

fn mechanism_name(t: i8) -> String {
    ScramMechanism::from_kafka_type(t)
        .map(|m| m.name().to_string())
        .unwrap_or_else(|| format!("UNKNOWN({t})"))
}

pub async fn run(common: &Common, command: UserCommand) -> anyhow::Result<()> {
    let admin = Admin::new(common.client()?)?;
    match command {
        UserCommand::Create {
            name,
            password,
            mechanisms,
            iterations,
        } => {
            let mut upsertions = Vec::new();
            for m in &mechanisms {
                let m = mechanism(m)?;
                let salt = random_bytes(32).map_err(|e| anyhow::anyhow!(e))?;
                let rounds = u32::try_from(iterations)
                    .map_err(|_| anyhow::anyhow!("--iterations must be positive"))?;
                upsertions.push(ScramCredentialUpsertion {
                    name: name.clone(),
                    mechanism: m.kafka_type(),
                    iterations,
                    salted_password: m.salted_password(password.as_bytes(), &salt, rounds),
                    salt,
                });
            }
            for (user, outcome) in admin.alter_user_scram_credentials(&[], &upsertions).await? {
                outcome?;
                if common.json() {
                    print_json(&json!({ "user": user, "mechanisms": mechanisms }));
                } else {
                    println!(
                        "Set the {} credentials of {user}.",
                        mechanisms.join(" and ")
                    );
                }
            }
            Ok(())
        }
        UserCommand::Delete { name, mechanisms } => {
            let types: Vec<i8> = if mechanisms.is_empty() {
                let described = admin
                    .describe_user_scram_credentials(Some(std::slice::from_ref(&name)))
                    .await?;
                let mut types = Vec::new();
                for (_, outcome) in described {
                    types.extend(outcome?.into_iter().map(|(t, _)| t));
                }
                types
            } else {
                mechanisms
                    .iter()
                    .map(|m| mechanism(m).map(ScramMechanism::kafka_type))
                    .collect::<anyhow::Result<_>>()?
            };
            let deletions: Vec<(String, i8)> = types.iter().map(|t| (name.clone(), *t)).collect();
            for (user, outcome) in admin.alter_user_scram_credentials(&deletions, &[]).await? {
                outcome?;
                if common.json() {
                    print_json(&json!({ "deleted": user }));
                } else {
                    println!("Deleted the SCRAM credentials of {user}.");
                }
            }
            Ok(())
        }
        UserCommand::List => {
            let users = admin.describe_user_scram_credentials(None).await?;
            let mut rows = Vec::new();
            for (user, outcome) in users {
                for (t, iterations) in outcome? {
                    rows.push((user.clone(), mechanism_name(t), iterations));
                }
            }
            if common.json() {
                print_json(&json!(rows
                    .iter()
                    .map(|(u, m, i)| json!({ "user": u, "mechanism": m, "iterations": i }))
                    .collect::<Vec<_>>()));
            } else {
                let rows: Vec<Vec<String>> = rows
                    .into_iter()
                    .map(|(u, m, i)| vec![u, m, i.to_string()])
                    .collect();
                table::print(&["USER", "MECHANISM", "ITERATIONS"], &rows);
            }
            Ok(())
        }
    }
}
