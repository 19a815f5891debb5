//! `rill cluster describe`: cluster id, controller and brokers.

use clap::Subcommand;
use rill_client::Admin;
use serde_json::json;

use super::{print_json, table, Common};

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Cluster id, controller and brokers.
    Describe,
}

pub async fn run(common: &Common, command: ClusterCommand) -> anyhow::Result<()> {
    let admin = Admin::new(common.client())?;
    match command {
        ClusterCommand::Describe => {
            let cluster = admin.describe_cluster().await?;
            if common.json() {
                print_json(&json!({
                    "cluster_id": cluster.cluster_id,
                    "controller_id": cluster.controller_id,
                    "brokers": cluster.brokers.values().map(|b| json!({
                        "id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack,
                    })).collect::<Vec<_>>(),
                }));
            } else {
                println!(
                    "Cluster id: {}",
                    cluster.cluster_id.as_deref().unwrap_or("-")
                );
                println!("Controller: {}", cluster.controller_id);
                let rows: Vec<Vec<String>> = cluster
                    .brokers
                    .values()
                    .map(|b| {
                        vec![
                            b.node_id.to_string(),
                            b.host.clone(),
                            b.port.to_string(),
                            b.rack.clone().unwrap_or_else(|| "-".into()),
                            if b.node_id == cluster.controller_id {
                                "yes".into()
                            } else {
                                String::new()
                            },
                        ]
                    })
                    .collect();
                table::print(&["ID", "HOST", "PORT", "RACK", "CONTROLLER"], &rows);
            }
        }
    }
    Ok(())
}
