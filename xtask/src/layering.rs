//! The layering check: dependencies between workspace crates point downwards only, as
//! ARCHITECTURE.md states. Run by `cargo test -p xtask` (and so by `cargo xtask test`).

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::process::Command;

    /// For each workspace crate, the workspace crates it may depend on.
    const ALLOWED: &[(&str, &[&str])] = &[
        ("rill-protocol", &[]),
        ("rill-storage", &["rill-protocol"]),
        ("rill-group", &["rill-protocol"]),
        ("rill-transaction", &["rill-protocol"]),
        ("rill-metadata", &["rill-protocol"]),
        ("rill-client", &["rill-protocol"]),
        (
            "rill-broker",
            &[
                "rill-protocol",
                "rill-storage",
                "rill-group",
                "rill-metadata",
            ],
        ),
        ("rill", &["rill-broker", "rill-client", "rill-protocol"]),
        ("xtask", &[]),
    ];

    #[test]
    fn workspace_dependencies_point_downwards() {
        let out = Command::new(env!("CARGO"))
            .args([
                "metadata",
                "--format-version",
                "1",
                "--no-deps",
                "--offline",
            ])
            .current_dir(super::super::workspace_root())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let packages = meta["packages"].as_array().unwrap();
        let names: BTreeSet<&str> = packages
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
        for p in packages {
            let name = p["name"].as_str().unwrap();
            let ok = allowed
                .get(name)
                .unwrap_or_else(|| panic!("{name} is not in the layering table; add it"));
            for dep in p["dependencies"].as_array().unwrap() {
                let dep = dep["name"].as_str().unwrap();
                if dep == name || !names.contains(dep) {
                    continue;
                }
                let dev = dep_kind(p, dep) == Some("dev");
                assert!(
                    dev || ok.contains(&dep),
                    "forbidden dependency edge: {name} -> {dep}"
                );
            }
        }
    }

    fn dep_kind<'a>(p: &'a serde_json::Value, dep: &str) -> Option<&'a str> {
        p["dependencies"]
            .as_array()?
            .iter()
            .find(|d| d["name"] == dep)
            .and_then(|d| d["kind"].as_str())
    }
}
