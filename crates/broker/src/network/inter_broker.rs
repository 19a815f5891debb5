//! The client side of the inter-broker listener (Kafka's `ChannelBuilders.clientChannelBuilder`
//! for `inter.broker.listener.name`): how this broker dials another for the replica
//! fetchers and the transaction marker sender, over whatever the listener speaks.
//!
//! # Protocol
//! 1. The listener is `inter.broker.listener.name` (or the one named after
//!    `security.inter.broker.protocol`); its protocol comes from
//!    `listener.security.protocol.map`, as on the server side.
//! 2. TCP to the peer's endpoint on that listener, `TCP_NODELAY`.
//! 3. `SSL` and `SASL_SSL`: a TLS handshake (rustls, ring) trusting the CAs of the
//!    listener's `ssl.truststore.location` (PEM), presenting the listener's own key and
//!    chain (`ssl.keystore.location`, or `ssl.certificate.location` with
//!    `ssl.key.location`) as the client certificate, so that an mTLS listener accepts
//!    brokers as it accepts clients. `ssl.endpoint.identification.algorithm=https` (Kafka's
//!    default) checks the certificate against the peer's advertised host; an empty value
//!    skips the host check but still verifies the chain.
//! 4. `SASL_PLAINTEXT` and `SASL_SSL`: SaslHandshake v1 with
//!    `sasl.mechanism.inter.broker.protocol` (PLAIN unless set: Kafka's default is GSSAPI,
//!    which Rill does not speak), then SaslAuthenticate v2 tokens. The username and
//!    password are the `username="…" password="…"` options of the listener's JAAS config
//!    for the mechanism, `listener.name.<listener>.<mechanism>.sasl.jaas.config` (the
//!    mechanism in lower case, as Kafka spells it), else `<mechanism>.sasl.jaas.config`,
//!    else `sasl.jaas.config`. SCRAM checks the server's signature too, so a peer that
//!    does not hold the credential is not believed.
//! 5. The stream ([`InterBrokerStream`]) then carries ordinary requests.
//!
//! Every failure is an `io::Error` for the caller to back off and retry (a refused
//! authentication is `PermissionDenied`); nothing here panics on what a peer sends.
//! Settings are read once, at start-up, where a bad one refuses the start with its key
//! named; the TLS client settings are not reloaded (only the listeners' server side is).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rill_protocol::frame::decode_frame;
use rill_protocol::generated::{
    RequestHeader, ResponseHeader, SaslAuthenticateRequest, SaslHandshakeRequest,
};
use rill_protocol::{encode_request_frame, ApiKey, Decodable, ErrorCode, Request};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::config::{BrokerConfig, SecurityProtocol};
use crate::error::BrokerError;
use crate::network::scram::{ScramClient, ScramMechanism};
use crate::network::security::{config_error, protocol_versions, read_keystore, read_truststore};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The TLS handshake and the SASL exchange together (SCRAM's PBKDF2 is the slow part).
const AUTHENTICATION_TIMEOUT: Duration = Duration::from_secs(15);
/// SASL responses are small; anything bigger is not a SASL response.
const MAX_SASL_RESPONSE_BYTES: usize = 64 * 1024;
const SASL_HANDSHAKE_VERSION: i16 = 1;
const SASL_AUTHENTICATE_VERSION: i16 = 2;

/// A broker's endpoint on the inter-broker listener: the advertised host (what the TLS
/// host check compares the certificate with) and the address it resolved to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerEndpoint {
    pub host: String,
    pub addr: SocketAddr,
}

impl PeerEndpoint {
    /// An advertised endpoint, resolved now (`None`: the name does not resolve or the
    /// port is out of range; the next metadata update tries again).
    pub fn resolve(host: String, port: i32) -> Option<Self> {
        use std::net::ToSocketAddrs;
        let addr = (host.as_str(), u16::try_from(port).ok()?)
            .to_socket_addrs()
            .ok()?
            .next()?;
        Some(Self { host, addr })
    }

    /// An endpoint known by its address only (the host is the IP).
    pub fn of_addr(addr: SocketAddr) -> Self {
        Self {
            host: addr.ip().to_string(),
            addr,
        }
    }
}

impl std::fmt::Display for PeerEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host == self.addr.ip().to_string() {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{} ({})", self.host, self.addr)
        }
    }
}

/// A connection to another broker, in plaintext or TLS.
pub enum InterBrokerStream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for InterBrokerStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            InterBrokerStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            InterBrokerStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for InterBrokerStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            InterBrokerStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            InterBrokerStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            InterBrokerStream::Plain(s) => Pin::new(s).poll_flush(cx),
            InterBrokerStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            InterBrokerStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            InterBrokerStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// `sasl.mechanism.inter.broker.protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mechanism {
    Plain,
    Scram(ScramMechanism),
}

impl Mechanism {
    fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::Scram(m) => m.name(),
        }
    }
}

/// The SASL identity this broker logs in with.
struct SaslLogin {
    mechanism: Mechanism,
    username: String,
    password: String,
}

impl std::fmt::Debug for SaslLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaslLogin")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// How this broker dials the others (see the module docs). Built once from the config
/// and shared by every fetcher and the marker sender.
pub struct InterBrokerConnector {
    listener: String,
    protocol: SecurityProtocol,
    tls: Option<TlsConnector>,
    sasl: Option<SaslLogin>,
}

impl std::fmt::Debug for InterBrokerConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InterBrokerConnector")
            .field("listener", &self.listener)
            .field("protocol", &self.protocol)
            .field("sasl", &self.sasl)
            .finish_non_exhaustive()
    }
}

/// Plaintext dialing, for tests.
impl Default for InterBrokerConnector {
    fn default() -> Self {
        Self {
            listener: "PLAINTEXT".into(),
            protocol: SecurityProtocol::Plaintext,
            tls: None,
            sasl: None,
        }
    }
}

impl InterBrokerConnector {
    /// Reads the inter-broker listener's client settings; a missing or unreadable file,
    /// a bad value, refuses the start with the key named.
    pub fn from_config(config: &BrokerConfig) -> Result<Self, BrokerError> {
        let listener = config.inter_broker_listener_name()?;
        let protocol = config
            .client_listeners()?
            .into_iter()
            .find(|l| l.name == listener)
            .map(|l| l.protocol)
            .ok_or_else(|| {
                BrokerError::Config(format!(
                    "inter.broker.listener.name: {listener} is not one of the listeners"
                ))
            })?;
        Self::for_listener(
            config,
            listener,
            protocol,
            "sasl.mechanism.inter.broker.protocol",
        )
    }

    /// The controller listener's client settings, for the quorum's dials
    /// (`controller.listener.names`, `sasl.mechanism.controller.protocol`); see
    /// `controller_channel.rs`.
    pub fn for_controller(config: &BrokerConfig) -> Result<Self, BrokerError> {
        let listener = config.controller_listener()?;
        Self::for_listener(
            config,
            listener.name,
            listener.protocol,
            "sasl.mechanism.controller.protocol",
        )
    }

    /// Dialing `listener`, which speaks `protocol`; `mechanism_key` names the SASL
    /// mechanism this side logs in with.
    fn for_listener(
        config: &BrokerConfig,
        listener: String,
        protocol: SecurityProtocol,
        mechanism_key: &str,
    ) -> Result<Self, BrokerError> {
        let tls = if protocol.uses_tls() {
            Some(TlsConnector::from(Arc::new(tls_client_config(
                config, &listener,
            )?)))
        } else {
            None
        };
        let sasl = if protocol.uses_sasl() {
            Some(sasl_login(config, &listener, mechanism_key)?)
        } else {
            None
        };
        Ok(Self {
            listener,
            protocol,
            tls,
            sasl,
        })
    }

    /// The inter-broker listener's name.
    pub fn listener(&self) -> &str {
        &self.listener
    }

    pub fn protocol(&self) -> SecurityProtocol {
        self.protocol
    }

    /// One request and its response on a connection of its own to `peer`, all within
    /// `timeout` (the dial and authentication are bounded by their own timeouts too).
    pub async fn call<R: Request>(
        &self,
        peer: &PeerEndpoint,
        client_id: &str,
        request: &R,
        version: i16,
        (timeout, max_response_bytes): (Duration, usize),
    ) -> std::io::Result<R::Response> {
        let mut stream = self.connect(peer, client_id).await?;
        let mut buf = BytesMut::with_capacity(4096);
        let id = (client_id, 1);
        tokio::time::timeout(
            timeout,
            exchange(
                &mut stream,
                &mut buf,
                id,
                request,
                version,
                max_response_bytes,
            ),
        )
        .await
        .map_err(|_| timed_out("request timed out"))?
    }

    /// Dials `peer` and passes what its listener demands; `client_id` names this side in
    /// the SASL requests (and in the peer's logs).
    pub async fn connect(
        &self,
        peer: &PeerEndpoint,
        client_id: &str,
    ) -> std::io::Result<InterBrokerStream> {
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(peer.addr))
            .await
            .map_err(|_| timed_out("connect timed out"))??;
        tcp.set_nodelay(true)?;
        let secure = async {
            let mut stream = match &self.tls {
                None => InterBrokerStream::Plain(tcp),
                Some(connector) => {
                    let name = ServerName::try_from(peer.host.clone()).map_err(|e| {
                        std::io::Error::new(
                            std::io::ErrorKind::InvalidInput,
                            format!("{}: not a host name for TLS: {e}", peer.host),
                        )
                    })?;
                    let tls = connector.connect(name, tcp).await.map_err(|e| {
                        std::io::Error::new(
                            e.kind(),
                            format!(
                                "TLS handshake with {peer} on listener {} failed: {e}",
                                self.listener
                            ),
                        )
                    })?;
                    InterBrokerStream::Tls(Box::new(tls))
                }
            };
            if let Some(login) = &self.sasl {
                authenticate(&mut stream, login, client_id)
                    .await
                    .map_err(|e| {
                        std::io::Error::new(
                            e.kind(),
                            format!(
                                "SASL {} authentication as {:?} with {peer} on listener {} \
                                 failed: {e}",
                                login.mechanism.name(),
                                login.username,
                                self.listener
                            ),
                        )
                    })?;
            }
            Ok::<_, std::io::Error>(stream)
        };
        tokio::time::timeout(AUTHENTICATION_TIMEOUT, secure)
            .await
            .map_err(|_| timed_out("TLS handshake or SASL authentication timed out"))?
    }
}

fn timed_out(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, what.to_string())
}

fn refused(what: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::PermissionDenied, what)
}

fn invalid(what: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what)
}

/// The rustls client configuration of the inter-broker listener (module docs, step 3).
fn tls_client_config(config: &BrokerConfig, listener: &str) -> Result<ClientConfig, BrokerError> {
    let get = |key: &str| {
        config
            .listener_value(listener, key)
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    // Kafka would fall back to the JVM's CAs; Rill has no system store, and brokers'
    // certificates are usually signed by a private CA anyway.
    let path = get("ssl.truststore.location").ok_or_else(|| {
        config_error(
            "ssl.truststore.location",
            listener,
            "the inter-broker listener uses TLS: name the PEM file of the CAs that sign \
             the brokers' certificates",
        )
    })?;
    let roots = read_truststore(listener, path)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| config_error("ssl.truststore.location", listener, e))?;
    let algorithm = config
        .listener_value(listener, "ssl.endpoint.identification.algorithm")
        .unwrap_or("https")
        .trim();
    let verifier: Arc<dyn ServerCertVerifier> = if algorithm.is_empty() {
        Arc::new(ChainOnlyVerifier(webpki))
    } else if algorithm.eq_ignore_ascii_case("https") {
        webpki
    } else {
        return Err(config_error(
            "ssl.endpoint.identification.algorithm",
            listener,
            format!("invalid value {algorithm:?}: must be https or empty"),
        ));
    };
    let versions = protocol_versions(get("ssl.enabled.protocols"), listener)?;
    let builder = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions)
        .map_err(|e| config_error("ssl.enabled.protocols", listener, e))?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    match read_keystore(config, listener)? {
        Some((certs, key)) => builder
            .with_client_auth_cert(certs, key)
            .map_err(|e| config_error("ssl.keystore.location", listener, e)),
        None => Ok(builder.with_no_client_auth()),
    }
}

/// `ssl.endpoint.identification.algorithm=` (empty): the chain must verify against the
/// truststore, whatever host the certificate names. webpki checks the name last, after
/// the chain, so a name mismatch is the only error that is let through.
#[derive(Debug)]
struct ChainOnlyVerifier(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnlyVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `sasl.mechanism.inter.broker.protocol` (or the controller's `mechanism_key`) and its
/// JAAS login (module docs, step 4).
fn sasl_login(
    config: &BrokerConfig,
    listener: &str,
    mechanism_key: &str,
) -> Result<SaslLogin, BrokerError> {
    let raw = config
        .get(mechanism_key)
        .unwrap_or("PLAIN")
        .trim()
        .to_ascii_uppercase();
    let mechanism = if raw == "PLAIN" {
        Mechanism::Plain
    } else if let Some(m) = ScramMechanism::from_name(&raw) {
        Mechanism::Scram(m)
    } else {
        return Err(BrokerError::Config(format!(
            "{mechanism_key}: {raw} is not supported (use PLAIN, SCRAM-SHA-256 or \
             SCRAM-SHA-512)"
        )));
    };
    let jaas_key = format!("{}.sasl.jaas.config", mechanism.name().to_ascii_lowercase());
    let (key, jaas) = [jaas_key.as_str(), "sasl.jaas.config"]
        .into_iter()
        .find_map(|k| config.listener_value(listener, k).map(|v| (k, v)))
        .ok_or_else(|| {
            BrokerError::Config(format!(
                "listener.name.{}.{jaas_key}: the listener {listener} this node dials uses \
                 SASL {}: give this node's username=\"…\" password=\"…\" there",
                listener.to_ascii_lowercase(),
                mechanism.name()
            ))
        })?;
    let option = |name: &str| {
        jaas_option(jaas, name).ok_or_else(|| {
            BrokerError::Config(format!(
                "{key} (listener {listener}): no {name}=\"…\" option for this node's login"
            ))
        })
    };
    Ok(SaslLogin {
        mechanism,
        username: option("username")?,
        password: option("password")?,
    })
}

/// The value of `name="value"` in a JAAS line (the option's name must stand alone, so
/// that `username` does not match inside `user_username`).
fn jaas_option(jaas: &str, name: &str) -> Option<String> {
    let mut rest = jaas;
    let mut offset = 0;
    while let Some(i) = rest.find(name) {
        let start = offset + i;
        let before = jaas[..start].chars().next_back();
        let after = jaas[start + name.len()..].trim_start();
        let stands_alone = before.is_none_or(|c| c.is_whitespace() || c == ';');
        if stands_alone {
            if let Some(value) = after.strip_prefix('=') {
                let value = value.trim_start().strip_prefix('"')?;
                let end = value.find('"')?;
                return Some(value[..end].to_string());
            }
        }
        offset = start + name.len();
        rest = &jaas[offset..];
    }
    None
}

/// SaslHandshake then the mechanism's SaslAuthenticate exchange on `stream`.
async fn authenticate(
    stream: &mut InterBrokerStream,
    login: &SaslLogin,
    client_id: &str,
) -> std::io::Result<()> {
    let mut exchange = SaslExchange {
        stream,
        buf: BytesMut::with_capacity(1024),
        correlation_id: 0,
        client_id,
    };
    let handshake = exchange
        .send(
            &SaslHandshakeRequest {
                mechanism: login.mechanism.name().to_string(),
            },
            SASL_HANDSHAKE_VERSION,
        )
        .await?;
    if handshake.error_code != ErrorCode::NONE.code() {
        return Err(refused(format!(
            "SaslHandshake answered {}; the listener offers {}",
            ErrorCode::from_code(handshake.error_code).name(),
            handshake.mechanisms.join(", ")
        )));
    }
    match login.mechanism {
        Mechanism::Plain => {
            let mut token = Vec::with_capacity(login.username.len() + login.password.len() + 2);
            token.push(0);
            token.extend_from_slice(login.username.as_bytes());
            token.push(0);
            token.extend_from_slice(login.password.as_bytes());
            exchange.authenticate(token).await?;
        }
        Mechanism::Scram(m) => {
            let mut client = ScramClient::new(m, &login.username, &login.password)
                .map_err(|e| invalid(e.to_string()))?;
            let server_first = exchange.authenticate(client.client_first()).await?;
            let client_final = client
                .client_final(&server_first)
                .map_err(|e| invalid(format!("server-first: {e}")))?;
            let server_final = exchange.authenticate(client_final).await?;
            client
                .verify_server_final(&server_final)
                .map_err(|e| refused(format!("server-final: {e}")))?;
        }
    }
    Ok(())
}

/// Request/response on a connection that is being authenticated.
struct SaslExchange<'a> {
    stream: &'a mut InterBrokerStream,
    buf: BytesMut,
    correlation_id: i32,
    client_id: &'a str,
}

impl SaslExchange<'_> {
    /// One SaslAuthenticate round: the server's token, or its refusal as an error.
    async fn authenticate(&mut self, token: Vec<u8>) -> std::io::Result<Bytes> {
        let response = self
            .send(
                &SaslAuthenticateRequest {
                    auth_bytes: Bytes::from(token),
                    ..Default::default()
                },
                SASL_AUTHENTICATE_VERSION,
            )
            .await?;
        if response.error_code != ErrorCode::NONE.code() {
            return Err(refused(format!(
                "{}: {}",
                ErrorCode::from_code(response.error_code).name(),
                response.error_message.unwrap_or_default()
            )));
        }
        Ok(response.auth_bytes)
    }

    async fn send<R: Request>(
        &mut self,
        request: &R,
        version: i16,
    ) -> std::io::Result<R::Response> {
        self.correlation_id = self.correlation_id.wrapping_add(1);
        exchange(
            self.stream,
            &mut self.buf,
            (self.client_id, self.correlation_id),
            request,
            version,
            MAX_SASL_RESPONSE_BYTES,
        )
        .await
    }
}

/// Writes one request on `stream` and reads its response, framed and checked against
/// the correlation id; `buf` keeps what was read past it.
async fn exchange<R: Request>(
    stream: &mut InterBrokerStream,
    buf: &mut BytesMut,
    (client_id, correlation_id): (&str, i32),
    request: &R,
    version: i16,
    max_response_bytes: usize,
) -> std::io::Result<R::Response> {
    let api = ApiKey::from_i16(R::API_KEY).ok_or_else(|| invalid("unknown api".into()))?;
    let header = RequestHeader {
        request_api_key: R::API_KEY,
        request_api_version: version,
        correlation_id,
        client_id: Some(client_id.to_string()),
        ..Default::default()
    };
    let mut frame = BytesMut::new();
    encode_request_frame(&mut frame, &header, request).map_err(|e| invalid(e.to_string()))?;
    stream.write_all(&frame).await?;
    // TLS may hold the last record until flushed.
    stream.flush().await?;
    let mut bytes = loop {
        match decode_frame(buf, max_response_bytes) {
            Ok(Some(frame)) => break frame.freeze(),
            Ok(None) => {}
            Err(e) => return Err(invalid(e.to_string())),
        }
        if stream.read_buf(buf).await? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the peer closed the connection",
            ));
        }
    };
    let header = ResponseHeader::decode(&mut bytes, api.response_header_version(version))
        .map_err(|e| invalid(e.to_string()))?;
    if header.correlation_id != correlation_id {
        return Err(invalid("correlation id mismatch".into()));
    }
    R::Response::decode(&mut bytes, version).map_err(|e| invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jaas_options_are_read_in_kafkas_form() {
        let jaas = r#"org.apache.kafka.common.security.scram.ScramLoginModule required username="broker" password="s3cr=t" user_username="x";"#;
        assert_eq!(jaas_option(jaas, "username").as_deref(), Some("broker"));
        assert_eq!(jaas_option(jaas, "password").as_deref(), Some("s3cr=t"));
        let plain = r#"org.apache.kafka.common.security.plain.PlainLoginModule required user_admin="a" username = "admin" password="a";"#;
        assert_eq!(jaas_option(plain, "username").as_deref(), Some("admin"));
        assert_eq!(jaas_option("x required;", "username"), None);
        assert_eq!(jaas_option(r#"x username="unterminated"#, "username"), None);
    }

    fn sasl_config(pairs: &[(&str, &str)]) -> BrokerConfig {
        let mut c = BrokerConfig::default();
        c.set(
            "listeners",
            "PLAINTEXT://127.0.0.1:9092,SASL_PLAINTEXT://127.0.0.1:9093",
        );
        c.set("inter.broker.listener.name", "SASL_PLAINTEXT");
        for (k, v) in pairs {
            c.set(k, v);
        }
        c
    }

    #[test]
    fn the_login_comes_from_the_listeners_jaas_config_for_the_mechanism() {
        let c = sasl_config(&[
            ("sasl.mechanism.inter.broker.protocol", "SCRAM-SHA-512"),
            (
                "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config",
                r#"ScramLoginModule required username="broker" password="pw";"#,
            ),
            (
                "plain.sasl.jaas.config",
                r#"PlainLoginModule required username="other" password="x";"#,
            ),
        ]);
        let connector = InterBrokerConnector::from_config(&c).unwrap();
        let login = connector.sasl.as_ref().unwrap();
        assert_eq!(login.mechanism, Mechanism::Scram(ScramMechanism::Sha512));
        assert_eq!(
            (login.username.as_str(), login.password.as_str()),
            ("broker", "pw")
        );
        assert!(connector.tls.is_none());

        // PLAIN by default; the global key serves when the listener has none.
        let c = sasl_config(&[(
            "plain.sasl.jaas.config",
            r#"PlainLoginModule required username="b" password="p" user_b="p";"#,
        )]);
        let login = InterBrokerConnector::from_config(&c).unwrap().sasl.unwrap();
        assert_eq!(login.mechanism, Mechanism::Plain);
        assert_eq!(login.username, "b");

        let err = |c: BrokerConfig| {
            InterBrokerConnector::from_config(&c)
                .unwrap_err()
                .to_string()
        };
        assert!(err(sasl_config(&[])).contains("plain.sasl.jaas.config"));
        assert!(err(sasl_config(&[(
            "sasl.mechanism.inter.broker.protocol",
            "GSSAPI"
        )]))
        .contains("GSSAPI"));
        assert!(err(sasl_config(&[(
            "plain.sasl.jaas.config",
            r#"PlainLoginModule required user_b="p";"#
        )]))
        .contains("username"));
    }

    #[test]
    fn the_controller_listener_dials_with_its_own_protocol_and_mechanism() {
        let mut c = BrokerConfig::default();
        c.set(
            "listeners",
            "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093",
        );
        // Not in the map: PLAINTEXT, as before the controller listener could be secured.
        let connector = InterBrokerConnector::for_controller(&c).unwrap();
        assert_eq!(connector.protocol(), SecurityProtocol::Plaintext);
        assert_eq!(connector.listener(), "CONTROLLER");

        c.set(
            "listener.security.protocol.map",
            "PLAINTEXT:PLAINTEXT,CONTROLLER:SASL_PLAINTEXT",
        );
        c.set("sasl.mechanism.inter.broker.protocol", "PLAIN");
        c.set("sasl.mechanism.controller.protocol", "SCRAM-SHA-256");
        c.set(
            "listener.name.controller.scram-sha-256.sasl.jaas.config",
            r#"ScramLoginModule required username="ctl" password="pw";"#,
        );
        let connector = InterBrokerConnector::for_controller(&c).unwrap();
        assert_eq!(connector.protocol(), SecurityProtocol::SaslPlaintext);
        let login = connector.sasl.unwrap();
        assert_eq!(login.mechanism, Mechanism::Scram(ScramMechanism::Sha256));
        assert_eq!(login.username, "ctl");
        // The inter-broker side is untouched by the controller's keys.
        assert!(InterBrokerConnector::from_config(&c)
            .unwrap()
            .sasl
            .is_none());

        c.set("sasl.mechanism.controller.protocol", "GSSAPI");
        let e = InterBrokerConnector::for_controller(&c)
            .unwrap_err()
            .to_string();
        assert!(e.contains("sasl.mechanism.controller.protocol"), "{e}");

        c.set(
            "listener.security.protocol.map",
            "PLAINTEXT:PLAINTEXT,CONTROLLER:SSL",
        );
        let e = InterBrokerConnector::for_controller(&c)
            .unwrap_err()
            .to_string();
        assert!(e.contains("ssl.truststore.location"), "{e}");
    }

    #[test]
    fn a_tls_inter_broker_listener_needs_a_truststore() {
        let mut c = BrokerConfig::default();
        c.set("listeners", "SSL://127.0.0.1:9093");
        let e = InterBrokerConnector::from_config(&c)
            .unwrap_err()
            .to_string();
        assert!(e.contains("ssl.truststore.location"), "{e}");
    }
}
