//! Kafka's JSON message specs, parsed into a small model: messages, structs, fields, types
//! and version ranges.

use anyhow::{anyhow, bail, Context};
use serde_json::Value;

/// An inclusive version range; `lo > hi` is the empty range ("none").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Versions {
    pub lo: i16,
    pub hi: i16,
}

impl Versions {
    pub const NONE: Versions = Versions { lo: 1, hi: 0 };

    pub fn parse(s: &str) -> anyhow::Result<Self> {
        let s = s.trim();
        if s == "none" {
            return Ok(Self::NONE);
        }
        if let Some(lo) = s.strip_suffix('+') {
            return Ok(Versions {
                lo: lo.parse()?,
                hi: i16::MAX,
            });
        }
        if let Some((lo, hi)) = s.split_once('-') {
            return Ok(Versions {
                lo: lo.parse()?,
                hi: hi.parse()?,
            });
        }
        let v = s
            .parse()
            .with_context(|| format!("bad version range {s:?}"))?;
        Ok(Versions { lo: v, hi: v })
    }

    pub fn is_empty(self) -> bool {
        self.lo > self.hi
    }

    pub fn contains(self, v: i16) -> bool {
        self.lo <= v && v <= self.hi
    }

    pub fn intersect(self, other: Versions) -> Versions {
        Versions {
            lo: self.lo.max(other.lo),
            hi: self.hi.min(other.hi),
        }
    }

    /// How the range reads in docs: `3+`, `0-5`, `2`, `none`.
    pub fn describe(self) -> String {
        if self.is_empty() {
            "none".into()
        } else if self.hi == i16::MAX {
            format!("{}+", self.lo)
        } else if self.lo == self.hi {
            format!("{}", self.lo)
        } else {
            format!("{}-{}", self.lo, self.hi)
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prim {
    Int8,
    Int16,
    Uint16,
    Int32,
    Uint32,
    Int64,
    Float64,
    Bool,
    Uuid,
    String,
    Bytes,
    Records,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Type {
    Prim(Prim),
    Struct(String),
    Array(Box<Type>),
}

impl Type {
    pub fn parse(s: &str) -> anyhow::Result<Type> {
        if let Some(elem) = s.strip_prefix("[]") {
            return Ok(Type::Array(Box::new(Type::parse(elem)?)));
        }
        let p = match s {
            "int8" => Prim::Int8,
            "int16" => Prim::Int16,
            "uint16" => Prim::Uint16,
            "int32" => Prim::Int32,
            "uint32" => Prim::Uint32,
            "int64" => Prim::Int64,
            "float64" => Prim::Float64,
            "bool" => Prim::Bool,
            "uuid" => Prim::Uuid,
            "string" => Prim::String,
            "bytes" => Prim::Bytes,
            "records" => Prim::Records,
            other if other.starts_with(|c: char| c.is_ascii_uppercase()) => {
                return Ok(Type::Struct(other.to_string()))
            }
            other => bail!("unknown type {other:?}"),
        };
        Ok(Type::Prim(p))
    }
}

#[derive(Debug, Clone)]
pub struct Field {
    pub name: String,
    pub ty: Type,
    pub versions: Versions,
    pub nullable: Versions,
    /// Tag number and the versions in which the field is tagged.
    pub tagged: Option<(u32, Versions)>,
    /// Overrides the message's flexible versions (only `RequestHeader.ClientId` does).
    pub flexible: Option<Versions>,
    /// The spec's "default", as written (`null` for JSON null).
    pub default: Option<String>,
    pub about: String,
    /// Set when the field defines its struct inline.
    pub fields: Option<Vec<Field>>,
}

#[derive(Debug, Clone)]
pub struct StructDef {
    pub name: String,
    pub about: String,
    pub fields: Vec<Field>,
}

#[derive(Debug, Clone)]
pub struct Message {
    /// File stem, e.g. `MetadataRequest`.
    pub file_stem: String,
    /// `None` at the top level, else the subdirectory (`group-coordinator`).
    pub subdir: Option<String>,
    pub name: String,
    pub kind: String,
    pub api_key: Option<i16>,
    pub valid: Versions,
    pub flexible: Versions,
    pub listeners: Vec<String>,
    pub fields: Vec<Field>,
    pub common_structs: Vec<StructDef>,
}

/// Removes `//` comments, leaving `//` inside string literals (URLs in "about") alone.
pub fn strip_comments(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut chars = src.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            if c == '\\' {
                if let Some(n) = chars.next() {
                    out.push(n);
                }
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if c == '/' && chars.peek() == Some(&'/') {
            for n in chars.by_ref() {
                if n == '\n' {
                    out.push('\n');
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn scalar_string(v: &Value) -> Option<String> {
    match v {
        Value::Null => Some("null".into()),
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn parse_field(v: &Value) -> anyhow::Result<Field> {
    let name = str_of(v, "name")
        .ok_or_else(|| anyhow!("field without a name"))?
        .to_string();
    let ctx = || format!("field {name}");
    let ty = Type::parse(str_of(v, "type").ok_or_else(|| anyhow!("{name}: no type"))?)
        .with_context(ctx)?;
    let tagged_versions = str_of(v, "taggedVersions")
        .map(Versions::parse)
        .transpose()
        .with_context(ctx)?;
    // A tagged field may leave out "versions": it then exists exactly where it is tagged.
    let versions = match (str_of(v, "versions"), tagged_versions) {
        (Some(s), _) => Versions::parse(s).with_context(ctx)?,
        (None, Some(t)) => t,
        (None, None) => bail!("{name}: no versions"),
    };
    let tagged = match (tagged_versions, v.get("tag")) {
        (Some(tv), Some(tag)) => {
            let tag: u32 = match tag {
                Value::Number(n) => n
                    .as_u64()
                    .ok_or_else(|| anyhow!("{name}: bad tag"))?
                    .try_into()?,
                Value::String(s) => s.parse()?,
                _ => bail!("{name}: bad tag"),
            };
            Some((tag, tv))
        }
        (None, None) => None,
        _ => bail!("{name}: tag and taggedVersions must come together"),
    };
    let nullable = str_of(v, "nullableVersions")
        .map(Versions::parse)
        .transpose()?
        .unwrap_or(Versions::NONE);
    let flexible = str_of(v, "flexibleVersions")
        .map(Versions::parse)
        .transpose()?;
    let default = v.get("default").and_then(scalar_string);
    let about = str_of(v, "about").unwrap_or("").to_string();
    let fields = match v.get("fields") {
        Some(Value::Array(fs)) => Some(
            fs.iter()
                .map(parse_field)
                .collect::<anyhow::Result<Vec<_>>>()?,
        ),
        _ => None,
    };
    Ok(Field {
        name,
        ty,
        versions,
        nullable,
        tagged,
        flexible,
        default,
        about,
        fields,
    })
}

fn parse_fields(v: Option<&Value>) -> anyhow::Result<Vec<Field>> {
    match v {
        Some(Value::Array(fs)) => fs.iter().map(parse_field).collect(),
        None => Ok(Vec::new()),
        _ => bail!("\"fields\" is not an array"),
    }
}

pub fn parse_message(file_stem: &str, subdir: Option<&str>, src: &str) -> anyhow::Result<Message> {
    let v: Value = serde_json::from_str(&strip_comments(src)).context("invalid json")?;
    let name = str_of(&v, "name")
        .ok_or_else(|| anyhow!("no name"))?
        .to_string();
    let kind = str_of(&v, "type")
        .ok_or_else(|| anyhow!("no type"))?
        .to_string();
    let api_key = match v.get("apiKey") {
        Some(k) => Some(i16::try_from(
            k.as_i64().ok_or_else(|| anyhow!("bad apiKey"))?,
        )?),
        None => None,
    };
    let valid =
        Versions::parse(str_of(&v, "validVersions").ok_or_else(|| anyhow!("no validVersions"))?)?;
    let flexible = Versions::parse(str_of(&v, "flexibleVersions").unwrap_or("none"))?;
    let listeners = match v.get("listeners") {
        Some(Value::Array(ls)) => ls
            .iter()
            .filter_map(Value::as_str)
            .map(String::from)
            .collect(),
        _ => Vec::new(),
    };
    let fields = parse_fields(v.get("fields"))?;
    let mut common_structs = Vec::new();
    if let Some(Value::Array(cs)) = v.get("commonStructs") {
        for c in cs {
            common_structs.push(StructDef {
                name: str_of(c, "name")
                    .ok_or_else(|| anyhow!("common struct without name"))?
                    .to_string(),
                about: str_of(c, "about").unwrap_or("").to_string(),
                fields: parse_fields(c.get("fields"))?,
            });
        }
    }
    Ok(Message {
        file_stem: file_stem.to_string(),
        subdir: subdir.map(String::from),
        name,
        kind,
        api_key,
        valid,
        flexible,
        listeners,
        fields,
        common_structs,
    })
}

/// `AllowAutoTopicCreation` → `allow_auto_topic_creation`, `KRaftVersionRecord` →
/// `k_raft_version_record`, `TopicID` → `topic_id`.
pub fn snake_case(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::new();
    for (i, &c) in chars.iter().enumerate() {
        if c == '-' {
            out.push('_');
            continue;
        }
        if c.is_ascii_uppercase() && i > 0 {
            let prev = chars[i - 1];
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_ascii_lowercase());
            if prev.is_ascii_lowercase()
                || prev.is_ascii_digit()
                || (prev.is_ascii_uppercase() && next_lower)
            {
                out.push('_');
            }
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snake_cases() {
        assert_eq!(
            snake_case("AllowAutoTopicCreation"),
            "allow_auto_topic_creation"
        );
        assert_eq!(snake_case("KRaftVersionRecord"), "k_raft_version_record");
        assert_eq!(snake_case("TopicID"), "topic_id");
        assert_eq!(snake_case("group-coordinator"), "group_coordinator");
    }

    #[test]
    fn comments_inside_strings_survive() {
        let s = "{ \"about\": \"see http://x\" } // trailing\n";
        assert_eq!(strip_comments(s), "{ \"about\": \"see http://x\" } \n");
    }

    #[test]
    fn version_ranges() {
        assert_eq!(
            Versions::parse("3+").unwrap(),
            Versions {
                lo: 3,
                hi: i16::MAX
            }
        );
        assert_eq!(Versions::parse("0-5").unwrap(), Versions { lo: 0, hi: 5 });
        assert!(Versions::parse("none").unwrap().is_empty());
        assert_eq!(Versions::parse("2").unwrap(), Versions { lo: 2, hi: 2 });
    }
}
