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
//! (`User:CN=alice,O=Example`), as Kafka's default `ssl.principal.mapping.rules` gives;
//! any other is `User:ANONYMOUS`. Every key may be set per listener as
//! `listener.name.<listener>.<key>`, as in Kafka.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

use crate::config::{BrokerConfig, ListenerConfig, SecurityProtocol};
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
    pub tls: Option<TlsAcceptor>,
    /// The SASL mechanisms and PLAIN users, for `SASL_PLAINTEXT` and `SASL_SSL`.
    pub sasl: Option<Arc<SaslConfig>>,
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
            Some(TlsAcceptor::from(Arc::new(tls_server_config(
                config,
                &listener.name,
            )?)))
        } else {
            None
        };
        let sasl = if listener.protocol.uses_sasl() {
            Some(Arc::new(SaslConfig::from_config(config, &listener.name)?))
        } else {
            None
        };
        Ok(Self {
            name: listener.name.clone(),
            protocol: listener.protocol,
            tls,
            sasl,
        })
    }

    /// A plaintext listener, for tests.
    pub fn plaintext(name: &str) -> Self {
        Self {
            name: name.to_string(),
            protocol: SecurityProtocol::Plaintext,
            tls: None,
            sasl: None,
        }
    }
}

fn config_error(key: &str, listener: &str, what: impl std::fmt::Display) -> BrokerError {
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
    let (certs, key) = match (
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
        (None, None) => {
            return Err(config_error(
                "ssl.keystore.location",
                listener,
                "a TLS listener needs a certificate and key: ssl.keystore.location (PEM), \
                 or ssl.certificate.location and ssl.key.location",
            ))
        }
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
        let mut roots = RootCertStore::empty();
        for cert in read_certs("ssl.truststore.location", listener, path)? {
            roots
                .add(cert)
                .map_err(|e| config_error("ssl.truststore.location", listener, e))?;
        }
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

/// `ssl.enabled.protocols` (Kafka's `TLSv1.2,TLSv1.3`, the default).
fn protocol_versions(
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

fn read_certs(
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

/// The principal of a TLS client by its certificate: `User:` and the subject in RFC 2253
/// form (most specific attribute first, as Java's `X500Principal.getName()` prints it);
/// `None` when the certificate cannot be parsed.
pub fn principal_of_certificate(der: &[u8]) -> Option<String> {
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
    Some(format!("User:{}", rdns.join(",")))
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
        assert_eq!(
            principal_of_certificate(cert.der()).as_deref(),
            Some("User:CN=alice,O=Example\\, Inc")
        );
        assert_eq!(principal_of_certificate(b"not a certificate"), None);
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
