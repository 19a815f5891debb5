//! TLS and SASL on the client's connections, under librdkafka's and Kafka's config names:
//! `security.protocol` (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), `ssl.ca.location`
//! (PEM CAs to trust; the system's roots are not read), `ssl.certificate.location` and
//! `ssl.key.location` (a client certificate, for mTLS), `ssl.endpoint.identification.algorithm`
//! (`https`, the default, checks the broker's certificate names its host; empty or `none`
//! checks only the chain), and `sasl.mechanism` (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) with
//! `sasl.username` and `sasl.password`, or OAUTHBEARER with a token from the file
//! `sasl.oauthbearer.token.endpoint.url` names (`file:///path`, as KIP-768's file
//! option; read again for every connection, so a token renewed in the file is used by
//! the next one). Token endpoints over HTTP (client credentials) are not spoken.
//!
//! The SASL exchange runs on a new connection after ApiVersions, over SaslHandshake v1
//! and SaslAuthenticate, before any other request. Sessions that the broker ends
//! (KIP-368) are not renewed: the broker closes the connection at its end and the client
//! opens a new one, as for any closed connection.

use std::sync::Arc;

use base64::Engine;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::error::{Error, Result};

/// `security.protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SecurityProtocol {
    #[default]
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    fn parse(s: &str) -> Result<Self> {
        match s.trim().to_ascii_uppercase().as_str() {
            "PLAINTEXT" => Ok(Self::Plaintext),
            "SSL" => Ok(Self::Ssl),
            "SASL_PLAINTEXT" => Ok(Self::SaslPlaintext),
            "SASL_SSL" => Ok(Self::SaslSsl),
            other => Err(Error::InvalidConfig(format!(
                "security.protocol {other:?} is not one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"
            ))),
        }
    }

    pub fn tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }

    pub fn sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }
}

/// The security settings of a client (see the module docs).
#[derive(Clone, Default)]
pub struct Security {
    pub protocol: SecurityProtocol,
    pub ssl_ca_location: Option<String>,
    pub ssl_certificate_location: Option<String>,
    pub ssl_key_location: Option<String>,
    /// Whether the broker's certificate must name the host dialled.
    pub verify_hostname: bool,
    pub sasl_mechanism: String,
    pub sasl_username: Option<String>,
    pub sasl_password: Option<String>,
    /// OAUTHBEARER: the file holding the token (from a `file:` URL).
    pub sasl_oauthbearer_token_file: Option<String>,
    /// SCRAM with a delegation token (KIP-48): the user name is the token's id, the
    /// password its HMAC in base64, and client-first carries `tokenauth=true`. Set by
    /// `tokenauth="true"` in `sasl.jaas.config`, as Kafka's `ScramLoginModule` takes it.
    pub sasl_token_auth: bool,
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Security")
            .field("protocol", &self.protocol)
            .field("ssl_ca_location", &self.ssl_ca_location)
            .field("ssl_certificate_location", &self.ssl_certificate_location)
            .field("ssl_key_location", &self.ssl_key_location)
            .field("verify_hostname", &self.verify_hostname)
            .field("sasl_mechanism", &self.sasl_mechanism)
            .field("sasl_username", &self.sasl_username)
            .field(
                "sasl_password",
                &self.sasl_password.as_ref().map(|_| "(redacted)"),
            )
            .field(
                "sasl_oauthbearer_token_file",
                &self.sasl_oauthbearer_token_file,
            )
            .field("sasl_token_auth", &self.sasl_token_auth)
            .finish()
    }
}

impl Security {
    pub(crate) fn new() -> Self {
        Self {
            verify_hostname: true,
            sasl_mechanism: "PLAIN".into(),
            ..Default::default()
        }
    }

    /// Sets one of the keys the module docs name; `Ok(false)` for a key that is not one.
    pub fn set(&mut self, key: &str, value: &str) -> Result<bool> {
        let value = value.trim();
        let some = || (!value.is_empty()).then(|| value.to_string());
        match key {
            "security.protocol" => self.protocol = SecurityProtocol::parse(value)?,
            "ssl.ca.location" | "ssl.truststore.location" => self.ssl_ca_location = some(),
            "ssl.certificate.location" => self.ssl_certificate_location = some(),
            "ssl.key.location" => self.ssl_key_location = some(),
            "ssl.endpoint.identification.algorithm" => {
                self.verify_hostname = match value.to_ascii_lowercase().as_str() {
                    "https" => true,
                    "" | "none" => false,
                    other => {
                        return Err(Error::InvalidConfig(format!(
                            "ssl.endpoint.identification.algorithm {other:?} is not https or none"
                        )))
                    }
                }
            }
            "sasl.mechanism" | "sasl.mechanisms" => {
                let m = value.to_ascii_uppercase();
                if !["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"].contains(&m.as_str())
                {
                    return Err(Error::InvalidConfig(format!(
                        "sasl.mechanism {m:?} is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, \
                         OAUTHBEARER"
                    )));
                }
                self.sasl_mechanism = m;
            }
            "sasl.username" => self.sasl_username = some(),
            "sasl.password" => self.sasl_password = Some(value.to_string()),
            "sasl.jaas.config" => {
                let options = jaas_options(value)?;
                for (k, v) in options {
                    match k.as_str() {
                        "username" => self.sasl_username = Some(v),
                        "password" => self.sasl_password = Some(v),
                        "tokenauth" => self.sasl_token_auth = v.eq_ignore_ascii_case("true"),
                        // Other login module options mean nothing to this client.
                        _ => {}
                    }
                }
            }
            "sasl.oauthbearer.token.endpoint.url" => {
                let path = value
                    .strip_prefix("file://")
                    .or_else(|| value.strip_prefix("file:"))
                    .filter(|p| !p.is_empty())
                    .ok_or_else(|| {
                        Error::InvalidConfig(format!(
                            "sasl.oauthbearer.token.endpoint.url {value:?}: only a file: URL \
                             holding the token is supported"
                        ))
                    })?;
                self.sasl_oauthbearer_token_file = Some(path.to_string());
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The TLS client config these settings give, when the protocol is TLS.
    pub(crate) fn tls_config(&self) -> Result<Option<Arc<rustls::ClientConfig>>> {
        if !self.protocol.tls() {
            return Ok(None);
        }
        let err = |what: &str, path: &str, e: &dyn std::fmt::Display| {
            Error::InvalidConfig(format!("{what} {path}: {e}"))
        };
        let mut roots = rustls::RootCertStore::empty();
        let ca = self.ssl_ca_location.as_deref().ok_or_else(|| {
            Error::InvalidConfig("a TLS connection needs ssl.ca.location (PEM CAs to trust)".into())
        })?;
        for cert in CertificateDer::pem_file_iter(ca).map_err(|e| err("ssl.ca.location", ca, &e))? {
            let cert = cert.map_err(|e| err("ssl.ca.location", ca, &e))?;
            roots
                .add(cert)
                .map_err(|e| err("ssl.ca.location", ca, &e))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::InvalidConfig(format!("TLS: {e}")))?;
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| Error::InvalidConfig(format!("ssl.ca.location {ca}: {e}")))?;
        let builder: rustls::ConfigBuilder<rustls::ClientConfig, rustls::client::WantsClientCert> =
            if self.verify_hostname {
                builder.with_webpki_verifier(verifier)
            } else {
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(ChainOnly(verifier)))
            };
        let config =
            match (&self.ssl_certificate_location, &self.ssl_key_location) {
                (Some(cert), Some(key)) => {
                    let chain = CertificateDer::pem_file_iter(cert)
                        .map_err(|e| err("ssl.certificate.location", cert, &e))?
                        .collect::<std::result::Result<Vec<_>, _>>()
                        .map_err(|e| err("ssl.certificate.location", cert, &e))?;
                    let key = PrivateKeyDer::from_pem_file(key)
                        .map_err(|e| err("ssl.key.location", key, &e))?;
                    builder
                        .with_client_auth_cert(chain, key)
                        .map_err(|e| Error::InvalidConfig(format!("client certificate: {e}")))?
                }
                (None, None) => builder.with_no_client_auth(),
                _ => return Err(Error::InvalidConfig(
                    "a client certificate needs both ssl.certificate.location and ssl.key.location"
                        .into(),
                )),
            };
        Ok(Some(Arc::new(config)))
    }
}

/// The name a broker's certificate is checked against: the host of `host:port`.
pub(crate) fn server_name(addr: &str) -> Result<ServerName<'static>> {
    let host = addr
        .rsplit_once(':')
        .map_or(addr, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']');
    ServerName::try_from(host.to_string())
        .map_err(|e| Error::InvalidConfig(format!("{host} is no TLS server name: {e}")))
}

/// Checks the broker's chain against the CAs but not its names
/// (`ssl.endpoint.identification.algorithm=none`, as Kafka allows).
#[derive(Debug)]
struct ChainOnly(Arc<rustls::client::WebPkiServerVerifier>);

impl rustls::client::danger::ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> std::result::Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(rustls::client::danger::ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The options of a JAAS line as Kafka's clients take it in `sasl.jaas.config`:
/// `<LoginModule class> <flag> key="value" key2=value2 ... ;`. A quoted value may hold
/// spaces and `\"`; one JAAS entry only.
fn jaas_options(line: &str) -> Result<Vec<(String, String)>> {
    let bad = |why: &str| Error::InvalidConfig(format!("sasl.jaas.config: {why}"));
    let line = line.trim();
    let line = line
        .strip_suffix(';')
        .ok_or_else(|| bad("must end with ';'"))?;
    let mut rest = line.trim_start();
    // The login module's class name, then its control flag.
    for _ in 0..2 {
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        if end == 0 {
            return Err(bad("needs a login module and a control flag"));
        }
        rest = rest[end..].trim_start();
    }
    let mut options = Vec::new();
    while !rest.is_empty() {
        let eq = rest.find('=').ok_or_else(|| bad("an option without '='"))?;
        let key = rest[..eq].trim().to_string();
        if key.is_empty() || key.contains(char::is_whitespace) {
            return Err(bad("an option without a name"));
        }
        rest = &rest[eq + 1..];
        let value;
        if let Some(quoted) = rest.strip_prefix('"') {
            let mut v = String::new();
            let mut chars = quoted.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, next)) = chars.next() {
                            v.push(next);
                        }
                    }
                    '"' => {
                        end = Some(i);
                        break;
                    }
                    c => v.push(c),
                }
            }
            let end = end.ok_or_else(|| bad("an unterminated quoted value"))?;
            value = v;
            rest = quoted[end + 1..].trim_start();
        } else {
            let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
            value = rest[..end].to_string();
            rest = rest[end..].trim_start();
        }
        options.push((key, value));
    }
    Ok(options)
}

/// The client's side of a SASL exchange: the tokens to send, one at a time.
pub(crate) enum SaslClient {
    Plain {
        token: Option<Vec<u8>>,
    },
    Scram(Box<ScramClient>),
    /// RFC 7628: the token in a GS2 header; a server that refuses it answers with an
    /// error challenge, which takes a lone %x01 before the broker's final refusal.
    OAuthBearer {
        token: Option<Vec<u8>>,
        refused: bool,
    },
}

impl SaslClient {
    pub(crate) fn new(security: &Security) -> Result<Self> {
        if security.sasl_mechanism == "OAUTHBEARER" {
            let path = security
                .sasl_oauthbearer_token_file
                .as_deref()
                .ok_or_else(|| {
                    Error::InvalidConfig(
                        "OAUTHBEARER needs sasl.oauthbearer.token.endpoint.url (file:///path)"
                            .into(),
                    )
                })?;
            let token = std::fs::read_to_string(path).map_err(|e| {
                Error::InvalidConfig(format!("sasl.oauthbearer.token.endpoint.url {path}: {e}"))
            })?;
            let token = token.trim();
            if token.is_empty() || token.contains(['\x01', ' ', '\n']) {
                return Err(Error::InvalidConfig(format!(
                    "sasl.oauthbearer.token.endpoint.url {path}: holds no token"
                )));
            }
            return Ok(Self::OAuthBearer {
                token: Some(format!("n,,\x01auth=Bearer {token}\x01\x01").into_bytes()),
                refused: false,
            });
        }
        let user = security
            .sasl_username
            .clone()
            .ok_or_else(|| Error::InvalidConfig("SASL needs sasl.username".into()))?;
        let password = security
            .sasl_password
            .clone()
            .ok_or_else(|| Error::InvalidConfig("SASL needs sasl.password".into()))?;
        Ok(match security.sasl_mechanism.as_str() {
            "PLAIN" => Self::Plain {
                token: Some(format!("\0{user}\0{password}").into_bytes()),
            },
            "SCRAM-SHA-256" => Self::Scram(Box::new(ScramClient::new(
                Hash::Sha256,
                user,
                password,
                security.sasl_token_auth,
            )?)),
            _ => Self::Scram(Box::new(ScramClient::new(
                Hash::Sha512,
                user,
                password,
                security.sasl_token_auth,
            )?)),
        })
    }

    /// The next token to send, given the server's last one (empty at the start); `None`
    /// once the exchange is complete and the server's last token checked out.
    pub(crate) fn step(&mut self, server: &[u8]) -> Result<Option<Vec<u8>>> {
        match self {
            Self::Plain { token } => Ok(token.take()),
            Self::Scram(s) => s.step(server),
            Self::OAuthBearer { token, refused } => {
                if let Some(first) = token.take() {
                    return Ok(Some(first));
                }
                if server.is_empty() || *refused {
                    return Ok(None);
                }
                // The server's error (a JSON status); the exchange must end with %x01.
                *refused = true;
                Ok(Some(vec![0x01]))
            }
        }
    }
}

#[derive(Clone, Copy)]
pub(crate) enum Hash {
    Sha256,
    Sha512,
}

impl Hash {
    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        use hmac::{Mac, SimpleHmac};
        match self {
            Hash::Sha256 => {
                let mut m = <SimpleHmac<sha2::Sha256> as Mac>::new_from_slice(key)
                    .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
                m.update(data);
                m.finalize().into_bytes().to_vec()
            }
            Hash::Sha512 => {
                let mut m = <SimpleHmac<sha2::Sha512> as Mac>::new_from_slice(key)
                    .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
                m.update(data);
                m.finalize().into_bytes().to_vec()
            }
        }
    }

    fn digest(self, data: &[u8]) -> Vec<u8> {
        use sha2::Digest;
        match self {
            Hash::Sha256 => sha2::Sha256::digest(data).to_vec(),
            Hash::Sha512 => sha2::Sha512::digest(data).to_vec(),
        }
    }

    fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        use hmac::SimpleHmac;
        match self {
            Hash::Sha256 => {
                let mut out = [0u8; 32];
                let _ = pbkdf2::pbkdf2::<SimpleHmac<sha2::Sha256>>(
                    password, salt, iterations, &mut out,
                );
                out.to_vec()
            }
            Hash::Sha512 => {
                let mut out = [0u8; 64];
                let _ = pbkdf2::pbkdf2::<SimpleHmac<sha2::Sha512>>(
                    password, salt, iterations, &mut out,
                );
                out.to_vec()
            }
        }
    }
}

/// RFC 5802's client: client-first, then client-final with the proof, then the server's
/// signature checked.
pub(crate) struct ScramClient {
    hash: Hash,
    user: String,
    password: String,
    /// Send Kafka's `tokenauth=true` extension: the user is a delegation token's id.
    token_auth: bool,
    nonce: String,
    state: ScramState,
}

enum ScramState {
    Start,
    SentFirst { first_bare: String },
    SentFinal { server_signature: Vec<u8> },
    Done,
}

/// Kafka caps SCRAM iterations at 16384; a server asking for more is refused rather than
/// let it make the client spin.
const MAX_ITERATIONS: u32 = 16_384;

impl ScramClient {
    fn new(hash: Hash, user: String, password: String, token_auth: bool) -> Result<Self> {
        let mut raw = [0u8; 24];
        getrandom::fill(&mut raw).map_err(|e| Error::InvalidConfig(format!("SCRAM nonce: {e}")))?;
        Ok(Self {
            hash,
            user,
            password,
            token_auth,
            nonce: base64::engine::general_purpose::STANDARD_NO_PAD.encode(raw),
            state: ScramState::Start,
        })
    }

    fn step(&mut self, server: &[u8]) -> Result<Option<Vec<u8>>> {
        let b64 = &base64::engine::general_purpose::STANDARD;
        let refused = |m: &str| Error::Authentication(format!("SCRAM: {m}"));
        match std::mem::replace(&mut self.state, ScramState::Done) {
            ScramState::Start => {
                let name = self.user.replace('=', "=3D").replace(',', "=2C");
                let extension = if self.token_auth {
                    ",tokenauth=true"
                } else {
                    ""
                };
                let first_bare = format!("n={name},r={}{extension}", self.nonce);
                let token = format!("n,,{first_bare}").into_bytes();
                self.state = ScramState::SentFirst { first_bare };
                Ok(Some(token))
            }
            ScramState::SentFirst { first_bare } => {
                let server_first = std::str::from_utf8(server)
                    .map_err(|_| refused("server-first is not UTF-8"))?;
                let field = |k: &str| {
                    server_first
                        .split(',')
                        .find_map(|p| p.strip_prefix(k).and_then(|v| v.strip_prefix('=')))
                };
                let nonce = field("r").ok_or_else(|| refused("server-first has no nonce"))?;
                if !nonce.starts_with(&self.nonce) || nonce.len() <= self.nonce.len() {
                    return Err(refused("the server's nonce does not extend ours"));
                }
                let salt = field("s")
                    .and_then(|s| b64.decode(s).ok())
                    .ok_or_else(|| refused("server-first has no salt"))?;
                let iterations: u32 = field("i")
                    .and_then(|i| i.parse().ok())
                    .filter(|i| (1..=MAX_ITERATIONS).contains(i))
                    .ok_or_else(|| refused("server-first has no usable iteration count"))?;
                let h = self.hash;
                let salted = h.salted_password(self.password.as_bytes(), &salt, iterations);
                let client_key = h.hmac(&salted, b"Client Key");
                let stored_key = h.digest(&client_key);
                let without_proof = format!("c=biws,r={nonce}");
                let auth_message = format!("{first_bare},{server_first},{without_proof}");
                let signature = h.hmac(&stored_key, auth_message.as_bytes());
                let proof: Vec<u8> = client_key
                    .iter()
                    .zip(&signature)
                    .map(|(a, b)| a ^ b)
                    .collect();
                let server_key = h.hmac(&salted, b"Server Key");
                self.state = ScramState::SentFinal {
                    server_signature: h.hmac(&server_key, auth_message.as_bytes()),
                };
                Ok(Some(
                    format!("{without_proof},p={}", b64.encode(proof)).into_bytes(),
                ))
            }
            ScramState::SentFinal { server_signature } => {
                let text = std::str::from_utf8(server)
                    .map_err(|_| refused("server-final is not UTF-8"))?;
                if let Some(e) = text.strip_prefix("e=") {
                    return Err(refused(e));
                }
                let v = text
                    .strip_prefix("v=")
                    .and_then(|v| b64.decode(v.split(',').next().unwrap_or_default()).ok())
                    .ok_or_else(|| refused("server-final has no signature"))?;
                if v != server_signature {
                    return Err(refused(
                        "the server's signature is wrong: it does not know the password",
                    ));
                }
                Ok(None)
            }
            ScramState::Done => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677's SCRAM-SHA-256 example, with its nonce.
    #[test]
    fn scram_sha_256_matches_rfc_7677() {
        let mut c = ScramClient::new(Hash::Sha256, "user".into(), "pencil".into(), false).unwrap();
        c.nonce = "rOprNGfwEbeRWgbNEkqO".into();
        let first = c.step(b"").unwrap().unwrap();
        assert_eq!(first, b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let server_first =
            b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let last = c.step(server_first).unwrap().unwrap();
        assert_eq!(
            std::str::from_utf8(&last).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
             p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        assert_eq!(
            c.step(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
                .unwrap(),
            None
        );
    }

    #[test]
    fn a_server_that_does_not_know_the_password_is_refused() {
        let mut c = ScramClient::new(Hash::Sha256, "user".into(), "pencil".into(), false).unwrap();
        c.nonce = "rOprNGfwEbeRWgbNEkqO".into();
        c.step(b"").unwrap();
        c.step(b"r=rOprNGfwEbeRWgbNEkqOxyz,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
            .unwrap();
        assert!(c.step(b"v=AAAA").is_err());
        let mut c = ScramClient::new(Hash::Sha512, "user".into(), "pencil".into(), false).unwrap();
        c.step(b"").unwrap();
        // A nonce that is not ours extended, and an iteration count past Kafka's cap.
        assert!(c.step(b"r=other,s=AAAA,i=4096").is_err());
        let mut c = ScramClient::new(Hash::Sha512, "user".into(), "pencil".into(), false).unwrap();
        let nonce = c.nonce.clone();
        c.step(b"").unwrap();
        assert!(c
            .step(format!("r={nonce}x,s=AAAA,i=99999999").as_bytes())
            .is_err());
    }

    /// Kafka's JAAS line sets the login, and `tokenauth` makes the first message carry
    /// the delegation token extension.
    #[test]
    fn a_jaas_line_with_tokenauth_logs_in_with_a_delegation_token() {
        let mut s = Security::new();
        assert!(s.set("sasl.mechanism", "SCRAM-SHA-256").unwrap());
        assert!(s
            .set(
                "sasl.jaas.config",
                r#"org.apache.kafka.common.security.scram.ScramLoginModule required username="tok-Id_1" password="a b\"c" tokenauth=true;"#
            )
            .unwrap());
        assert_eq!(s.sasl_username.as_deref(), Some("tok-Id_1"));
        assert_eq!(s.sasl_password.as_deref(), Some("a b\"c"));
        assert!(s.sasl_token_auth);
        let mut c = SaslClient::new(&s).unwrap();
        let first = String::from_utf8(c.step(b"").unwrap().unwrap()).unwrap();
        assert!(first.starts_with("n,,n=tok-Id_1,r="), "{first}");
        assert!(first.ends_with(",tokenauth=true"), "{first}");
        let mut s = Security::new();
        s.set(
            "sasl.jaas.config",
            r#"org.apache.kafka.common.security.plain.PlainLoginModule required username="alice" password="x";"#,
        )
        .unwrap();
        assert!(!s.sasl_token_auth);
        assert_eq!(s.sasl_username.as_deref(), Some("alice"));
        for bad in [
            "ScramLoginModule required username=\"x\"",
            "ScramLoginModule;",
            "ScramLoginModule required username=\"x;",
            "ScramLoginModule required =x;",
        ] {
            assert!(
                Security::new().set("sasl.jaas.config", bad).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn settings_take_librdkafkas_names() {
        let mut s = Security::new();
        assert!(s.set("security.protocol", "sasl_ssl").unwrap());
        assert!(s.set("sasl.mechanism", "SCRAM-SHA-512").unwrap());
        assert!(s.set("ssl.endpoint.identification.algorithm", "").unwrap());
        assert!(!s.set("linger.ms", "5").unwrap());
        assert_eq!(s.protocol, SecurityProtocol::SaslSsl);
        assert!(!s.verify_hostname);
        assert!(s.set("security.protocol", "kerberos").is_err());
        assert!(s.set("sasl.mechanism", "GSSAPI").is_err());
        assert!(s.tls_config().is_err(), "TLS without a CA file");
    }

    #[test]
    fn oauthbearer_sends_the_token_files_jwt_and_ends_a_refusal_with_0x01() {
        let dir = std::env::temp_dir().join(format!("rill-oauth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "eyJ.abc.def\n").unwrap();
        let mut s = Security::new();
        assert!(s.set("sasl.mechanism", "oauthbearer").unwrap());
        assert!(s
            .set(
                "sasl.oauthbearer.token.endpoint.url",
                "https://idp.example/token"
            )
            .is_err());
        assert!(s
            .set(
                "sasl.oauthbearer.token.endpoint.url",
                &format!("file://{}", file.display())
            )
            .unwrap());
        let mut c = SaslClient::new(&s).unwrap();
        assert_eq!(
            c.step(b"").unwrap().unwrap(),
            b"n,,\x01auth=Bearer eyJ.abc.def\x01\x01"
        );
        // Accepted: the server's final message is empty.
        assert_eq!(c.step(b"").unwrap(), None);
        let mut c = SaslClient::new(&s).unwrap();
        c.step(b"").unwrap();
        assert_eq!(
            c.step(br#"{"status":"invalid_token"}"#).unwrap().unwrap(),
            vec![0x01]
        );
        std::fs::write(&file, "").unwrap();
        assert!(SaslClient::new(&s).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
