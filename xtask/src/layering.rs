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
        ("rill-share", &["rill-protocol"]),
        ("rill-metadata", &["rill-protocol"]),
        ("rill-client", &["rill-protocol"]),
        (
            "rill-broker",
            &[
                "rill-protocol",
                "rill-storage",
                "rill-group",
                "rill-transaction",
                "rill-share",
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

/// The same check one level down: the top-level modules ("parts") of a library crate and the
/// `crate::` paths between them, as Kafka's `checkstyle/import-control*.xml` checks packages.
///
/// A part is a top-level module of `src/` (`network` for `network.rs` and everything under
/// `network/`); the crate root (`lib.rs`) is the part `crate`, and an item the root
/// re-exports counts as the module it comes from. Only code the library is built from
/// counts: `#[cfg(test)]` modules, inline or in files of their own, may reach any part (a
/// network test starts a whole server, as the house rules ask). `super::` paths that leave
/// their part are resolved too; a `use` with `self` or a glob of a whole part is an edge
/// to that part.
#[cfg(test)]
mod modules {
    use std::collections::{BTreeMap, BTreeSet};
    use std::fs;
    use std::path::{Path, PathBuf};

    /// For each part of `rill-broker`, the parts it may name. Parts lower in the list are
    /// lower in the layering; ARCHITECTURE.md's code map says why each edge exists.
    const BROKER_ALLOWED: &[(&str, &[&str])] = &[
        ("error", &[]),
        ("config", &["error"]),
        ("data_dir_lock", &["error"]),
        ("meta_properties", &["config", "error"]),
        ("log_dir_failure", &[]),
        ("rate", &[]),
        ("metrics", &[]),
        ("network", &["rate", "config", "error", "metrics"]),
        (
            "replication",
            // `network`: the fetchers dial leaders with its inter-broker connector.
            &[
                "network",
                "rate",
                "config",
                "error",
                "log_dir_failure",
                "metrics",
            ],
        ),
        (
            "coordinator",
            &["replication", "network", "config", "error", "metrics"],
        ),
        (
            "remote_log",
            // `replication`: the partitions' logs, and the controller channel its
            // remote segment changes go through.
            &["replication", "config", "error", "metrics"],
        ),
        (
            "server",
            &[
                "coordinator",
                "remote_log",
                "replication",
                "network",
                "rate",
                "config",
                "error",
                "metrics",
            ],
        ),
        (
            "http",
            // `network`: the listener's TLS config and its users' credentials (SASL PLAIN
            // and SCRAM) for Basic authentication.
            &[
                "server",
                "coordinator",
                "remote_log",
                "replication",
                "network",
                "config",
                "error",
                "metrics",
            ],
        ),
        (
            "metadata_publisher",
            &[
                "server",
                "coordinator",
                "remote_log",
                "replication",
                "network",
                "config",
                "error",
            ],
        ),
        (
            "broker_lifecycle",
            &[
                "metadata_publisher",
                "server",
                "coordinator",
                "replication",
                "config",
                "error",
            ],
        ),
        (
            "shared_server",
            // `metrics`: the sink the controller loop's figures go to, installed as the
            // quorum starts. `network`: the controller listener's TLS/SASL under the
            // quorum (`controller_channel`) and the formatted SCRAM users
            // (`bootstrap_scram`).
            &[
                "network",
                "config",
                "data_dir_lock",
                "meta_properties",
                "error",
                "metrics",
            ],
        ),
        (
            "controller_server",
            &["shared_server", "http", "config", "data_dir_lock", "error"],
        ),
    ];

    fn crate_src(name: &str) -> PathBuf {
        super::super::workspace_root()
            .join("crates")
            .join(name)
            .join("src")
    }

    #[test]
    fn broker_parts_follow_the_table() {
        let edges = part_edges(&crate_src("broker"));
        let allowed: BTreeMap<&str, &[&str]> = BROKER_ALLOWED.iter().copied().collect();
        let mut wrong = Vec::new();
        for (from, tos) in &edges {
            if from == "crate" {
                continue;
            }
            let Some(ok) = allowed.get(from.as_str()) else {
                wrong.push(format!(
                    "{from} is not in the broker's layering table; add it"
                ));
                continue;
            };
            for to in tos {
                if !ok.contains(&to.as_str()) {
                    wrong.push(format!("forbidden module edge: {from} -> {to}"));
                }
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
        // The table itself must be a layering: no cycle even among allowed edges.
        let table: BTreeMap<String, BTreeSet<String>> = BROKER_ALLOWED
            .iter()
            .map(|(k, v)| (k.to_string(), v.iter().map(|s| s.to_string()).collect()))
            .collect();
        assert_eq!(
            cycle(&table),
            None,
            "the broker's layering table has a cycle"
        );
        assert_eq!(cycle(&edges), None, "module cycle in rill-broker");
    }

    #[test]
    fn storage_modules_have_no_cycle() {
        let edges = part_edges(&crate_src("storage"));
        assert_eq!(cycle(&edges), None, "module cycle in rill-storage");
    }

    #[test]
    fn the_parser_sees_the_edges_it_must() {
        let dir = std::env::temp_dir().join(format!("rill-layering-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("a")).unwrap();
        fs::write(
            dir.join("lib.rs"),
            "mod a;\nmod b;\nmod c;\nmod d;\n#[cfg(test)]\nmod e;\npub use d::Thing;\npub struct Root;\n",
        )
        .unwrap();
        fs::write(
            dir.join("a/mod.rs"),
            "mod inner;\n// crate::c in a comment\n",
        )
        .unwrap();
        fs::write(
            dir.join("a/inner.rs"),
            "use super::super::b::X;\nuse crate::{Thing, c::{self, Y}};\nfn f() { crate::Root; }\n\
             #[cfg(test)]\nmod tests {\n    use crate::e::Z;\n    fn g() { let _ = \"}\"; }\n}\nuse crate::b::W;\n",
        )
        .unwrap();
        fs::write(dir.join("b.rs"), "").unwrap();
        fs::write(dir.join("c.rs"), "use crate::a::Q;\n").unwrap();
        fs::write(dir.join("d.rs"), "").unwrap();
        fs::write(dir.join("e.rs"), "use crate::a::P;\n").unwrap();
        let edges = part_edges(&dir);
        let a: Vec<&str> = edges["a"].iter().map(String::as_str).collect();
        assert_eq!(a, ["b", "c", "crate", "d"]);
        assert!(
            !edges.contains_key("e"),
            "a test-only module counted: {edges:?}"
        );
        assert_eq!(
            cycle(&edges),
            Some(vec!["a".into(), "c".into(), "a".into()])
        );
        let _ = fs::remove_dir_all(&dir);
    }

    /// The parts each part names, from every library file under `src`.
    fn part_edges(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
        let root = fs::read_to_string(src.join("lib.rs")).unwrap();
        let root_code = strip_comments(&root);
        let parts = declared_modules(&root_code);
        let reexports = reexports(&root_code, &parts);
        let test_only = test_only_files(src);
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for file in rust_files(src) {
            if test_only.iter().any(|t| file.starts_with(t)) {
                continue;
            }
            let rel = file.strip_prefix(src).unwrap();
            let mut path: Vec<String> = rel
                .iter()
                .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
                .collect();
            if path.last().is_some_and(|l| l == "mod" || l == "lib") {
                path.pop();
            }
            let part = path.first().cloned().unwrap_or_else(|| "crate".into());
            let code = strip_test_modules(&strip_comments(&fs::read_to_string(&file).unwrap()));
            let to = edges.entry(part.clone()).or_default();
            for target in named_parts(&code, path.len()) {
                let resolved = if parts.contains(&target) {
                    target
                } else if let Some(m) = reexports.get(&target) {
                    m.clone()
                } else {
                    "crate".into()
                };
                if resolved != part {
                    to.insert(resolved);
                }
            }
        }
        edges
    }

    fn rust_files(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for entry in fs::read_dir(dir).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                out.extend(rust_files(&p));
            } else if p.extension().is_some_and(|e| e == "rs") {
                out.push(p);
            }
        }
        out.sort();
        out
    }

    /// Files (and folders) of modules declared under `#[cfg(test)]`.
    fn test_only_files(src: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for file in rust_files(src) {
            let code = strip_comments(&fs::read_to_string(&file).unwrap());
            let name = file.file_stem().unwrap().to_string_lossy().to_string();
            let dir = if ["lib", "mod", "main"].contains(&name.as_str()) {
                file.parent().unwrap().to_path_buf()
            } else {
                file.parent().unwrap().join(&name)
            };
            let lines: Vec<&str> = code.lines().map(str::trim).collect();
            for (i, line) in lines.iter().enumerate() {
                if *line != "#[cfg(test)]" {
                    continue;
                }
                let Some(next) = lines[i + 1..].iter().find(|l| !l.is_empty()) else {
                    continue;
                };
                let decl = next
                    .trim_start_matches("pub(crate) ")
                    .trim_start_matches("pub ");
                if let Some(m) = decl.strip_prefix("mod ").and_then(|d| d.strip_suffix(';')) {
                    out.push(dir.join(format!("{m}.rs")));
                    out.push(dir.join(m));
                }
            }
        }
        out
    }

    /// The text with `//` comments (and so doc comments) blanked out, strings kept.
    fn strip_comments(text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        for line in text.lines() {
            let mut in_str = false;
            let mut prev = ' ';
            let mut cut = line.len();
            for (i, c) in line.char_indices() {
                if c == '"' && prev != '\\' {
                    in_str = !in_str;
                } else if !in_str && c == '/' && prev == '/' {
                    cut = i - 1;
                    break;
                }
                prev = if prev == '\\' && c == '\\' { ' ' } else { c };
            }
            out.push_str(&line[..cut]);
            out.push('\n');
        }
        out
    }

    /// The text without `#[cfg(test)] mod name { ... }` blocks (braces in string and char
    /// literals skipped).
    fn strip_test_modules(code: &str) -> String {
        let mut out = String::with_capacity(code.len());
        let mut rest = code;
        while let Some(at) = rest.find("#[cfg(test)]") {
            out.push_str(&rest[..at]);
            let after = &rest[at + "#[cfg(test)]".len()..];
            let decl = after.trim_start();
            let decl = decl.strip_prefix("pub(crate) ").unwrap_or(decl);
            let is_inline_mod = decl.starts_with("mod ")
                && decl
                    .find('{')
                    .is_some_and(|b| decl.find(';').is_none_or(|s| b < s));
            if !is_inline_mod {
                out.push_str("#[cfg(test)]");
                rest = after;
                continue;
            }
            let start = after.len() - decl.len() + decl.find('{').unwrap_or(0);
            let bytes = after.as_bytes();
            let (mut depth, mut i, mut in_str) = (0usize, start, false);
            while i < bytes.len() {
                match bytes[i] {
                    b'\\' if in_str => i += 1,
                    b'"' => in_str = !in_str,
                    b'\'' if !in_str && bytes.get(i + 2) == Some(&b'\'') => i += 2,
                    b'{' if !in_str => depth += 1,
                    b'}' if !in_str => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            rest = after.get(i + 1..).unwrap_or("");
        }
        out.push_str(rest);
        out
    }

    /// `mod x;` and `pub mod x;` declarations of the root.
    fn declared_modules(code: &str) -> BTreeSet<String> {
        code.lines()
            .filter_map(|l| {
                let l = l.trim();
                let l = l
                    .strip_prefix("pub(crate) ")
                    .or(l.strip_prefix("pub "))
                    .unwrap_or(l);
                l.strip_prefix("mod ")?
                    .strip_suffix(';')
                    .map(str::to_string)
            })
            .collect()
    }

    /// Item name → the part it comes from, for the root's `pub use part::...;` lines.
    fn reexports(code: &str, parts: &BTreeSet<String>) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for stmt in code.split(';') {
            let s = stmt.trim();
            let Some(path) = s.strip_prefix("pub use ").or(s.strip_prefix("use ")) else {
                continue;
            };
            let path = path.trim().trim_start_matches("crate::");
            let Some((part, items)) = path.split_once("::") else {
                continue;
            };
            if !parts.contains(part) {
                continue;
            }
            let items = items.trim_start_matches('{').trim_end_matches('}');
            for item in items.split(',') {
                let name = item.rsplit("::").next().unwrap_or("").trim();
                let name = name.rsplit(" as ").next().unwrap_or(name).trim();
                if !name.is_empty() && name != "self" && name != "*" {
                    out.insert(name.to_string(), part.to_string());
                }
            }
        }
        out
    }

    /// The first segment after `crate::` (and inside `crate::{...}`) of every path, and the
    /// first segment after a chain of `super::` that reaches the root from a file `depth`
    /// modules deep.
    fn named_parts(code: &str, depth: usize) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let ident = |s: &str| -> String {
            s.chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect()
        };
        let bytes = code.as_bytes();
        let boundary = |at: usize| {
            at == 0
                || !(bytes[at - 1].is_ascii_alphanumeric()
                    || bytes[at - 1] == b'_'
                    || bytes[at - 1] == b':')
        };
        for (at, _) in code.match_indices("crate::") {
            if !boundary(at) {
                continue;
            }
            let rest = &code[at + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let mut level = 0usize;
                let mut item_start = true;
                for (i, c) in group.char_indices() {
                    match c {
                        '{' => level += 1,
                        '}' if level == 0 => break,
                        '}' => level -= 1,
                        ',' if level == 0 => item_start = true,
                        c if c.is_whitespace() => {}
                        _ if item_start && level == 0 => {
                            let name = ident(&group[i..]);
                            if !name.is_empty() {
                                out.insert(name);
                            }
                            item_start = false;
                        }
                        _ => {}
                    }
                }
            } else {
                let name = ident(rest);
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        }
        for (at, _) in code.match_indices("super::") {
            if !boundary(at) {
                continue;
            }
            let mut rest = &code[at..];
            let mut ups = 0;
            while let Some(r) = rest.strip_prefix("super::") {
                ups += 1;
                rest = r;
            }
            if ups >= depth {
                let name = ident(rest);
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        }
        out
    }

    /// A cycle among the parts as a path that returns to its start, if there is one.
    fn cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
        fn visit(
            node: &str,
            edges: &BTreeMap<String, BTreeSet<String>>,
            stack: &mut Vec<String>,
            done: &mut BTreeSet<String>,
        ) -> Option<Vec<String>> {
            if let Some(i) = stack.iter().position(|n| n == node) {
                let mut c = stack[i..].to_vec();
                c.push(node.to_string());
                return Some(c);
            }
            if done.contains(node) {
                return None;
            }
            stack.push(node.to_string());
            for next in edges.get(node).into_iter().flatten() {
                if let Some(c) = visit(next, edges, stack, done) {
                    return Some(c);
                }
            }
            stack.pop();
            done.insert(node.to_string());
            None
        }
        let mut done = BTreeSet::new();
        for node in edges.keys() {
            if let Some(c) = visit(node, edges, &mut Vec::new(), &mut done) {
                return Some(c);
            }
        }
        None
    }

    /// Prints each crate's edges (`cargo test -p xtask print_part_edges -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn print_part_edges() {
        for name in ["broker", "storage"] {
            println!("{name}:");
            for (from, tos) in part_edges(&crate_src(name)) {
                println!(
                    "  {from} -> {}",
                    tos.into_iter().collect::<Vec<_>>().join(", ")
                );
            }
        }
    }
}
