//! Rust source for one message spec: its structs, `Default`, `Encodable` and `Decodable`.
//!
//! The emitted code is plain and unformatted; the driver runs rustfmt over it. Version
//! conditions are simplified against the message's valid versions, so that a field present
//! in every valid version is read and written without a test.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use anyhow::{bail, Context};

use super::spec::{snake_case, Field, Message, Prim, StructDef, Type, Versions};

/// Whether a version range holds for the version being coded.
enum Cond {
    Always,
    Never,
    Expr(String),
}

/// A value to encode: a place (`self.x`) or a reference to one (`e` in `for e in v.iter()`).
#[derive(Clone)]
enum Val {
    Place(String),
    Ref(String),
}

impl Val {
    /// The value itself, for `Copy` types.
    fn copy(&self) -> String {
        match self {
            Val::Place(p) => p.clone(),
            Val::Ref(r) => format!("*{r}"),
        }
    }
    /// A reference to the value.
    fn reference(&self) -> String {
        match self {
            Val::Place(p) => format!("&{p}"),
            Val::Ref(r) => r.clone(),
        }
    }
    /// The value as a method receiver (auto-ref and auto-deref apply).
    fn target(&self) -> String {
        match self {
            Val::Place(p) | Val::Ref(p) => p.clone(),
        }
    }
}

const RESERVED_TYPE_NAMES: &[&str] = &[
    "Uuid",
    "RawTaggedField",
    "Encodable",
    "Decodable",
    "Request",
    "Bytes",
    "BytesMut",
    "BufMut",
    "DecodeError",
    "EncodeError",
    "Option",
    "Vec",
    "String",
    "Result",
    "Default",
    "Self",
];

const KEYWORDS: &[&str] = &[
    "as", "break", "const", "continue", "else", "enum", "extern", "false", "fn", "for", "if",
    "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub", "ref", "return", "static",
    "struct", "trait", "true", "type", "unsafe", "use", "where", "while", "async", "await", "dyn",
    "abstract", "become", "box", "do", "final", "macro", "override", "priv", "typeof", "unsized",
    "virtual", "yield", "try", "gen",
];

/// The Rust name of a field: snake case, raw identifier for keywords (`r#type`).
pub fn field_ident(name: &str) -> String {
    let s = snake_case(name);
    if KEYWORDS.contains(&s.as_str()) {
        format!("r#{s}")
    } else {
        s
    }
}

pub struct Emitter<'a> {
    msg: &'a Message,
    /// Every struct of the message, the top-level one first, in order of definition.
    structs: Vec<StructDef>,
    by_name: HashMap<String, usize>,
    has_flexible: bool,
}

fn elem_struct_name(ty: &Type) -> Option<&str> {
    match ty {
        Type::Struct(n) => Some(n),
        Type::Array(e) => elem_struct_name(e),
        Type::Prim(_) => None,
    }
}

fn fixed_size(p: Prim) -> Option<usize> {
    match p {
        Prim::Int8 | Prim::Bool => Some(1),
        Prim::Int16 | Prim::Uint16 => Some(2),
        Prim::Int32 | Prim::Uint32 => Some(4),
        Prim::Int64 | Prim::Float64 => Some(8),
        Prim::Uuid => Some(16),
        Prim::String | Prim::Bytes | Prim::Records => None,
    }
}

/// Escapes text for a `///` line so that rustdoc reads no links or HTML into it.
fn doc_text(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        match c {
            '[' | ']' | '<' | '>' | '`' | '*' | '_' | '#' => {
                out.push('\\');
                out.push(c);
            }
            '\n' | '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    out.trim().to_string()
}

impl<'a> Emitter<'a> {
    pub fn new(msg: &'a Message) -> anyhow::Result<Self> {
        let mut e = Emitter {
            msg,
            structs: Vec::new(),
            by_name: HashMap::new(),
            has_flexible: !msg.flexible.intersect(msg.valid).is_empty(),
        };
        e.add_struct(StructDef {
            name: msg.name.clone(),
            about: String::new(),
            fields: msg.fields.clone(),
        })?;
        for c in &msg.common_structs {
            e.add_struct(c.clone())?;
        }
        // Every struct a field names must be defined.
        for s in &e.structs {
            for f in &s.fields {
                if let Some(n) = elem_struct_name(&f.ty) {
                    if !e.by_name.contains_key(n) {
                        bail!("{}: struct {n} is not defined", msg.name);
                    }
                }
            }
        }
        Ok(e)
    }

    fn add_struct(&mut self, def: StructDef) -> anyhow::Result<()> {
        if RESERVED_TYPE_NAMES.contains(&def.name.as_str()) {
            bail!(
                "struct name {} collides with a name the generated code uses",
                def.name
            );
        }
        if let Some(&i) = self.by_name.get(&def.name) {
            let same = format!("{:?}", self.structs[i].fields) == format!("{:?}", def.fields);
            if !same {
                bail!("struct {} is defined twice with different fields", def.name);
            }
            return Ok(());
        }
        let nested: Vec<StructDef> = def
            .fields
            .iter()
            .filter_map(|f| {
                let fields = f.fields.clone()?;
                let name = elem_struct_name(&f.ty)?.to_string();
                Some(StructDef {
                    name,
                    about: f.about.clone(),
                    fields,
                })
            })
            .collect();
        self.by_name.insert(def.name.clone(), self.structs.len());
        self.structs.push(def);
        for n in nested {
            self.add_struct(n)?;
        }
        Ok(())
    }

    fn cond(&self, r: Versions) -> Cond {
        let r = r.intersect(self.msg.valid);
        if r.is_empty() {
            return Cond::Never;
        }
        let need_lo = r.lo > self.msg.valid.lo;
        let need_hi = r.hi < self.msg.valid.hi;
        match (need_lo, need_hi) {
            (false, false) => Cond::Always,
            (true, false) => Cond::Expr(format!("version >= {}", r.lo)),
            (false, true) => Cond::Expr(format!("version <= {}", r.hi)),
            (true, true) if r.lo == r.hi => Cond::Expr(format!("version == {}", r.lo)),
            (true, true) => Cond::Expr(format!("({}..={}).contains(&version)", r.lo, r.hi)),
        }
    }

    /// The condition as a boolean expression.
    fn cond_bool(&self, r: Versions) -> String {
        match self.cond(r) {
            Cond::Always => "true".into(),
            Cond::Never => "false".into(),
            Cond::Expr(e) => e,
        }
    }

    /// Whether the field uses compact encodings, as an expression.
    fn compact(&self, f: &Field) -> String {
        match f.flexible {
            Some(v) => self.cond_bool(v.intersect(self.msg.flexible)),
            None => self.flexible_var(),
        }
    }

    fn flexible_var(&self) -> String {
        match self.cond(self.msg.flexible) {
            Cond::Always => "true".into(),
            Cond::Never => "false".into(),
            Cond::Expr(_) => "flexible".into(),
        }
    }

    fn is_opt(&self, f: &Field) -> bool {
        matches!(f.ty, Type::Prim(Prim::Records))
            || !f.nullable.intersect(self.msg.valid).is_empty()
    }

    fn rust_type(ty: &Type, opt: bool) -> String {
        let base = match ty {
            Type::Prim(p) => match p {
                Prim::Int8 => "i8",
                Prim::Int16 => "i16",
                Prim::Uint16 => "u16",
                Prim::Int32 => "i32",
                Prim::Uint32 => "u32",
                Prim::Int64 => "i64",
                Prim::Float64 => "f64",
                Prim::Bool => "bool",
                Prim::Uuid => "Uuid",
                Prim::String => "String",
                Prim::Bytes | Prim::Records => "Bytes",
            }
            .to_string(),
            Type::Struct(n) => n.clone(),
            Type::Array(e) => format!("Vec<{}>", Self::rust_type(e, false)),
        };
        if opt {
            format!("Option<{base}>")
        } else {
            base
        }
    }

    fn default_expr(&self, f: &Field) -> anyhow::Result<String> {
        let opt = self.is_opt(f);
        let d = f.default.as_deref();
        let is_null = matches!(d, Some(s) if s.eq_ignore_ascii_case("null") || s == "None");
        if is_null && !opt {
            bail!("field {} defaults to null but is never nullable", f.name);
        }
        let wrap = |s: String| if opt { format!("Some({s})") } else { s };
        Ok(match &f.ty {
            Type::Prim(p) => match p {
                Prim::Int8
                | Prim::Int16
                | Prim::Uint16
                | Prim::Int32
                | Prim::Uint32
                | Prim::Int64 => {
                    let v = match d {
                        None => 0i128,
                        Some(s) => {
                            parse_int(s).with_context(|| format!("default of {}", f.name))?
                        }
                    };
                    let (ty, min, max) = match p {
                        Prim::Int8 => ("i8", i128::from(i8::MIN), i128::from(i8::MAX)),
                        Prim::Int16 => ("i16", i128::from(i16::MIN), i128::from(i16::MAX)),
                        Prim::Uint16 => ("u16", 0, i128::from(u16::MAX)),
                        Prim::Int32 => ("i32", i128::from(i32::MIN), i128::from(i32::MAX)),
                        Prim::Uint32 => ("u32", 0, i128::from(u32::MAX)),
                        _ => ("i64", i128::from(i64::MIN), i128::from(i64::MAX)),
                    };
                    if v < min || v > max {
                        bail!("default {v} of {} does not fit {ty}", f.name);
                    }
                    if v == min && v != 0 {
                        format!("{ty}::MIN")
                    } else if v == max {
                        format!("{ty}::MAX")
                    } else {
                        v.to_string()
                    }
                }
                Prim::Float64 => {
                    let v: f64 = d.map(str::parse).transpose()?.unwrap_or(0.0);
                    format!("{v:?}")
                }
                Prim::Bool => match d.map(str::to_ascii_lowercase).as_deref() {
                    None | Some("false") => "false".into(),
                    Some("true") => "true".into(),
                    Some(o) => bail!("bad bool default {o}"),
                },
                Prim::Uuid => "Uuid::ZERO".into(),
                Prim::String => {
                    if is_null {
                        "None".into()
                    } else {
                        match d {
                            None | Some("") => wrap("String::new()".into()),
                            Some(s) => wrap(format!("String::from({s:?})")),
                        }
                    }
                }
                Prim::Bytes => {
                    if is_null {
                        "None".into()
                    } else {
                        wrap("Bytes::new()".into())
                    }
                }
                Prim::Records => "None".into(),
            },
            Type::Array(_) => {
                if is_null {
                    "None".into()
                } else {
                    wrap("Vec::new()".into())
                }
            }
            Type::Struct(n) => {
                if is_null {
                    "None".into()
                } else {
                    wrap(format!("{n}::default()"))
                }
            }
        })
    }

    /// An expression that holds when the field is not at its default (tagged fields are
    /// written only then).
    fn non_default(&self, f: &Field) -> anyhow::Result<String> {
        let ident = field_ident(&f.name);
        Ok(match self.default_expr(f)?.as_str() {
            "None" => format!("self.{ident}.is_some()"),
            "false" => format!("self.{ident}"),
            "true" => format!("!self.{ident}"),
            d => format!("self.{ident} != {d}"),
        })
    }

    // ----- minimum sizes, which bound array counts against the bytes left --------------

    fn field_min(&self, f: &Field, v: i16) -> usize {
        if !f.versions.contains(v) || f.tagged.is_some_and(|(_, tv)| tv.contains(v)) {
            return 0;
        }
        let compact = f.flexible.unwrap_or(self.msg.flexible).contains(v);
        match &f.ty {
            Type::Prim(Prim::String) => {
                if compact {
                    1
                } else {
                    2
                }
            }
            Type::Prim(Prim::Bytes | Prim::Records) | Type::Array(_) => {
                if compact {
                    1
                } else {
                    4
                }
            }
            Type::Prim(p) => fixed_size(*p).unwrap_or(1),
            // A nullable struct may be just its marker; where it is not nullable there is
            // no marker and the struct itself follows.
            Type::Struct(n) => {
                if f.nullable.contains(v) {
                    1
                } else {
                    self.struct_min(n, v)
                }
            }
        }
    }

    fn struct_min(&self, name: &str, v: i16) -> usize {
        let Some(&i) = self.by_name.get(name) else {
            return 1;
        };
        let fields: usize = self.structs[i]
            .fields
            .iter()
            .map(|f| self.field_min(f, v))
            .sum();
        fields + usize::from(self.msg.flexible.contains(v))
    }

    /// The fewest bytes one array element takes in any valid version (at least 1).
    fn elem_min(&self, ty: &Type) -> usize {
        let valid = self.msg.valid;
        let min = (valid.lo..=valid.hi)
            .map(|v| {
                let compact = self.msg.flexible.contains(v);
                match ty {
                    Type::Prim(Prim::String) => {
                        if compact {
                            1
                        } else {
                            2
                        }
                    }
                    Type::Prim(Prim::Bytes | Prim::Records) | Type::Array(_) => {
                        if compact {
                            1
                        } else {
                            4
                        }
                    }
                    Type::Prim(p) => fixed_size(*p).unwrap_or(1),
                    Type::Struct(n) => self.struct_min(n, v),
                }
            })
            .min()
            .unwrap_or(1);
        min.max(1)
    }

    // ----- expressions -------------------------------------------------------------------

    /// A `Result`-valued expression that reads a value of `ty` from `buf`.
    fn decode_expr(
        &self,
        ty: &Type,
        opt: bool,
        compact: &str,
        nullable: &str,
        tagged: bool,
    ) -> String {
        match ty {
            Type::Prim(p) => {
                let f = match p {
                    Prim::Int8 => "read_i8",
                    Prim::Int16 => "read_i16",
                    Prim::Uint16 => "read_u16",
                    Prim::Int32 => "read_i32",
                    Prim::Uint32 => "read_u32",
                    Prim::Int64 => "read_i64",
                    Prim::Float64 => "read_f64",
                    Prim::Bool => "read_bool",
                    Prim::Uuid => "read_uuid",
                    Prim::String => {
                        return if opt {
                            format!("read_nullable_string(buf, {compact}, {nullable})")
                        } else {
                            format!("read_string(buf, {compact})")
                        }
                    }
                    Prim::Bytes | Prim::Records => {
                        return if opt {
                            format!("read_nullable_bytes(buf, {compact}, {nullable})")
                        } else {
                            format!("read_bytes(buf, {compact})")
                        }
                    }
                };
                format!("{f}(buf)")
            }
            Type::Struct(n) => {
                if opt {
                    format!(
                        "read_nullable_struct(buf, {nullable}, {tagged}, |buf| {n}::decode(buf, version))"
                    )
                } else {
                    format!("{n}::decode(buf, version)")
                }
            }
            Type::Array(e) => {
                let min = self.elem_min(e);
                let elem = match &**e {
                    // A function path rather than a closure that only forwards its argument.
                    Type::Prim(p) if fixed_size(*p).is_some() => {
                        let call = self.decode_expr(e, false, compact, "false", false);
                        call.trim_end_matches("(buf)").to_string()
                    }
                    _ => format!(
                        "|buf| {}",
                        self.decode_expr(e, false, compact, "false", false)
                    ),
                };
                if opt {
                    format!("read_nullable_array(buf, {compact}, {nullable}, {min}, {elem})")
                } else {
                    format!("read_array(buf, {compact}, {min}, {elem})")
                }
            }
        }
    }

    /// Statements that write `val` (of `ty`) to `buf`.
    #[allow(clippy::too_many_arguments)]
    fn encode_stmt(
        &self,
        ty: &Type,
        opt: bool,
        val: &Val,
        compact: &str,
        nullable: &str,
        fname: &str,
        tagged: bool,
    ) -> String {
        let null_arm = |write_null: String| -> String {
            match nullable {
                "true" => format!("None => {{ {write_null} }}"),
                "false" => format!("None => return Err(encode_null_error({fname:?})),"),
                n => format!("None => {{ if {n} {{ {write_null} }} else {{ return Err(encode_null_error({fname:?})); }} }}"),
            }
        };
        match ty {
            Type::Prim(p) => match p {
                Prim::Int8 => format!("buf.put_i8({});", val.copy()),
                Prim::Int16 => format!("buf.put_i16({});", val.copy()),
                Prim::Uint16 => format!("buf.put_u16({});", val.copy()),
                Prim::Int32 => format!("buf.put_i32({});", val.copy()),
                Prim::Uint32 => format!("buf.put_u32({});", val.copy()),
                Prim::Int64 => format!("buf.put_i64({});", val.copy()),
                Prim::Float64 => format!("buf.put_f64({});", val.copy()),
                Prim::Bool => format!("buf.put_u8(u8::from({}));", val.copy()),
                Prim::Uuid => format!("buf.put_slice({}.as_bytes());", val.target()),
                Prim::String => {
                    if opt {
                        format!(
                            "write_nullable_string(buf, {compact}, {nullable}, {}.as_deref(), {fname:?})?;",
                            val.target()
                        )
                    } else {
                        format!("write_string(buf, {compact}, {})?;", val.reference())
                    }
                }
                Prim::Bytes | Prim::Records => {
                    if opt {
                        format!(
                            "write_nullable_bytes(buf, {compact}, {nullable}, {}.as_deref(), {fname:?})?;",
                            val.target()
                        )
                    } else {
                        format!("write_bytes(buf, {compact}, {})?;", val.reference())
                    }
                }
            },
            Type::Struct(_) => {
                if opt {
                    // Kafka's nullable structs carry a presence marker only in the versions
                    // where they are nullable: an int8 (-1 null, 1 present) inline, an unsigned
                    // varint (0 null, 1 present) inside a tagged field.
                    let null_marker = if tagged {
                        "buf.put_u8(0);"
                    } else {
                        "buf.put_i8(-1);"
                    };
                    let present = match nullable {
                        "true" => "buf.put_u8(1);".to_string(),
                        "false" => String::new(),
                        n => format!("if {n} {{ buf.put_u8(1); }}"),
                    };
                    format!(
                        "match {} {{ Some(v) => {{ {present} v.encode(buf, version)?; }} {} }}",
                        val.reference(),
                        null_arm(null_marker.into())
                    )
                } else {
                    format!("{}.encode(buf, version)?;", val.target())
                }
            }
            Type::Array(e) => {
                let body = |v: &str| {
                    format!(
                        "write_array_len(buf, {compact}, Some({v}.len()))?; for e in {v}.iter() {{ {} }}",
                        self.encode_stmt(e, false, &Val::Ref("e".into()), compact, "false", fname, false)
                    )
                };
                if opt {
                    format!(
                        "match {} {{ Some(v) => {{ {} }} {} }}",
                        val.reference(),
                        body("v"),
                        null_arm(format!("write_array_len(buf, {compact}, None)?;"))
                    )
                } else {
                    body(&val.target())
                }
            }
        }
    }

    /// A `usize` expression: the encoded length of `val`.
    fn len_expr(&self, ty: &Type, opt: bool, val: &Val, compact: &str, nullable: &str) -> String {
        match ty {
            Type::Prim(p) => match p {
                Prim::String => {
                    if opt {
                        format!(
                            "nullable_string_len({compact}, {}.as_deref())",
                            val.target()
                        )
                    } else {
                        format!("string_len({compact}, {})", val.reference())
                    }
                }
                Prim::Bytes | Prim::Records => {
                    if opt {
                        format!("nullable_bytes_len({compact}, {}.as_deref())", val.target())
                    } else {
                        format!("bytes_len({compact}, {})", val.reference())
                    }
                }
                p => fixed_size(*p).unwrap_or(0).to_string(),
            },
            Type::Struct(_) => {
                if opt {
                    let marker = match nullable {
                        "true" => "1 + ".to_string(),
                        "false" => String::new(),
                        n => format!("usize::from({n}) + "),
                    };
                    format!(
                        "{marker}{}.as_ref().map_or(0, |v| v.encoded_len(version))",
                        val.target()
                    )
                } else {
                    format!("{}.encoded_len(version)", val.target())
                }
            }
            Type::Array(e) => {
                let inner = |v: &str| {
                    let elems = match &**e {
                        Type::Prim(p) if fixed_size(*p) == Some(1) => format!("{v}.len()"),
                        Type::Prim(p) if fixed_size(*p).is_some() => {
                            format!("{v}.len() * {}", fixed_size(*p).unwrap_or(1))
                        }
                        _ => format!(
                            "{v}.iter().map(|e| {}).sum::<usize>()",
                            self.len_expr(e, false, &Val::Ref("e".into()), compact, "false")
                        ),
                    };
                    format!("array_len_len({compact}, Some({v}.len())) + {elems}")
                };
                if opt {
                    format!(
                        "{}.as_ref().map_or(array_len_len({compact}, None), |v| {})",
                        val.target(),
                        inner("v")
                    )
                } else {
                    inner(&val.target())
                }
            }
        }
    }

    // ----- items ------------------------------------------------------------------------

    /// Versions in which the field is written inline (not in the tagged section).
    fn inline_versions(f: &Field) -> anyhow::Result<Versions> {
        match f.tagged {
            None => Ok(f.versions),
            Some((_, tv)) => {
                if tv.hi < f.versions.hi && !tv.is_empty() {
                    bail!(
                        "field {}: tagged versions must run to the last version",
                        f.name
                    );
                }
                Ok(Versions {
                    lo: f.versions.lo,
                    hi: tv.lo.saturating_sub(1),
                }
                .intersect(f.versions))
            }
        }
    }

    fn emit_struct(&self, def: &StructDef, top: bool, out: &mut String) -> anyhow::Result<()> {
        let msg = self.msg;
        let name = &def.name;
        // Field idents must be unique.
        let mut seen = HashMap::new();
        for f in &def.fields {
            if let Some(prev) = seen.insert(field_ident(&f.name), &f.name) {
                bail!(
                    "{name}: fields {prev} and {} map to the same Rust name",
                    f.name
                );
            }
        }

        // The struct.
        if top {
            let _ = writeln!(
                out,
                "/// `{}` (`{}`), versions {}{}.",
                msg.name,
                doc_text(&msg.kind),
                msg.valid.describe(),
                if self.has_flexible {
                    format!(
                        ", flexible {}",
                        msg.flexible.intersect(msg.valid).describe()
                    )
                } else {
                    String::new()
                }
            );
        } else if !def.about.is_empty() {
            let _ = writeln!(out, "/// {}", doc_text(&def.about));
        }
        let _ = writeln!(
            out,
            "#[derive(Debug, Clone, PartialEq)]\npub struct {name} {{"
        );
        for f in &def.fields {
            let mut notes = vec![format!("Versions {}", f.versions.describe())];
            if !f.nullable.is_empty() {
                notes.push(format!("nullable {}", f.nullable.describe()));
            }
            if let Some((tag, tv)) = f.tagged {
                notes.push(format!("tag {tag} in {}", tv.describe()));
            }
            if let Some(d) = &f.default {
                notes.push(format!("default {}", doc_text(d)));
            }
            if !f.about.is_empty() {
                let _ = writeln!(out, "/// {}\n///", doc_text(&f.about));
            }
            let _ = writeln!(out, "/// {}.", notes.join("; "));
            let _ = writeln!(
                out,
                "pub {}: {},",
                field_ident(&f.name),
                Self::rust_type(&f.ty, self.is_opt(f))
            );
        }
        if self.has_flexible {
            let _ = writeln!(
                out,
                "/// Tagged fields this code does not know, written back unchanged."
            );
            let _ = writeln!(out, "pub unknown_tagged_fields: Vec<RawTaggedField>,");
        }
        let _ = writeln!(out, "}}\n");

        // Default.
        let _ = writeln!(
            out,
            "impl Default for {name} {{ fn default() -> Self {{ Self {{"
        );
        for f in &def.fields {
            let _ = writeln!(out, "{}: {},", field_ident(&f.name), self.default_expr(f)?);
        }
        if self.has_flexible {
            let _ = writeln!(out, "unknown_tagged_fields: Vec::new(),");
        }
        let _ = writeln!(out, "}} }} }}\n");

        let mut tagged: Vec<&Field> = def.fields.iter().filter(|f| f.tagged.is_some()).collect();
        tagged.sort_by_key(|f| f.tagged.map(|(t, _)| t));
        let mut tags = BTreeMap::new();
        for f in &tagged {
            if let Some((t, _)) = f.tagged {
                if tags.insert(t, &f.name).is_some() {
                    bail!("{name}: tag {t} used twice");
                }
            }
        }
        let flex = self.flexible_var();
        let version_check = |err: &str| {
            if top {
                format!(
                    "if !({}..={}).contains(&version) {{ return Err({err}); }}\n",
                    msg.valid.lo, msg.valid.hi
                )
            } else {
                String::new()
            }
        };

        // Encodable.
        let mut enc = String::new();
        let mut len_terms: Vec<String> = Vec::new();
        for f in &def.fields {
            let place = Val::Place(format!("self.{}", field_ident(&f.name)));
            let opt = self.is_opt(f);
            let compact = self.compact(f);
            let nullable = self.cond_bool(f.nullable);
            let stmt = self.encode_stmt(&f.ty, opt, &place, &compact, &nullable, &f.name, false);
            let len = self.len_expr(&f.ty, opt, &place, &compact, &nullable);
            match self.cond(Self::inline_versions(f)?) {
                Cond::Never => {}
                Cond::Always => {
                    enc.push_str(&stmt);
                    enc.push('\n');
                    len_terms.push(format!("len += {len};"));
                }
                Cond::Expr(c) => {
                    let _ = writeln!(enc, "if {c} {{ {stmt} }}");
                    len_terms.push(format!("if {c} {{ len += {len}; }}"));
                }
            }
        }
        if self.has_flexible {
            let mut tenc = String::new();
            let mut tlen = String::new();
            if tagged.is_empty() {
                tenc.push_str("write_tagged_count(buf, self.unknown_tagged_fields.len())?;\n");
                tenc.push_str("for f in &self.unknown_tagged_fields { write_unknown_tagged_field(buf, f)?; }\n");
                tlen.push_str(
                    "unsigned_varint_len(self.unknown_tagged_fields.len() as u32) + unknown_tagged_fields_len(&self.unknown_tagged_fields)",
                );
            } else {
                tenc.push_str("let mut tagged_count = self.unknown_tagged_fields.len();\n");
                tlen.push_str("let mut tagged_count = self.unknown_tagged_fields.len();\n");
                tlen.push_str("let mut tagged_len = unknown_tagged_fields_len(&self.unknown_tagged_fields);\n");
                let mut writes = String::new();
                for f in &tagged {
                    let Some((tag, tv)) = f.tagged else { continue };
                    let ident = field_ident(&f.name);
                    let place = Val::Place(format!("self.{ident}"));
                    let opt = self.is_opt(f);
                    let present = match self.cond(tv) {
                        Cond::Never => continue,
                        Cond::Always => self.non_default(f)?,
                        Cond::Expr(c) => format!("{c} && {}", self.non_default(f)?),
                    };
                    let nullable = self.cond_bool(f.nullable);
                    let len = self.len_expr(&f.ty, opt, &place, "true", &nullable);
                    let stmt =
                        self.encode_stmt(&f.ty, opt, &place, "true", &nullable, &f.name, true);
                    let _ = writeln!(tenc, "if {present} {{ tagged_count += 1; }}");
                    let _ = writeln!(
                        tlen,
                        "if {present} {{ tagged_count += 1; let len = {len}; tagged_len += tag_header_len({tag}, len) + len; }}"
                    );
                    let _ = writeln!(
                        writes,
                        "if {present} {{ unknown = write_unknown_tagged_fields_before(buf, unknown, {tag})?; let len = {len}; write_tag_header(buf, {tag}, len)?; {stmt} }}"
                    );
                }
                tenc.push_str("write_tagged_count(buf, tagged_count)?;\n");
                tenc.push_str("let mut unknown = self.unknown_tagged_fields.as_slice();\n");
                tenc.push_str(&writes);
                tenc.push_str("for f in unknown { write_unknown_tagged_field(buf, f)?; }\n");
                tlen.push_str("unsigned_varint_len(tagged_count as u32) + tagged_len");
                tlen = format!("{{ {tlen} }}");
            }
            if flex == "flexible" {
                let _ = writeln!(enc, "if flexible {{ {tenc} }}");
                len_terms.push(format!("if flexible {{ len += {tlen}; }}"));
            } else {
                enc.push_str(&tenc);
                len_terms.push(format!("len += {tlen};"));
            }
        }
        let flex_decl = match self.cond(msg.flexible) {
            Cond::Expr(c) => format!("let flexible = {c};\n"),
            _ => String::new(),
        };
        let encode_body = format!(
            "{}{}{}Ok(())",
            version_check(&format!(
                "EncodeError::UnsupportedVersion {{ message: {:?}, version }}",
                msg.name
            )),
            if uses_ident(&enc, "flexible") {
                flex_decl.as_str()
            } else {
                ""
            },
            enc
        );
        let len_sum = if len_terms.is_empty() {
            "0".to_string()
        } else {
            format!("let mut len = 0;\n{}\nlen", len_terms.join("\n"))
        };
        let len_body = format!(
            "{}{}",
            if uses_ident(&len_sum, "flexible") {
                flex_decl.as_str()
            } else {
                ""
            },
            len_sum
        );
        let _ = writeln!(
            out,
            "impl Encodable for {name} {{\nfn encode(&self, buf: &mut BytesMut, {}: i16) -> Result<(), EncodeError> {{\n{encode_body}\n}}\nfn encoded_len(&self, {}: i16) -> usize {{\n{len_body}\n}}\n}}\n",
            if uses_ident(&encode_body, "version") { "version" } else { "_version" },
            if uses_ident(&len_body, "version") { "version" } else { "_version" },
        );

        // Decodable.
        let mut dec = String::new();
        for f in &def.fields {
            let ident = field_ident(&f.name);
            let opt = self.is_opt(f);
            let compact = self.compact(f);
            let nullable = self.cond_bool(f.nullable);
            let expr = self.decode_expr(&f.ty, opt, &compact, &nullable, false);
            match self.cond(Self::inline_versions(f)?) {
                Cond::Never => {}
                Cond::Always => {
                    let _ = writeln!(dec, "this.{ident} = {expr}?;");
                }
                Cond::Expr(c) => {
                    let _ = writeln!(dec, "if {c} {{ this.{ident} = {expr}?; }}");
                }
            }
        }
        if self.has_flexible {
            let mut arms = String::new();
            for f in &tagged {
                let Some((tag, tv)) = f.tagged else { continue };
                let ident = field_ident(&f.name);
                let guard = match self.cond(tv) {
                    Cond::Never => continue,
                    Cond::Always => String::new(),
                    Cond::Expr(c) => format!(" if {c}"),
                };
                let nullable = self.cond_bool(f.nullable);
                let expr = self.decode_expr(&f.ty, self.is_opt(f), "true", &nullable, true);
                let _ = writeln!(
                    arms,
                    "{tag}{guard} => {{ let buf = &mut data; this.{ident} = {expr}?; }}"
                );
            }
            let section = if arms.is_empty() {
                "let tagged_count = read_tagged_count(buf)?; for _ in 0..tagged_count { let (tag, data) = read_tagged_field(buf)?; this.unknown_tagged_fields.push(RawTaggedField { tag, data }); }".to_string()
            } else {
                format!("let tagged_count = read_tagged_count(buf)?; for _ in 0..tagged_count {{ let (tag, mut data) = read_tagged_field(buf)?; match tag {{ {arms} _ => this.unknown_tagged_fields.push(RawTaggedField {{ tag, data }}), }} }}")
            };
            if flex == "flexible" {
                let _ = writeln!(dec, "if flexible {{ {section} }}");
            } else {
                dec.push_str(&section);
                dec.push('\n');
            }
        }
        let decode_body = format!(
            "{}{}let {}this = Self::default();\n{}Ok(this)",
            version_check(&format!(
                "DecodeError::UnsupportedVersion {{ api: {:?}, version }}",
                msg.name
            )),
            if uses_ident(&dec, "flexible") {
                flex_decl.as_str()
            } else {
                ""
            },
            if dec.is_empty() { "" } else { "mut " },
            dec
        );
        let _ = writeln!(
            out,
            "impl Decodable for {name} {{\nfn decode({}: &mut Bytes, {}: i16) -> Result<Self, DecodeError> {{\n{decode_body}\n}}\n}}\n",
            if uses_ident(&decode_body, "buf") { "buf" } else { "_buf" },
            if uses_ident(&decode_body, "version") { "version" } else { "_version" },
        );
        Ok(())
    }

    /// `RandomValue` impls for every struct of the message (test support).
    pub fn emit_random(&self, module: &str) -> String {
        let mut out = String::new();
        for def in &self.structs {
            let _ = write!(
                out,
                "impl RandomValue for {module}::{} {{ fn random(rng: &mut Rng) -> Self {{ Self {{",
                def.name
            );
            for f in &def.fields {
                let _ = write!(out, "{}: RandomValue::random(rng),", field_ident(&f.name));
            }
            if self.has_flexible {
                out.push_str("unknown_tagged_fields: random_unknown_tagged_fields(rng),");
            }
            out.push_str("} } }\n\n");
        }
        out
    }

    /// The whole module file (unformatted). `response` names the response type's path for a
    /// request's `Request` impl.
    /// Whether the struct named `name`, or one it holds, has an `ErrorCode` field.
    fn holds_error_codes(&self, name: &str, depth: usize) -> bool {
        let Some(def) = self.by_name.get(name).and_then(|i| self.structs.get(*i)) else {
            return false;
        };
        // Specs nest a few levels deep; the bound only guards against a cycle.
        depth < 16
            && def.fields.iter().any(|f| {
                Self::is_error_code(f)
                    || elem_struct_name(&f.ty).is_some_and(|n| self.holds_error_codes(n, depth + 1))
            })
    }

    fn is_error_code(f: &Field) -> bool {
        f.name == "ErrorCode" && f.ty == Type::Prim(Prim::Int16)
    }

    /// Whether the message holds any `ErrorCode` field, at any depth.
    pub fn has_error_codes(&self) -> bool {
        self.holds_error_codes(&self.msg.name, 0)
    }

    /// `visit_error_codes` for each struct of a response that holds error codes: every
    /// `ErrorCode` of the message, in field order (what Kafka's `errorCounts` counts for
    /// `ErrorsPerSec`). A field absent at the version the message was made for holds its
    /// default, NONE.
    fn emit_error_code_visitors(&self, out: &mut String) {
        for def in &self.structs {
            if !self.holds_error_codes(&def.name, 0) {
                continue;
            }
            let mut body = String::new();
            for f in &def.fields {
                let id = field_ident(&f.name);
                let opt = self.is_opt(f);
                if Self::is_error_code(f) {
                    let _ = writeln!(body, "f(self.{id});");
                    continue;
                }
                let Some(n) = elem_struct_name(&f.ty) else {
                    continue;
                };
                if !self.holds_error_codes(n, 0) {
                    continue;
                }
                let place = if opt {
                    let _ = write!(body, "if let Some(v) = &self.{id} {{ ");
                    "v".to_string()
                } else {
                    format!("self.{id}")
                };
                match &f.ty {
                    Type::Array(e) if matches!(**e, Type::Struct(_)) => {
                        let _ = write!(
                            body,
                            "for e in {place}.iter() {{ e.visit_error_codes(f); }}"
                        );
                    }
                    Type::Struct(_) => {
                        let _ = write!(body, "{place}.visit_error_codes(f);");
                    }
                    // Arrays of arrays of structs do not occur in the specs.
                    _ => {}
                }
                if opt {
                    body.push_str(" }");
                }
                body.push('\n');
            }
            let _ = writeln!(
                out,
                "impl {} {{\n/// Calls `f` with every `ErrorCode` in this message, nested ones included.\npub fn visit_error_codes(&self, f: &mut dyn FnMut(i16)) {{\n{body}}}\n}}\n",
                def.name
            );
        }
    }

    pub fn emit_module(&self, source_path: &str, response: Option<&str>) -> anyhow::Result<String> {
        let msg = self.msg;
        let mut body = String::new();
        for (i, s) in self.structs.iter().enumerate() {
            self.emit_struct(s, i == 0, &mut body)
                .with_context(|| format!("struct {}", s.name))?;
        }
        if msg.kind == "response" {
            self.emit_error_code_visitors(&mut body);
        }
        // Kafka 4.1+ coordinator records (`__share_group_state`'s) carry their record type as
        // the spec's apiKey, and write it as the int16 before the key (at version 0), where
        // older ones wrote the key's version.
        match (msg.kind.as_str(), msg.api_key) {
            ("coordinator-key", Some(key)) => {
                let _ = writeln!(
                    body,
                    "impl {} {{\n/// The coordinator record type (the spec's `apiKey`): the int16 that prefixes a record's\n/// key, before the key itself at its version.\npub const RECORD_TYPE: i16 = {key};\n}}\n",
                    msg.name
                );
            }
            ("coordinator-value", Some(key)) => {
                let _ = writeln!(
                    body,
                    "impl {} {{\n/// The coordinator record type of the key this value goes with (the spec's `apiKey`); the\n/// value itself is prefixed by its own version.\npub const RECORD_TYPE: i16 = {key};\n}}\n",
                    msg.name
                );
            }
            _ => {}
        }
        if let (Some(key), Some(resp)) = (msg.api_key, response) {
            let _ = writeln!(
                body,
                "impl Request for {} {{ const API_KEY: i16 = {key}; const MIN_VERSION: i16 = {}; const MAX_VERSION: i16 = {}; type Response = {resp}; }}",
                msg.name, msg.valid.lo, msg.valid.hi
            );
        }
        let mut out = String::new();
        let what = match (msg.kind.as_str(), msg.api_key) {
            ("request" | "response", Some(k)) => format!("the {} of api key {k}", msg.kind),
            (kind, _) => format!("a `{kind}` spec"),
        };
        let _ = writeln!(
            out,
            "//! `{}`: {what}.\n//!\n//! Generated by `cargo xtask codegen` from `{source_path}`; do not edit.\n",
            msg.name
        );
        let mut bytes_items = vec!["Bytes", "BytesMut"];
        if body.contains("buf.put_") {
            bytes_items.insert(0, "BufMut");
        }
        let _ = writeln!(out, "use bytes::{{{}}};\n", bytes_items.join(", "));
        let _ = writeln!(out, "use crate::error::{{DecodeError, EncodeError}};");
        let _ = writeln!(
            out,
            "#[allow(clippy::wildcard_imports, reason = \"generated code calls many of them\")]"
        );
        let _ = writeln!(out, "use crate::primitives::*;\n");
        out.push_str(&body);
        Ok(out)
    }
}

fn parse_int(s: &str) -> anyhow::Result<i128> {
    let s = s.trim();
    let (neg, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s),
    };
    let v = match digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        Some(hex) => i128::from_str_radix(hex, 16)?,
        None => digits.parse::<i128>()?,
    };
    Ok(if neg { -v } else { v })
}

/// Whether `ident` occurs in `code` as a variable (a whole word not preceded by `.`).
fn uses_ident(code: &str, ident: &str) -> bool {
    let bytes = code.as_bytes();
    let is_word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    code.match_indices(ident).any(|(at, _)| {
        let before = at.checked_sub(1).map(|i| bytes[i]);
        let after = bytes.get(at + ident.len()).copied();
        !before.is_some_and(|b| is_word(b) || b == b'.' || b == b'#') && !after.is_some_and(is_word)
    })
}
