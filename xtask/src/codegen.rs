//! `cargo xtask codegen [--check]`: the protocol code generator.
//!
//! Reads Kafka's JSON message specs and writes one Rust module per spec into
//! `crates/protocol/src/generated/` (subdirectories become submodules), plus `api.rs` with
//! `ApiKey`, `RequestBody` and `ResponseBody`. The output goes through rustfmt with the
//! workspace's `rustfmt.toml` and is committed; `--check` regenerates into a scratch
//! directory and fails when any committed file differs byte for byte, or is missing, or is
//! left over.
//!
//! Two sources, each generated file's header naming its own:
//! - `../shared/kafka-message-specs/`: Kafka 4.0's specs, for everything but
//! - the share-group family (KIP-932), read from Kafka 4.2.2's published jars in the local
//!   Maven repository ([`JAR_SPECS`] lists exactly which spec comes from which jar, and says
//!   why). [`ensure_spec_jars`] fetches the jars with Maven when they are missing; nothing
//!   of them is copied into the repository.
//!
//! - [`spec`]: the JSON specs parsed into messages, structs, fields and version ranges.
//! - [`emit`]: the Rust source of one message.
//! - this file: the sources, the file layout, `api.rs`, `mod.rs` files, rustfmt and the check.
//!
//! Besides the library code it writes `crates/protocol/tests/support/random.rs`: a random
//! value for every generated struct and a `for_each_message!` macro, which the codec's
//! property, default and differential tests sweep over every message with.

mod emit;
mod spec;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use crate::maven::{self, Artifact};
use spec::{snake_case, Message};

/// The test support file with a random-value generator for every generated struct,
/// relative to the protocol crate.
const RANDOM_RS: &str = "tests/support/random.rs";

/// The specs' subdirectories that become submodules, in output order.
const SUBDIRS: &[&str] = &[
    "group-coordinator",
    "metadata",
    "share-coordinator",
    "storage",
    "transaction-coordinator",
];

/// Specs read out of one of Kafka's published jars, which carry them as
/// `common/message/<stem>.json`, instead of from `../shared/`.
struct JarSpecs {
    artifact: Artifact,
    /// The submodule the specs become, like a subdirectory of `../shared/`; `None` for the
    /// top level.
    subdir: Option<&'static str>,
    /// Whether the jar is the whole subdirectory (nothing of it is read from `../shared/`)
    /// rather than replacing only the listed stems there.
    whole_subdir: bool,
    stems: &'static [&'static str],
    /// Stems of `../shared/` in the same subdirectory that the jar's version removed.
    removed: &'static [&'static str],
}

/// The share-group family (KIP-932), from Kafka 4.2.2's jars. `../shared/` holds Kafka 4.0's
/// specs, whose share-group apis are the early-access v0 that Kafka 4.1 removed: Kafka 4.1
/// and 4.2's Java clients and confluent-kafka 2.16's `ShareConsumer` speak
/// `ShareGroupHeartbeat` v1, `ShareFetch` and `ShareAcknowledge` v1-2, and issue #21 asks for
/// the versions Kafka 4.2 offers. A stem listed here replaces its 4.0 namesake in
/// `../shared/`; a `whole_subdir` entry's subdirectory is not read from `../shared/` at all.
/// `kafka-clients` has every request and response; `kafka-share-coordinator` has the records
/// of `__share_group_state`; `kafka-group-coordinator` has the share groups' records in
/// `__consumer_offsets`, which Kafka 4.2 changed (`ShareGroupMetadataValue` gained
/// `MetadataHash`, `ShareGroupStatePartitionMetadataValue` gained `InitializingTopics`,
/// `ShareGroupPartitionMetadata*` is gone).
const JAR_SPECS: &[JarSpecs] = &[
    JarSpecs {
        artifact: Artifact {
            group: "org.apache.kafka",
            artifact: "kafka-clients",
            version: "4.2.2",
        },
        subdir: None,
        whole_subdir: false,
        stems: &[
            // What share consumers send (api keys 76-79).
            "ShareGroupHeartbeatRequest",
            "ShareGroupHeartbeatResponse",
            "ShareGroupDescribeRequest",
            "ShareGroupDescribeResponse",
            "ShareFetchRequest",
            "ShareFetchResponse",
            "ShareAcknowledgeRequest",
            "ShareAcknowledgeResponse",
            // Share-partition leaders to the share coordinator (83-87).
            "InitializeShareGroupStateRequest",
            "InitializeShareGroupStateResponse",
            "ReadShareGroupStateRequest",
            "ReadShareGroupStateResponse",
            "WriteShareGroupStateRequest",
            "WriteShareGroupStateResponse",
            "DeleteShareGroupStateRequest",
            "DeleteShareGroupStateResponse",
            "ReadShareGroupStateSummaryRequest",
            "ReadShareGroupStateSummaryResponse",
            // The admin client's share-group offsets (90-92; not in Kafka 4.0).
            "DescribeShareGroupOffsetsRequest",
            "DescribeShareGroupOffsetsResponse",
            "AlterShareGroupOffsetsRequest",
            "AlterShareGroupOffsetsResponse",
            "DeleteShareGroupOffsetsRequest",
            "DeleteShareGroupOffsetsResponse",
        ],
        removed: &[],
    },
    // Versions Kafka 4.1 added to apis ../shared/ has at 4.0's range (issue #19): a Kafka 4.1
    // client asks for them, and the differential harness compares against a Kafka 4.1 broker.
    // 4.2.2's jar has the same ranges for these as 4.1's (tests/compat/kafka-diff's
    // kafka-api-versions.json); the broker's SUPPORTED_APIS says what Rill offers of them.
    JarSpecs {
        artifact: Artifact {
            group: "org.apache.kafka",
            artifact: "kafka-clients",
            version: "4.2.2",
        },
        subdir: None,
        whole_subdir: false,
        stems: &[
            // KIP-860: AllowReplicationFactorChange (v1).
            "AlterPartitionReassignmentsRequest",
            "AlterPartitionReassignmentsResponse",
            // KIP-1099: the member's type (v1).
            "ConsumerGroupDescribeRequest",
            "ConsumerGroupDescribeResponse",
            // KIP-1073: IncludeFencedBrokers and IsFenced (v2).
            "DescribeClusterRequest",
            "DescribeClusterResponse",
            // KIP-1043: GROUP_ID_NOT_FOUND for a group that does not exist (v6).
            "DescribeGroupsRequest",
            "DescribeGroupsResponse",
            // KIP-1142: every config resource, by type (v1).
            "ListConfigResourcesRequest",
            "ListConfigResourcesResponse",
            // KIP-1152: TransactionalIdPattern (v2).
            "ListTransactionsRequest",
            "ListTransactionsResponse",
            // KIP-1102: a top-level error code in the response (v13).
            "MetadataRequest",
            "MetadataResponse",
        ],
        // Kafka 4.1 renamed api key 74 from ListClientMetricsResources to
        // ListConfigResources when KIP-1142 made it list every kind of config resource.
        removed: &[
            "ListClientMetricsResourcesRequest",
            "ListClientMetricsResourcesResponse",
        ],
    },
    JarSpecs {
        artifact: Artifact {
            group: "org.apache.kafka",
            artifact: "kafka-share-coordinator",
            version: "4.2.2",
        },
        subdir: Some("share-coordinator"),
        whole_subdir: true,
        stems: &[
            "ShareSnapshotKey",
            "ShareSnapshotValue",
            "ShareUpdateKey",
            "ShareUpdateValue",
        ],
        removed: &[],
    },
    JarSpecs {
        artifact: Artifact {
            group: "org.apache.kafka",
            artifact: "kafka-group-coordinator",
            version: "4.2.2",
        },
        subdir: Some("group-coordinator"),
        whole_subdir: false,
        stems: &[
            "ShareGroupCurrentMemberAssignmentKey",
            "ShareGroupCurrentMemberAssignmentValue",
            "ShareGroupMemberMetadataKey",
            "ShareGroupMemberMetadataValue",
            "ShareGroupMetadataKey",
            "ShareGroupMetadataValue",
            "ShareGroupStatePartitionMetadataKey",
            "ShareGroupStatePartitionMetadataValue",
            "ShareGroupTargetAssignmentMemberKey",
            "ShareGroupTargetAssignmentMemberValue",
            "ShareGroupTargetAssignmentMetadataKey",
            "ShareGroupTargetAssignmentMetadataValue",
        ],
        removed: &[
            "ShareGroupPartitionMetadataKey",
            "ShareGroupPartitionMetadataValue",
        ],
    },
];

/// Makes sure the jars of [`JAR_SPECS`] are in the local Maven repository (fetching the
/// missing ones with `mvn dependency:get`) and returns their paths, in the table's order.
/// `codegen`, `codegen --check`, the freshness test and `cargo xtask test` (before
/// `cargo test`) all call it.
pub fn ensure_spec_jars() -> anyhow::Result<Vec<PathBuf>> {
    maven::ensure(&spec_artifacts())
}

/// Whether the jars of [`JAR_SPECS`] are all in the local Maven repository already.
pub fn spec_jars_present() -> anyhow::Result<bool> {
    maven::all_present(&spec_artifacts())
}

fn spec_artifacts() -> Vec<Artifact> {
    JAR_SPECS.iter().map(|j| j.artifact).collect()
}

/// The header's name for where a spec came from: its path under `../shared/`, or the jar and
/// the path inside it (`kafka-clients-4.2.2.jar!/common/message/ShareFetchRequest.json`).
fn source_of(msg: &Message) -> String {
    let from_jar = JAR_SPECS
        .iter()
        .find(|j| j.subdir == msg.subdir.as_deref() && j.stems.contains(&msg.file_stem.as_str()));
    match (from_jar, &msg.subdir) {
        (Some(j), _) => format!(
            "{}!/common/message/{}.json",
            j.artifact.jar_name(),
            msg.file_stem
        ),
        (None, None) => format!("{}.json", msg.file_stem),
        (None, Some(s)) => format!("{s}/{}.json", msg.file_stem),
    }
}

/// The specs `JAR_SPECS` lists, read out of `jars` (the paths of its artifacts, in order).
fn read_jar_specs(jars: &[PathBuf]) -> anyhow::Result<Vec<Message>> {
    if jars.len() != JAR_SPECS.len() {
        bail!(
            "{} spec jars given, {} expected",
            jars.len(),
            JAR_SPECS.len()
        );
    }
    let mut messages = Vec::new();
    for (specs, path) in JAR_SPECS.iter().zip(jars) {
        let file =
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let mut jar = zip::ZipArchive::new(std::io::BufReader::new(file))
            .with_context(|| format!("reading {} as a jar", path.display()))?;
        for stem in specs.stems {
            let name = format!("common/message/{stem}.json");
            let mut src = String::new();
            jar.by_name(&name)
                .with_context(|| format!("{} has no {name}", path.display()))?
                .read_to_string(&mut src)
                .with_context(|| format!("reading {name} in {}", path.display()))?;
            let msg = spec::parse_message(stem, specs.subdir, &src)
                .with_context(|| format!("parsing {name} in {}", path.display()))?;
            messages.push(msg);
        }
    }
    Ok(messages)
}

/// Versions Kafka 4.0 added after the specs in `../shared/` were taken, each identical on
/// the wire to the one before it: they only tell the broker that the client speaks
/// KIP-890's transaction version 2 (the leader adds the partition to the transaction,
/// and the group coordinator adds the offsets partition). `(message, newest version)`.
/// A spec that already reaches the version is left alone.
const WIRE_IDENTICAL_VERSIONS: &[(&str, i16)] = &[
    ("ProduceRequest", 12),
    ("ProduceResponse", 12),
    ("TxnOffsetCommitRequest", 5),
    ("TxnOffsetCommitResponse", 5),
];

pub fn run(root: &Path, args: &[String]) -> anyhow::Result<()> {
    let check = match args {
        [] => false,
        [a] if a == "--check" => true,
        _ => bail!("usage: cargo xtask codegen [--check]"),
    };
    let specs = root.join("../shared/kafka-message-specs");
    let out_dir = root.join("crates/protocol");
    let jars = ensure_spec_jars()?;
    let files = generate(root, &specs, &jars)?;
    if check {
        let stale = compare(&out_dir, &files)?;
        if !stale.is_empty() {
            bail!(
                "generated code is stale (run `cargo xtask codegen`):\n  {}",
                stale.join("\n  ")
            );
        }
        println!("codegen: {} files up to date", files.len());
    } else {
        write(&out_dir, &files)?;
        println!(
            "codegen: wrote {} files to {}",
            files.len(),
            out_dir.display()
        );
    }
    Ok(())
}

/// Every generated file, by path relative to `generated/`, formatted: from the specs in
/// `specs` (`../shared/kafka-message-specs`) and the jars of [`JAR_SPECS`] at `jars`.
pub fn generate(
    root: &Path,
    specs: &Path,
    jars: &[PathBuf],
) -> anyhow::Result<BTreeMap<PathBuf, String>> {
    let mut messages = Vec::new();
    let shared_subdirs = SUBDIRS.iter().filter(|s| {
        !JAR_SPECS
            .iter()
            .any(|j| j.whole_subdir && j.subdir == Some(**s))
    });
    for sub in std::iter::once(None).chain(shared_subdirs.map(|s| Some(*s))) {
        let dir = match sub {
            None => specs.to_path_buf(),
            Some(s) => specs.join(s),
        };
        let mut entries: Vec<PathBuf> = std::fs::read_dir(&dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        entries.sort();
        for path in entries {
            let stem = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default()
                .to_string();
            let from_jar = JAR_SPECS.iter().any(|j| {
                j.subdir == sub
                    && (j.stems.contains(&stem.as_str()) || j.removed.contains(&stem.as_str()))
            });
            if from_jar {
                continue;
            }
            let src = std::fs::read_to_string(&path)?;
            let mut msg = spec::parse_message(&stem, sub, &src)
                .with_context(|| format!("parsing {}", path.display()))?;
            if let Some((_, hi)) = WIRE_IDENTICAL_VERSIONS.iter().find(|(n, _)| *n == msg.name) {
                msg.valid.hi = msg.valid.hi.max(*hi);
            }
            messages.push(msg);
        }
    }
    messages.extend(read_jar_specs(jars)?);
    // The order of `../shared/`'s listing (top level, then each subdirectory, by file name),
    // wherever a spec came from.
    let position = |m: &Message| {
        let sub = match &m.subdir {
            None => 0,
            Some(s) => 1 + SUBDIRS.iter().position(|x| x == s).unwrap_or(SUBDIRS.len()),
        };
        (sub, m.file_stem.clone())
    };
    messages.sort_by_key(position);
    for pair in messages.windows(2) {
        if position(&pair[0]) == position(&pair[1]) {
            bail!("{} comes from two specs", pair[0].file_stem);
        }
    }

    let mut files = BTreeMap::new();
    let by_name: BTreeMap<&str, &Message> = messages.iter().map(|m| (m.name.as_str(), m)).collect();
    for msg in &messages {
        let module = snake_case(&msg.file_stem);
        let rel = match &msg.subdir {
            None => PathBuf::from(format!("{module}.rs")),
            Some(s) => PathBuf::from(snake_case(s)).join(format!("{module}.rs")),
        };
        let source = source_of(msg);
        let response = if msg.kind == "request" && msg.subdir.is_none() {
            let resp_name = response_name(&msg.name)?;
            if !by_name.contains_key(resp_name.as_str()) {
                bail!("{} has no response spec {resp_name}", msg.name);
            }
            Some(format!("super::{}::{resp_name}", snake_case(&resp_name)))
        } else {
            None
        };
        let code = emit::Emitter::new(msg)
            .and_then(|e| e.emit_module(&source, response.as_deref()))
            .with_context(|| format!("generating {source}"))?;
        files.insert(PathBuf::from("src/generated").join(rel), code);
    }
    files.insert(
        PathBuf::from("src/generated/api.rs"),
        api_rs(&messages, &by_name)?,
    );
    files.insert(
        PathBuf::from("src/generated/mod.rs"),
        mod_rs(&messages, None),
    );
    for s in SUBDIRS {
        files.insert(
            PathBuf::from("src/generated")
                .join(snake_case(s))
                .join("mod.rs"),
            mod_rs(&messages, Some(s)),
        );
    }
    files.insert(PathBuf::from(RANDOM_RS), random_rs(&messages)?);
    rustfmt(root, files)
}

/// `tests/support/random.rs`: `RandomValue` for every struct, and `for_each_message!`.
fn random_rs(messages: &[Message]) -> anyhow::Result<String> {
    let mut o = String::from(
        "//! Random values of every generated struct, for the codec's property tests. Generated by\n\
         //! `cargo xtask codegen`; do not edit.\n\n\
         use super::{random_unknown_tagged_fields, RandomValue, Rng};\n\n",
    );
    let mut list = String::new();
    for msg in messages {
        let module = match &msg.subdir {
            None => format!("rill_protocol::generated::{}", snake_case(&msg.file_stem)),
            Some(s) => format!(
                "rill_protocol::generated::{}::{}",
                snake_case(s),
                snake_case(&msg.file_stem)
            ),
        };
        let e = emit::Emitter::new(msg)?;
        o.push_str(&e.emit_random(&module));
        let _ = writeln!(
            list,
            "$m!({module}::{}, {}, {});",
            msg.name, msg.valid.lo, msg.valid.hi
        );
    }
    let _ = write!(
        o,
        "/// Calls `$m!(path::Type, min_version, max_version)` for every top-level message.\n\
         #[allow(unused_macros, reason = \"not every test file sweeps every message\")]\n\
         macro_rules! for_each_message {{ ($m:ident) => {{\n{list}}}; }}\n"
    );
    Ok(o)
}

fn response_name(request: &str) -> anyhow::Result<String> {
    match request.strip_suffix("Request") {
        Some(base) => Ok(format!("{base}Response")),
        None => bail!("request {request} is not named *Request"),
    }
}

fn mod_rs(messages: &[Message], subdir: Option<&str>) -> String {
    let mut out = String::new();
    match subdir {
        None => {
            out.push_str(
                "//! Every Kafka message type, generated by `cargo xtask codegen` from Kafka's JSON message\n\
                 //! specs: Kafka 4.0's (`../shared/kafka-message-specs/`), except the share-group family\n\
                 //! (KIP-932), which comes from Kafka 4.2.2's published jars (`kafka-clients`,\n\
                 //! `kafka-share-coordinator`) so that it has the versions Kafka 4.2 offers. Each\n\
                 //! module's header names its source: a path under `../shared/kafka-message-specs/`,\n\
                 //! or a jar and the path inside it. Do not edit: change the generator\n\
                 //! (`xtask/src/codegen.rs` and `codegen/`) and rerun it; a test fails when this output\n\
                 //! is stale.\n\
                 //!\n\
                 //! One module per spec file (`MetadataRequest.json` → [`metadata_request`]), one\n\
                 //! plain struct per message and per nested struct, each implementing\n\
                 //! [`Encodable`](crate::primitives::Encodable) and\n\
                 //! [`Decodable`](crate::primitives::Decodable) for every valid version. [`api`]\n\
                 //! holds [`ApiKey`], [`RequestBody`] and [`ResponseBody`].\n\
                 //!\n\
                 //! How the structs map the specs:\n\
                 //! - Struct and field names are the specs' (`MetadataRequestTopic`,\n\
                 //!   `allow_auto_topic_creation`; `r#type` for a field named `Type`).\n\
                 //! - A field with nullable versions is an `Option` in every version; `None` where\n\
                 //!   the version being written has no null is an `EncodeError::UnexpectedNull`.\n\
                 //!   `records` fields are always `Option<Bytes>`, decoded as slices of the input.\n\
                 //! - `Default` follows the specs' defaults, and Kafka's where they say nothing (an\n\
                 //!   empty string or array, even for a nullable one).\n\
                 //! - Encoding skips the fields the version does not have, whatever their value, and\n\
                 //!   writes a tagged field only when it differs from its default. Unknown tagged\n\
                 //!   fields are kept on decode and written back in tag order; in versions that are\n\
                 //!   not flexible they are dropped.\n\
                 //! - Decoding checks every length and count against the bytes left before it\n\
                 //!   allocates, and the version against the message's valid versions.\n\n",
            );
            out.push_str(
                "#![allow(\n    clippy::derivable_impls,\n    clippy::field_reassign_with_default,\n    \
                 clippy::large_enum_variant,\n    clippy::cmp_owned,\n    clippy::upper_case_acronyms,\n    \
                 reason = \"generated code favours one uniform shape over the shortest one\"\n)]\n\n",
            );
            out.push_str("pub mod api;\n");
        }
        Some(s) => match JAR_SPECS
            .iter()
            .find(|j| j.whole_subdir && j.subdir == Some(s))
        {
            Some(j) => {
                let _ = writeln!(
                    out,
                    "//! The message types of Kafka's `{s}` specs, generated by `cargo xtask codegen` from\n\
                     //! `{}`; do not edit.\n",
                    j.artifact.jar_name()
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "//! The message types of Kafka's `{s}` specs, generated by `cargo xtask codegen`; do not edit.\n"
                );
            }
        },
    }
    let mine: Vec<&Message> = messages
        .iter()
        .filter(|m| m.subdir.as_deref() == subdir)
        .collect();
    for m in &mine {
        let _ = writeln!(out, "pub mod {};", snake_case(&m.file_stem));
    }
    if subdir.is_none() {
        for s in SUBDIRS {
            let _ = writeln!(out, "pub mod {};", snake_case(s));
        }
        out.push_str("\npub use api::{ApiKey, RequestBody, ResponseBody};\n");
    }
    out.push('\n');
    for m in &mine {
        let _ = writeln!(out, "pub use {}::{};", snake_case(&m.file_stem), m.name);
    }
    out
}

fn api_rs(messages: &[Message], by_name: &BTreeMap<&str, &Message>) -> anyhow::Result<String> {
    let mut requests: Vec<&Message> = messages
        .iter()
        .filter(|m| m.kind == "request" && m.subdir.is_none())
        .collect();
    requests.sort_by_key(|m| m.api_key);
    let mut pairs = Vec::new();
    for req in &requests {
        let key = req
            .api_key
            .with_context(|| format!("{} has no apiKey", req.name))?;
        let resp_name = response_name(&req.name)?;
        let resp = by_name
            .get(resp_name.as_str())
            .with_context(|| format!("no {resp_name}"))?;
        let variant = req
            .name
            .strip_suffix("Request")
            .unwrap_or(&req.name)
            .to_string();
        pairs.push((key, variant, *req, *resp));
    }
    let flex_min = |m: &Message| {
        let f = m.flexible.intersect(spec::Versions {
            lo: 0,
            hi: i16::MAX,
        });
        if f.is_empty() {
            "None".to_string()
        } else {
            format!("Some({})", f.lo)
        }
    };

    let mut o = String::new();
    o.push_str(
        "//! The api keys, and requests and responses of any api key: what a connection reads before\n\
         //! it knows the message type.\n//!\n\
         //! Generated by `cargo xtask codegen`; do not edit.\n\n\
         use std::fmt;\n\nuse bytes::{Bytes, BytesMut};\n\n\
         use crate::error::{DecodeError, EncodeError};\n\
         use crate::primitives::{Decodable, Encodable};\n\n",
    );
    for (_, _, req, resp) in &pairs {
        let _ = writeln!(
            o,
            "use super::{}::{};",
            snake_case(&req.file_stem),
            req.name
        );
        let _ = writeln!(
            o,
            "use super::{}::{};",
            snake_case(&resp.file_stem),
            resp.name
        );
    }
    o.push_str(
        "\n/// A Kafka api key: which request a frame carries.\n\
         #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]\n#[repr(i16)]\npub enum ApiKey {\n",
    );
    for (key, variant, _, _) in &pairs {
        let _ = writeln!(o, "{variant} = {key},");
    }
    o.push_str("}\n\nimpl ApiKey {\n/// Every api key, in key order.\npub const ALL: &'static [ApiKey] = &[");
    for (_, variant, _, _) in &pairs {
        let _ = write!(o, "ApiKey::{variant},");
    }
    o.push_str("];\n\n/// The api key with this wire value, if there is one.\npub const fn from_i16(key: i16) -> Option<ApiKey> { match key {");
    for (key, variant, _, _) in &pairs {
        let _ = write!(o, "{key} => Some(ApiKey::{variant}),");
    }
    o.push_str("_ => None, } }\n\n/// The wire value.\npub const fn as_i16(self) -> i16 { self as i16 }\n\n");
    o.push_str("/// Kafka's name for the api (`Produce`, `ApiVersions`, …).\npub const fn name(self) -> &'static str { match self {");
    for (_, variant, _, _) in &pairs {
        let _ = write!(o, "ApiKey::{variant} => {variant:?},");
    }
    o.push_str("} }\n\n/// The request's valid versions, lowest and highest.\npub const fn valid_versions(self) -> (i16, i16) { match self {");
    for (_, variant, req, _) in &pairs {
        let _ = write!(
            o,
            "ApiKey::{variant} => ({}, {}),",
            req.valid.lo, req.valid.hi
        );
    }
    o.push_str("} }\n\n/// The first flexible version of the request, if any.\npub const fn flexible_min_version(self) -> Option<i16> { match self {");
    for (_, variant, req, _) in &pairs {
        let _ = write!(o, "ApiKey::{variant} => {},", flex_min(req));
    }
    o.push_str("} }\n\n/// The first flexible version of the response, if any.\npub const fn response_flexible_min_version(self) -> Option<i16> { match self {");
    for (_, variant, _, resp) in &pairs {
        let _ = write!(o, "ApiKey::{variant} => {},", flex_min(resp));
    }
    o.push_str("} }\n\n/// Which listeners serve the api in Kafka (`broker`, `controller`, `zkBroker`).\npub const fn listeners(self) -> &'static [&'static str] { match self {");
    for (_, variant, req, _) in &pairs {
        let ls: Vec<String> = req.listeners.iter().map(|l| format!("{l:?}")).collect();
        let _ = write!(o, "ApiKey::{variant} => &[{}],", ls.join(", "));
    }
    o.push_str(
        "} }\n\n\
         /// Whether `version` is within the valid versions.\n\
         pub const fn is_version_supported(self, version: i16) -> bool { let (lo, hi) = self.valid_versions(); lo <= version && version <= hi }\n\n\
         /// The request header version for `version` of this api: 2 in flexible versions, else 1,\n\
         /// except `ControlledShutdown` v0, the only request with header v0. Versions above the\n\
         /// valid range follow the flexible rule, so a header from a newer client still decodes.\n\
         pub const fn request_header_version(self, version: i16) -> i16 {\n\
         if matches!(self, ApiKey::ControlledShutdown) && version == 0 { return 0; }\n\
         match self.flexible_min_version() { Some(f) if version >= f => 2, _ => 1 }\n}\n\n\
         /// The response header version for `version` of this api: 1 in flexible versions, else 0,\n\
         /// except `ApiVersions`, whose response always has header v0 so that a client can read\n\
         /// it whatever version it asked for.\n\
         pub const fn response_header_version(self, version: i16) -> i16 {\n\
         if matches!(self, ApiKey::ApiVersions) { return 0; }\n\
         match self.response_flexible_min_version() { Some(f) if version >= f => 1, _ => 0 }\n}\n}\n\n\
         impl TryFrom<i16> for ApiKey {\ntype Error = DecodeError;\n\
         fn try_from(key: i16) -> Result<Self, Self::Error> { ApiKey::from_i16(key).ok_or(DecodeError::UnknownApiKey(key)) }\n}\n\n\
         impl From<ApiKey> for i16 {\nfn from(key: ApiKey) -> Self { key.as_i16() }\n}\n\n\
         impl fmt::Display for ApiKey {\nfn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.name()) }\n}\n\n",
    );

    for (side, idx) in [("Request", 2usize), ("Response", 3usize)] {
        let _ = writeln!(
            o,
            "/// A decoded {lower} of any api key.\n#[derive(Debug, Clone, PartialEq)]\npub enum {side}Body {{",
            lower = side.to_lowercase()
        );
        for p in &pairs {
            let m = if idx == 2 { p.2 } else { p.3 };
            let _ = writeln!(o, "{}({}),", p.1, m.name);
        }
        let _ = writeln!(o, "}}\n\nimpl {side}Body {{");
        let _ = writeln!(
            o,
            "/// Decodes the body of a {lower} of `api_key` at `version` (the header already read).\n\
             pub fn decode(api_key: ApiKey, version: i16, buf: &mut Bytes) -> Result<Self, DecodeError> {{ match api_key {{",
            lower = side.to_lowercase()
        );
        for p in &pairs {
            let m = if idx == 2 { p.2 } else { p.3 };
            let _ = write!(
                o,
                "ApiKey::{v} => {n}::decode(buf, version).map(Self::{v}),",
                v = p.1,
                n = m.name
            );
        }
        o.push_str("} }\n\n/// The api key of the message inside.\npub fn api_key(&self) -> ApiKey { match self {");
        for p in &pairs {
            let _ = write!(o, "Self::{v}(_) => ApiKey::{v},", v = p.1);
        }
        o.push_str("} }\n\n/// Encodes the message inside at `version`.\npub fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<(), EncodeError> { match self {");
        for p in &pairs {
            let _ = write!(o, "Self::{v}(m) => m.encode(buf, version),", v = p.1);
        }
        o.push_str("} }\n\n/// The encoded length of the message inside at `version`.\npub fn encoded_len(&self, version: i16) -> usize { match self {");
        for p in &pairs {
            let _ = write!(o, "Self::{v}(m) => m.encoded_len(version),", v = p.1);
        }
        o.push_str("} }\n");
        if idx == 3 {
            // Quotas set the throttle time of any response that has one (KIP-219).
            o.push_str(
                "\n/// Raises the response's top-level `ThrottleTimeMs` to at least `ms`; `false` when\n\
                 /// the response has no such field.\n\
                 pub fn raise_throttle_time_ms(&mut self, ms: i32) -> bool { match self {",
            );
            for p in &pairs {
                if p.3.fields.iter().any(|f| f.name == "ThrottleTimeMs") {
                    let _ = write!(
                        o,
                        "Self::{v}(m) => {{ m.throttle_time_ms = m.throttle_time_ms.max(ms); true }}",
                        v = p.1
                    );
                }
            }
            o.push_str("_ => false, } }\n");
        }
        if idx == 3 {
            // ErrorsPerSec counts the error codes of every response.
            o.push_str(
                "\n/// Calls `f` with every `ErrorCode` the response holds, nested ones included.\n\
                 pub fn visit_error_codes(&self, f: &mut dyn FnMut(i16)) { match self {",
            );
            let mut every = true;
            for p in &pairs {
                if emit::Emitter::new(p.3)?.has_error_codes() {
                    let _ = write!(o, "Self::{v}(m) => m.visit_error_codes(f),", v = p.1);
                } else {
                    every = false;
                }
            }
            o.push_str(if every { "} }\n" } else { "_ => {} } }\n" });
        }
        o.push_str("}\n\n");
        let _ = writeln!(
            o,
            "impl Encodable for {side}Body {{ fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<(), EncodeError> {{ {side}Body::encode(self, buf, version) }} fn encoded_len(&self, version: i16) -> usize {{ {side}Body::encoded_len(self, version) }} }}\n"
        );
        for p in &pairs {
            let m = if idx == 2 { p.2 } else { p.3 };
            let _ = writeln!(
                o,
                "impl From<{n}> for {side}Body {{ fn from(m: {n}) -> Self {{ Self::{v}(m) }} }}",
                n = m.name,
                v = p.1
            );
        }
        o.push('\n');
    }
    Ok(o)
}

/// Formats every file with rustfmt (one run over `mod.rs`, which reaches all modules).
fn rustfmt(
    root: &Path,
    files: BTreeMap<PathBuf, String>,
) -> anyhow::Result<BTreeMap<PathBuf, String>> {
    let scratch = std::env::temp_dir().join(format!("rill-codegen-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let result = format_in(root, &scratch, &files);
    if result.is_ok() {
        let _ = std::fs::remove_dir_all(&scratch);
    }
    result
}

fn format_in(
    root: &Path,
    scratch: &Path,
    files: &BTreeMap<PathBuf, String>,
) -> anyhow::Result<BTreeMap<PathBuf, String>> {
    for (rel, code) in files {
        let path = scratch.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, code)?;
    }
    let status = Command::new("rustfmt")
        .current_dir(root)
        .arg("--edition=2021")
        .arg("--config-path")
        .arg(root.join("rustfmt.toml"))
        .arg(scratch.join("src/generated/mod.rs"))
        .arg(scratch.join(RANDOM_RS))
        .status()
        .context("running rustfmt")?;
    if !status.success() {
        bail!(
            "rustfmt failed on the generated code (in {})",
            scratch.display()
        );
    }
    let mut out = BTreeMap::new();
    for rel in files.keys() {
        out.insert(rel.clone(), std::fs::read_to_string(scratch.join(rel))?);
    }
    Ok(out)
}

/// Every `.rs` file under `dir`, relative to it.
fn existing_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p.strip_prefix(dir)?.to_path_buf());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The files that differ between `dir` and `files`, described.
pub fn compare(dir: &Path, files: &BTreeMap<PathBuf, String>) -> anyhow::Result<Vec<String>> {
    let mut stale = Vec::new();
    for (rel, code) in files {
        match std::fs::read_to_string(dir.join(rel)) {
            Ok(existing) if existing == *code => {}
            Ok(_) => stale.push(format!("differs: {}", rel.display())),
            Err(_) => stale.push(format!("missing: {}", rel.display())),
        }
    }
    for rel in existing_files(&dir.join("src/generated"))? {
        let rel = Path::new("src/generated").join(rel);
        if !files.contains_key(&rel) {
            stale.push(format!("left over: {}", rel.display()));
        }
    }
    Ok(stale)
}

fn write(dir: &Path, files: &BTreeMap<PathBuf, String>) -> anyhow::Result<()> {
    for rel in existing_files(&dir.join("src/generated"))? {
        let rel = Path::new("src/generated").join(rel);
        if !files.contains_key(&rel) {
            std::fs::remove_file(dir.join(&rel))?;
        }
    }
    for (rel, code) in files {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        if std::fs::read_to_string(&path).ok().as_deref() != Some(code.as_str()) {
            std::fs::write(&path, code)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed output must be exactly what the generator writes today.
    #[test]
    fn committed_output_is_fresh() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let jars = ensure_spec_jars().unwrap();
        let files = generate(&root, &root.join("../shared/kafka-message-specs"), &jars).unwrap();
        let stale = compare(&root.join("crates/protocol"), &files).unwrap();
        assert!(
            stale.is_empty(),
            "stale generated code, run `cargo xtask codegen`:\n{}",
            stale.join("\n")
        );
    }

    /// The jars keep Kafka's api key numbers and versions for the share-group family (which
    /// `ApiKey` takes from them), and the record types of `__share_group_state`.
    #[test]
    fn share_group_specs_from_the_jars_are_kafka_4_2s() {
        let messages = read_jar_specs(&ensure_spec_jars().unwrap()).unwrap();
        let listed: usize = JAR_SPECS.iter().map(|j| j.stems.len()).sum();
        assert_eq!(messages.len(), listed);
        let find = |name: &str| {
            let m = messages.iter().find(|m| m.name == name);
            m.unwrap_or_else(|| panic!("no {name} in the jars"))
        };
        for (api, key, lo, hi) in [
            ("ShareGroupHeartbeat", 76, 1, 1),
            ("ShareGroupDescribe", 77, 1, 1),
            ("ShareFetch", 78, 1, 2),
            ("ShareAcknowledge", 79, 1, 2),
            ("InitializeShareGroupState", 83, 0, 0),
            ("ReadShareGroupState", 84, 0, 0),
            ("WriteShareGroupState", 85, 0, 1),
            ("DeleteShareGroupState", 86, 0, 0),
            ("ReadShareGroupStateSummary", 87, 0, 1),
            ("DescribeShareGroupOffsets", 90, 0, 1),
            ("AlterShareGroupOffsets", 91, 0, 0),
            ("DeleteShareGroupOffsets", 92, 0, 0),
        ] {
            for side in ["Request", "Response"] {
                let m = find(&format!("{api}{side}"));
                assert_eq!(m.api_key, Some(key), "{}", m.name);
                assert_eq!((m.valid.lo, m.valid.hi), (lo, hi), "{}", m.name);
                assert_eq!(m.subdir, None);
            }
        }
        for (record, key) in [("ShareSnapshot", 0), ("ShareUpdate", 1)] {
            for (side, kind) in [("Key", "coordinator-key"), ("Value", "coordinator-value")] {
                let m = find(&format!("{record}{side}"));
                assert_eq!(
                    (m.kind.as_str(), m.api_key),
                    (kind, Some(key)),
                    "{}",
                    m.name
                );
                assert_eq!(m.subdir.as_deref(), Some("share-coordinator"));
            }
        }
        // The share groups' records in `__consumer_offsets`, as Kafka 4.2 writes them.
        for (record, key) in [
            ("ShareGroupMemberMetadata", 10),
            ("ShareGroupMetadata", 11),
            ("ShareGroupTargetAssignmentMetadata", 12),
            ("ShareGroupTargetAssignmentMember", 13),
            ("ShareGroupCurrentMemberAssignment", 14),
            ("ShareGroupStatePartitionMetadata", 15),
        ] {
            for (side, kind) in [("Key", "coordinator-key"), ("Value", "coordinator-value")] {
                let m = find(&format!("{record}{side}"));
                assert_eq!(
                    (m.kind.as_str(), m.api_key),
                    (kind, Some(key)),
                    "{}",
                    m.name
                );
                assert_eq!(m.subdir.as_deref(), Some("group-coordinator"));
            }
        }
        let metadata = find("ShareGroupMetadataValue");
        assert!(metadata.fields.iter().any(|f| f.name == "MetadataHash"));
        let state = find("ShareGroupStatePartitionMetadataValue");
        assert!(state.fields.iter().any(|f| f.name == "InitializingTopics"));
    }
}
