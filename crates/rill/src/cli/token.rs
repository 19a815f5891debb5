//! `rill token create|renew|expire|describe`: delegation tokens (KIP-48), with the options
//! of Kafka's `kafka-delegation-tokens.sh`, through CreateDelegationToken,
//! RenewDelegationToken, ExpireDelegationToken and DescribeDelegationToken.
//!
//! The broker answers only a client that authenticated with something other than a token
//! (SASL, or TLS with a certificate), so these commands need `--command-config` or `-X`
//! security settings. A token logs in as `sasl.jaas.config` with `tokenauth="true"`:
//! `create` prints that line.

use clap::Subcommand;
use rill_client::{hmac_from_base64, Admin, DelegationToken};
use serde_json::json;

use super::{print_json, table, Common};

#[derive(Subcommand, Debug)]
pub enum TokenCommand {
    /// Create a token for the connection's principal (or --owner-principal).
    Create {
        /// Milliseconds the token may live, renewals included; -1 for the broker's
        /// `delegation.token.max.lifetime.ms`.
        #[arg(long = "max-life-time-period", default_value_t = -1, allow_hyphen_values = true)]
        max_life_time_period: i64,
        /// A principal (User:name) that may renew and expire the token; repeatable.
        #[arg(long = "renewer-principal")]
        renewers: Vec<String>,
        /// Create the token for this principal (needs CREATE_TOKENS on that user).
        #[arg(long = "owner-principal")]
        owner: Option<String>,
    },
    /// Renew a token, named by its HMAC (base64).
    Renew {
        #[arg(long)]
        hmac: String,
        /// Milliseconds until the new expiry; -1 for the broker's
        /// `delegation.token.expiry.time.ms`.
        #[arg(long = "renew-time-period", default_value_t = -1, allow_hyphen_values = true)]
        renew_time_period: i64,
    },
    /// Expire a token, named by its HMAC (base64): at once (-1), or after a period.
    Expire {
        #[arg(long)]
        hmac: String,
        #[arg(long = "expiry-time-period", default_value_t = -1, allow_hyphen_values = true)]
        expiry_time_period: i64,
    },
    /// The tokens this principal may see, of every owner or of the --owner-principal's.
    Describe {
        #[arg(long = "owner-principal")]
        owners: Vec<String>,
    },
}

fn token_json(t: &DelegationToken) -> serde_json::Value {
    json!({
        "token_id": t.token_id,
        "hmac": t.hmac_base64(),
        "owner": t.owner,
        "requester": t.requester,
        "renewers": t.renewers,
        "issue_timestamp_ms": t.issue_timestamp_ms,
        "expiry_timestamp_ms": t.expiry_timestamp_ms,
        "max_timestamp_ms": t.max_timestamp_ms,
    })
}

fn print_tokens(common: &Common, tokens: &[DelegationToken]) {
    if common.json() {
        print_json(&json!(tokens.iter().map(token_json).collect::<Vec<_>>()));
        return;
    }
    let rows: Vec<Vec<String>> = tokens
        .iter()
        .map(|t| {
            vec![
                t.token_id.clone(),
                t.hmac_base64(),
                t.owner.clone(),
                t.renewers.join(","),
                t.issue_timestamp_ms.to_string(),
                t.expiry_timestamp_ms.to_string(),
                t.max_timestamp_ms.to_string(),
            ]
        })
        .collect();
    table::print(
        &[
            "TOKENID",
            "HMAC",
            "OWNER",
            "RENEWERS",
            "ISSUE_MS",
            "EXPIRY_MS",
            "MAX_MS",
        ],
        &rows,
    );
}

pub async fn run(common: &Common, command: TokenCommand) -> anyhow::Result<()> {
    let admin = Admin::new(common.client()?)?;
    match command {
        TokenCommand::Create {
            max_life_time_period,
            renewers,
            owner,
        } => {
            let token = admin
                .create_delegation_token(owner.as_deref(), &renewers, max_life_time_period)
                .await?;
            if common.json() {
                print_json(&token_json(&token));
            } else {
                print_tokens(common, std::slice::from_ref(&token));
                println!(
                    "\nLog in with it (SCRAM): sasl.jaas.config={}",
                    token.jaas_config()
                );
            }
        }
        TokenCommand::Renew {
            hmac,
            renew_time_period,
        } => {
            let expiry = admin
                .renew_delegation_token(&hmac_from_base64(&hmac)?, renew_time_period)
                .await?;
            if common.json() {
                print_json(&json!({ "expiry_timestamp_ms": expiry }));
            } else {
                println!("Renewed: the token expires at {expiry} (ms since the epoch).");
            }
        }
        TokenCommand::Expire {
            hmac,
            expiry_time_period,
        } => {
            let expiry = admin
                .expire_delegation_token(&hmac_from_base64(&hmac)?, expiry_time_period)
                .await?;
            if common.json() {
                print_json(&json!({ "expiry_timestamp_ms": expiry }));
            } else {
                println!("The token expires at {expiry} (ms since the epoch).");
            }
        }
        TokenCommand::Describe { owners } => {
            let owners = (!owners.is_empty()).then_some(owners);
            let tokens = admin.describe_delegation_tokens(owners.as_deref()).await?;
            print_tokens(common, &tokens);
        }
    }
    Ok(())
}
