//! What a listener demands of its connections (Kafka's `ChannelBuilders`): TLS with
//! rustls for `SSL` and `SASL_SSL` listeners, SASL for `SASL_PLAINTEXT` and `SASL_SSL`,
//! and the principal a connection is given once it has passed them.
//!
//! TLS keys and certificates are PEM files under Kafka's names: `ssl.keystore.location`
//! with `ssl.keystore.type=PEM` (one file holding the private key and the certificate
//! chain, as Kafka's PEM keystore does), or `ssl.certificate.location` (the chain) with
//! `ssl.key.location` (the key). `ssl.client.auth=none|requested|required` asks clients
//! for a certificate, checked against the CA certificates of `ssl.truststore.location`
//! (PEM). A client that presented one is `User:` its subject in RFC 2253 form
//! (`User:CN=alice,O=Example`), rewritten by `ssl.principal.mapping.rules` as Kafka
//! does (`RULE:^CN=(.*?),O=.*$/$1/L,DEFAULT`: the first rule whose pattern matches the
//! whole subject, its replacement, lower- or upper-cased with `L`/`U`; a subject no rule
//! matches is refused); any other client is `User:ANONYMOUS`. Every key may be set per listener as
//! `listener.name.<listener>.<key>`, as in Kafka.
//!
//! Certificates are reloaded without a restart ([`ReloadableTls`]): when a listener's
//! key, certificate or CA files change on disk, or when a dynamic per-broker
//! `listener.name.<listener>.ssl.keystore.location` (and the other keys of
//! [`crate::config::RECONFIGURABLE_TLS_KEYS`]) names new ones (Kafka's dynamic keystore
//! update, `kafka-configs.sh --entity-type brokers --entity-name N --alter`), the
//! connections accepted from then on get the new ones; open connections keep theirs. A
//! change whose files do not load is refused by AlterConfigs, and one made on disk that
//! does not load leaves the listener on what it had, with a warning.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

use crate::config::{BrokerConfig, ListenerConfig, SecurityProtocol, RECONFIGURABLE_TLS_KEYS};
use crate::error::BrokerError;
use crate::network::sasl::SaslConfig;

/// Kafka's principal of a connection that proved nothing about itself.
pub const ANONYMOUS: &str = "User:ANONYMOUS";

/// One client listener as the network serves it.
pub struct ListenerSecurity {
    /// The listener's name (`PLAINTEXT`, `SSL`, `INTERNAL`, …): Metadata answers with the
    /// brokers' endpoints on this listener.
    pub name: String,
    pub protocol: SecurityProtocol,
    /// The TLS handshake, for `SSL` and `SASL_SSL`.
    pub tls: Option<ReloadableTls>,
    /// The SASL mechanisms and PLAIN users, for `SASL_PLAINTEXT` and `SASL_SSL`.
    pub sasl: Option<Arc<SaslConfig>>,
    /// `ssl.principal.mapping.rules`.
    pub principal_rules: Vec<PrincipalRule>,
}

impl std::fmt::Debug for ListenerSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerSecurity")
            .field("name", &self.name)
            .field("protocol", &self.protocol)
            .field("tls", &self.tls.is_some())
            .field("sasl", &self.sasl)
            .finish()
    }
}

impl ListenerSecurity {
    /// Reads the listener's TLS and SASL settings; a missing or unreadable key file, a
    /// bad value, refuses the start with the key named.
    pub fn from_config(
        config: &BrokerConfig,
        listener: &ListenerConfig,
    ) -> Result<Self, BrokerError> {
        let tls = if listener.protocol.uses_tls() {
            Some(ReloadableTls::new(config, &listener.name)?)
        } else {
            None
        };
        let sasl = if listener.protocol.uses_sasl() {
            Some(Arc::new(SaslConfig::from_config(config, &listener.name)?))
        } else {
            None
        };
        let principal_rules =
            match config.listener_value(&listener.name, "ssl.principal.mapping.rules") {
                Some(raw) => parse_principal_rules(raw)
                    .map_err(|e| config_error("ssl.principal.mapping.rules", &listener.name, e))?,
                None => vec![PrincipalRule::Default],
            };
        Ok(Self {
            name: listener.name.clone(),
            protocol: listener.protocol,
            tls,
            sasl,
            principal_rules,
        })
    }

    /// The principal of a TLS client by its certificate (see the module docs); `None`
    /// when the certificate cannot be read or no mapping rule matches its subject.
    pub fn principal_of_certificate(&self, der: &[u8]) -> Option<String> {
        let subject = subject_of_certificate(der)?;
        map_principal(&self.principal_rules, &subject).map(|name| format!("User:{name}"))
    }

    /// A plaintext listener, for tests.
    pub fn plaintext(name: &str) -> Self {
        Self {
            name: name.to_string(),
            protocol: SecurityProtocol::Plaintext,
            tls: None,
            sasl: None,
            principal_rules: vec![PrincipalRule::Default],
        }
    }
}

/// A TLS listener's handshake settings, rebuilt when what they are made of changes (see
/// the module docs).
pub struct ReloadableTls {
    /// The static config the dynamic keys are laid over.
    base: BrokerConfig,
    listener: String,
    /// The ALPN protocols the server offers (the HTTP listener's `http/1.1`); none on a
    /// Kafka listener.
    alpn: Vec<Vec<u8>>,
    current: std::sync::Mutex<(TlsSource, TlsAcceptor)>,
}

/// What a listener's TLS settings were built from: the dynamic keys' values and the
/// modification times of the files they name.
#[derive(Debug, Clone, PartialEq)]
struct TlsSource {
    dynamic: Vec<Option<String>>,
    files: Vec<Option<std::time::SystemTime>>,
}

impl ReloadableTls {
    fn new(base: &BrokerConfig, listener: &str) -> Result<Self, BrokerError> {
        Self::with_alpn(base, listener, Vec::new())
    }

    /// Settings for `listener` of `base` that offer `alpn` in every handshake, and are
    /// rebuilt when their files change on disk (`acceptor` with no dynamic keys: pass
    /// `base`'s own values).
    pub(crate) fn with_alpn(
        base: &BrokerConfig,
        listener: &str,
        alpn: Vec<Vec<u8>>,
    ) -> Result<Self, BrokerError> {
        let mut config = tls_server_config(base, listener)?;
        config.alpn_protocols = alpn.clone();
        // As `acceptor` will look them up: the static listener keys count as their value.
        let values = RECONFIGURABLE_TLS_KEYS
            .iter()
            .map(|k| base.static_value(&listener_key(listener, k)))
            .collect();
        let source = tls_source(base, listener, values);
        Ok(Self {
            base: base.clone(),
            listener: listener.to_string(),
            alpn,
            current: std::sync::Mutex::new((source, TlsAcceptor::from(Arc::new(config)))),
        })
    }

    /// The handshake for a connection accepted now. `dynamic` answers this broker's
    /// dynamic value of a key (the handler's `broker_config_value`).
    pub fn acceptor(&self, dynamic: impl Fn(&str) -> Option<String>) -> TlsAcceptor {
        let values: Vec<Option<String>> = RECONFIGURABLE_TLS_KEYS
            .iter()
            .map(|k| dynamic(&listener_key(&self.listener, k)))
            .collect();
        let overlay = overlay(&self.base, &self.listener, &values);
        let source = tls_source(&overlay, &self.listener, values);
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if current.0 != source {
            match tls_server_config(&overlay, &self.listener) {
                Ok(mut config) => {
                    config.alpn_protocols = self.alpn.clone();
                    tracing::info!(listener = %self.listener, "TLS key and certificates reloaded");
                    *current = (source, TlsAcceptor::from(Arc::new(config)));
                }
                Err(e) => {
                    tracing::warn!(
                        listener = %self.listener,
                        error = %e,
                        "TLS files changed but do not load; the listener keeps the ones it had"
                    );
                    // Not tried again until something changes again.
                    current.0 = source;
                }
            }
        }
        current.1.clone()
    }
}

/// `listener.name.<listener>.<key>`, as Kafka spells a listener's own key.
fn listener_key(listener: &str, key: &str) -> String {
    format!("listener.name.{}.{key}", listener.to_ascii_lowercase())
}

/// The static config with the listener's dynamic TLS keys laid over it.
fn overlay(base: &BrokerConfig, listener: &str, values: &[Option<String>]) -> BrokerConfig {
    let mut config = base.clone();
    for (key, value) in RECONFIGURABLE_TLS_KEYS.iter().zip(values) {
        if let Some(v) = value {
            config.set(&listener_key(listener, key), v);
        }
    }
    config
}

fn tls_source(config: &BrokerConfig, listener: &str, dynamic: Vec<Option<String>>) -> TlsSource {
    let files = [
        "ssl.keystore.location",
        "ssl.certificate.location",
        "ssl.key.location",
        "ssl.truststore.location",
    ]
    .iter()
    .map(|k| {
        let path = config.listener_value(listener, k)?.trim();
        std::fs::metadata(path).and_then(|m| m.modified()).ok()
    })
    .collect();
    TlsSource { dynamic, files }
}

/// Whether a broker's dynamic TLS keys, as they would be after a change, load: the
/// check AlterConfigs makes before the change reaches the metadata log (Kafka's
/// `SslFactory.validateReconfiguration` loads the new keystore too). `values` gives a
/// `listener.name.<listener>.<key>` key's value after the change.
pub fn check_tls_change(
    base: &BrokerConfig,
    listener: &str,
    values: impl Fn(&str) -> Option<String>,
) -> Result<(), BrokerError> {
    let values: Vec<Option<String>> = RECONFIGURABLE_TLS_KEYS
        .iter()
        .map(|k| values(&listener_key(listener, k)))
        .collect();
    tls_server_config(&overlay(base, listener, &values), listener).map(|_| ())
}

pub(crate) fn config_error(key: &str, listener: &str, what: impl std::fmt::Display) -> BrokerError {
    BrokerError::Config(format!("{key} (listener {listener}): {what}"))
}

/// `ssl.client.auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientAuth {
    None,
    Requested,
    Required,
}

/// The rustls server configuration of one TLS listener (see the module docs).
pub fn tls_server_config(
    config: &BrokerConfig,
    listener: &str,
) -> Result<ServerConfig, BrokerError> {
    let get = |key: &str| {
        config
            .listener_value(listener, key)
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    let Some((certs, key)) = read_keystore(config, listener)? else {
        return Err(config_error(
            "ssl.keystore.location",
            listener,
            "a TLS listener needs a certificate and key: ssl.keystore.location (PEM), \
             or ssl.certificate.location and ssl.key.location",
        ));
    };
    let client_auth = match get("ssl.client.auth")
        .unwrap_or("none")
        .to_ascii_lowercase()
        .as_str()
    {
        "none" => ClientAuth::None,
        "requested" => ClientAuth::Requested,
        "required" => ClientAuth::Required,
        other => {
            return Err(config_error(
                "ssl.client.auth",
                listener,
                format!("invalid value {other:?}: must be none, requested or required"),
            ))
        }
    };
    let versions = protocol_versions(get("ssl.enabled.protocols"), listener)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| config_error("ssl.enabled.protocols", listener, e))?;
    let builder = if client_auth == ClientAuth::None {
        builder.with_no_client_auth()
    } else {
        let path = get("ssl.truststore.location").ok_or_else(|| {
            config_error(
                "ssl.truststore.location",
                listener,
                "ssl.client.auth asks for client certificates: name the PEM file of the CAs \
                 that sign them",
            )
        })?;
        let roots = read_truststore(listener, path)?;
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
        let verifier = if client_auth == ClientAuth::Requested {
            verifier.allow_unauthenticated()
        } else {
            verifier
        };
        let verifier = verifier
            .build()
            .map_err(|e| config_error("ssl.truststore.location", listener, e))?;
        builder.with_client_cert_verifier(verifier)
    };
    builder
        .with_single_cert(certs, key)
        .map_err(|e| config_error("ssl.keystore.location", listener, e))
}

/// A listener's own key and certificate chain: `ssl.keystore.location` (PEM, key and
/// chain in one file), or `ssl.certificate.location` with `ssl.key.location`; `None`
/// when neither is set. The server presents them on the listener, and a broker presents
/// them as its client certificate when it dials the inter-broker listener of another.
pub(crate) type KeyAndChain = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

pub(crate) fn read_keystore(
    config: &BrokerConfig,
    listener: &str,
) -> Result<Option<KeyAndChain>, BrokerError> {
    let get = |key: &str| {
        config
            .listener_value(listener, key)
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    Ok(Some(
        match (
            get("ssl.keystore.location"),
            get("ssl.certificate.location"),
        ) {
            (Some(keystore), _) => {
                let kind = get("ssl.keystore.type").unwrap_or("PEM");
                if !kind.eq_ignore_ascii_case("PEM") {
                    return Err(config_error(
                        "ssl.keystore.type",
                        listener,
                        format!("{kind:?} is not supported: Rill reads PEM keystores only"),
                    ));
                }
                (
                    read_certs("ssl.keystore.location", listener, keystore)?,
                    read_key("ssl.keystore.location", listener, keystore)?,
                )
            }
            (None, Some(chain)) => {
                let key = get("ssl.key.location").ok_or_else(|| {
                    config_error(
                        "ssl.key.location",
                        listener,
                        "must be set with ssl.certificate.location",
                    )
                })?;
                (
                    read_certs("ssl.certificate.location", listener, chain)?,
                    read_key("ssl.key.location", listener, key)?,
                )
            }
            (None, None) => return Ok(None),
        },
    ))
}

/// `ssl.enabled.protocols` (Kafka's `TLSv1.2,TLSv1.3`, the default).
pub(crate) fn protocol_versions(
    raw: Option<&str>,
    listener: &str,
) -> Result<Vec<&'static rustls::SupportedProtocolVersion>, BrokerError> {
    let raw = raw.unwrap_or("TLSv1.2,TLSv1.3");
    let mut out = Vec::new();
    for v in raw.split(',').map(str::trim).filter(|v| !v.is_empty()) {
        match v {
            "TLSv1.2" => out.push(&rustls::version::TLS12),
            "TLSv1.3" => out.push(&rustls::version::TLS13),
            other => {
                return Err(config_error(
                    "ssl.enabled.protocols",
                    listener,
                    format!("{other:?} is not supported: use TLSv1.2 and/or TLSv1.3"),
                ))
            }
        }
    }
    if out.is_empty() {
        return Err(config_error("ssl.enabled.protocols", listener, "is empty"));
    }
    Ok(out)
}

/// The CAs of `ssl.truststore.location` (PEM) for `listener`: whom a server trusts to
/// sign client certificates, or a broker dialing another trusts to sign its certificate.
pub(crate) fn read_truststore(listener: &str, path: &str) -> Result<RootCertStore, BrokerError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs("ssl.truststore.location", listener, path)? {
        roots
            .add(cert)
            .map_err(|e| config_error("ssl.truststore.location", listener, e))?;
    }
    Ok(roots)
}

pub(crate) fn read_certs(
    key: &str,
    listener: &str,
    path: &str,
) -> Result<Vec<CertificateDer<'static>>, BrokerError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| config_error(key, listener, format!("{path}: {e}")))?;
    if certs.is_empty() {
        return Err(config_error(
            key,
            listener,
            format!("{path}: no certificate in it"),
        ));
    }
    Ok(certs)
}

fn read_key(key: &str, listener: &str, path: &str) -> Result<PrivateKeyDer<'static>, BrokerError> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|e| config_error(key, listener, format!("{path}: no private key read: {e}")))
}

/// One rule of `ssl.principal.mapping.rules`.
#[derive(Debug, Clone)]
pub enum PrincipalRule {
    /// The subject as it is.
    Default,
    Rule {
        pattern: regex::Regex,
        /// With Java's `$1` turned into the regex crate's `${1}`.
        replacement: String,
        case: Option<char>,
    },
}

/// Parses Kafka's rule list: `DEFAULT` and `RULE:pattern/replacement/[LU]`, separated by
/// commas (a pattern may contain commas and `\/`).
pub fn parse_principal_rules(raw: &str) -> Result<Vec<PrincipalRule>, String> {
    let mut rules = Vec::new();
    let mut rest = raw.trim();
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("DEFAULT") {
            rules.push(PrincipalRule::Default);
            rest = after;
        } else if let Some(after) = rest.strip_prefix("RULE:") {
            let (pattern, after) = until_slash(after).ok_or("RULE without /replacement/")?;
            let (replacement, after) = until_slash(after).ok_or("RULE without a closing /")?;
            let (case, after) = match after.chars().next() {
                Some(c @ ('L' | 'U')) => (Some(c), &after[1..]),
                _ => (None, after),
            };
            let pattern = regex::Regex::new(&format!("^(?:{pattern})$"))
                .map_err(|e| format!("RULE pattern {pattern:?}: {e}"))?;
            let replacement = java_replacement(&replacement);
            rules.push(PrincipalRule::Rule {
                pattern,
                replacement,
                case,
            });
            rest = after;
        } else {
            return Err(format!(
                "invalid rule at {rest:?}: use DEFAULT or RULE:pattern/replacement/[LU]"
            ));
        }
        rest = rest.trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
    if rules.is_empty() {
        return Err("no rule".into());
    }
    Ok(rules)
}

/// The text before the next unescaped `/` (with `\/` unescaped), and what follows it.
fn until_slash(s: &str) -> Option<(String, &str)> {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' if s[i + 1..].starts_with('/') => {
                out.push('/');
                chars.next();
            }
            '/' => return Some((out, &s[i + 1..])),
            c => out.push(c),
        }
    }
    None
}

/// Java's `$1` group references as the regex crate's `${1}`.
fn java_replacement(java: &str) -> String {
    let mut out = String::new();
    let mut chars = java.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
            let mut digits = String::new();
            while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                digits.push(*d);
                chars.next();
            }
            out.push_str(&format!("${{{digits}}}"));
        } else if c == '$' {
            out.push_str("$$");
        } else {
            out.push(c);
        }
    }
    out
}

/// The first rule that matches the whole subject, applied; `None` when none does.
pub fn map_principal(rules: &[PrincipalRule], subject: &str) -> Option<String> {
    rules.iter().find_map(|rule| match rule {
        PrincipalRule::Default => Some(subject.to_string()),
        PrincipalRule::Rule {
            pattern,
            replacement,
            case,
        } => {
            if !pattern.is_match(subject) {
                return None;
            }
            let mapped = pattern.replace(subject, replacement.as_str()).into_owned();
            Some(match case {
                Some('L') => mapped.to_lowercase(),
                Some('U') => mapped.to_uppercase(),
                _ => mapped,
            })
        }
    })
}

/// A certificate's subject in RFC 2253 form (most specific attribute first, as Java's
/// `X500Principal.getName()` prints it); `None` when the certificate cannot be parsed.
pub fn subject_of_certificate(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let registry = x509_parser::objects::oid_registry();
    let mut rdns: Vec<_> = cert.subject().iter().collect();
    rdns.reverse();
    let rdns: Vec<String> = rdns
        .into_iter()
        .map(|rdn| {
            rdn.iter()
                .map(|attr| {
                    let name = x509_parser::objects::oid2abbrev(attr.attr_type(), registry)
                        .map(str::to_string)
                        .unwrap_or_else(|_| attr.attr_type().to_id_string());
                    let value = attr.as_str().map(escape_rfc2253).unwrap_or_default();
                    format!("{name}={value}")
                })
                .collect::<Vec<_>>()
                .join("+")
        })
        .collect();
    Some(rdns.join(","))
}

fn escape_rfc2253(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for (i, c) in value.chars().enumerate() {
        let leading = i == 0 && (c == ' ' || c == '#');
        let trailing = i + 1 == value.chars().count() && c == ' ';
        if matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';') || leading || trailing {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_print_most_specific_first_with_escapes() {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "Example, Inc");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "alice");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let listener = ListenerSecurity::plaintext("SSL");
        assert_eq!(
            listener.principal_of_certificate(cert.der()).as_deref(),
            Some("User:CN=alice,O=Example\\, Inc")
        );
        assert_eq!(
            listener.principal_of_certificate(b"not a certificate"),
            None
        );
        let mut mapped = ListenerSecurity::plaintext("SSL");
        mapped.principal_rules =
            parse_principal_rules("RULE:^CN=(.*?),O=Example.*$/$1-svc/U, DEFAULT").unwrap();
        assert_eq!(
            mapped.principal_of_certificate(cert.der()).as_deref(),
            Some("User:ALICE-SVC")
        );
    }

    #[test]
    fn principal_mapping_rules_as_kafka_reads_them() {
        let rules = parse_principal_rules(
            "RULE:^CN=([a-zA-Z0-9.]*),OU=(.*),O=.*$/$1@$2/L,RULE:^CN=(.*?)\\/x,.*$/$1/,DEFAULT",
        )
        .unwrap();
        assert_eq!(rules.len(), 3);
        assert_eq!(
            map_principal(&rules, "CN=Kafka1,OU=Eng,O=Corp").as_deref(),
            Some("kafka1@eng")
        );
        assert_eq!(
            map_principal(&rules, "CN=svc/x,O=Corp").as_deref(),
            Some("svc")
        );
        assert_eq!(
            map_principal(&rules, "CN=other").as_deref(),
            Some("CN=other")
        );
        let strict = parse_principal_rules("RULE:^CN=(.*)$/$1/").unwrap();
        assert_eq!(map_principal(&strict, "O=nobody"), None);
        assert!(parse_principal_rules("RULE:^CN=(.*$/$1/").is_err());
        assert!(parse_principal_rules("RULES:x/y/").is_err());
        assert!(parse_principal_rules("RULE:x").is_err());
    }

    #[test]
    fn a_tls_listener_without_key_material_is_refused_naming_the_key() {
        let config = BrokerConfig::default();
        let e = tls_server_config(&config, "SSL").unwrap_err().to_string();
        assert!(e.contains("ssl.keystore.location"), "{e}");
        let mut config = BrokerConfig::default();
        config.set("ssl.certificate.location", "/nonexistent/cert.pem");
        let e = tls_server_config(&config, "SSL").unwrap_err().to_string();
        assert!(e.contains("ssl.key.location"), "{e}");
    }
}
