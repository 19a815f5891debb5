//! SASL on a connection (Kafka's `SaslServerAuthenticator`): SaslHandshake v0–1,
//! SaslAuthenticate v0–2, the PLAIN and SCRAM-SHA-256/512 mechanisms, and the gate that
//! lets nothing else through before authentication.
//!
//! On a `SASL_PLAINTEXT` or `SASL_SSL` listener a connection starts unauthenticated: it
//! may send ApiVersions, then SaslHandshake naming a mechanism, then the mechanism's
//! tokens, in SaslAuthenticate requests (handshake v1) or as bare size-prefixed frames
//! (handshake v0, as before KIP-152). Any other request closes the connection, and its
//! frames stay under `sasl.server.max.receive.size` (the pre-authentication limit that
//! CVE-2022-34917 taught). A failed authentication is answered
//! SASL_AUTHENTICATION_FAILED and the connection is closed.
//!
//! PLAIN users come from the config, in Kafka's JAAS form
//! (`plain.sasl.jaas.config = '... user_alice="alice-secret" user_bob="…";'`, per
//! listener as `listener.name.<listener>.plain.sasl.jaas.config`) and/or from
//! `sasl.plain.users.file`, a file of `user:password` lines. Passwords are compared in
//! constant time. SCRAM credentials live in the metadata log; the network asks its
//! [`RequestHandler`](super::RequestHandler) for them.

use std::collections::HashMap;

use rill_protocol::generated::{
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use rill_protocol::{Decodable, Encodable, ErrorCode};
use subtle::ConstantTimeEq;

use crate::config::BrokerConfig;
use crate::error::BrokerError;
use crate::network::scram::{ScramCredential, ScramMechanism, ScramServer, ScramStep};

/// The mechanisms Rill's server speaks.
pub const MECHANISMS: [&str; 3] = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];

/// A SASL listener's settings.
pub struct SaslConfig {
    /// `sasl.enabled.mechanisms`, in the order given.
    pub mechanisms: Vec<String>,
    /// PLAIN's users and passwords.
    plain_users: HashMap<String, String>,
}

impl std::fmt::Debug for SaslConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaslConfig")
            .field("mechanisms", &self.mechanisms)
            .field("plain_users", &self.plain_users.len())
            .finish()
    }
}

impl SaslConfig {
    pub fn new(mechanisms: &[&str], plain_users: &[(&str, &str)]) -> Self {
        Self {
            mechanisms: mechanisms.iter().map(|m| m.to_string()).collect(),
            plain_users: plain_users
                .iter()
                .map(|(u, p)| (u.to_string(), p.to_string()))
                .collect(),
        }
    }

    /// The listener's `sasl.enabled.mechanisms` (all of [`MECHANISMS`] unless set) and
    /// PLAIN users (see the module docs).
    pub fn from_config(config: &BrokerConfig, listener: &str) -> Result<Self, BrokerError> {
        let mechanisms: Vec<String> =
            match config.listener_value(listener, "sasl.enabled.mechanisms") {
                Some(raw) => raw
                    .split(',')
                    .map(|m| m.trim().to_ascii_uppercase())
                    .filter(|m| !m.is_empty())
                    .collect(),
                None => MECHANISMS.iter().map(|m| m.to_string()).collect(),
            };
        for m in &mechanisms {
            if !MECHANISMS.contains(&m.as_str()) {
                return Err(BrokerError::Config(format!(
                    "sasl.enabled.mechanisms (listener {listener}): {m} is not supported \
                     (use {})",
                    MECHANISMS.join(", ")
                )));
            }
        }
        if mechanisms.is_empty() {
            return Err(BrokerError::Config(format!(
                "sasl.enabled.mechanisms (listener {listener}) is empty"
            )));
        }
        let mut plain_users = HashMap::new();
        if let Some(jaas) = config.listener_value(listener, "plain.sasl.jaas.config") {
            plain_users.extend(parse_jaas_users(jaas).map_err(|e| {
                BrokerError::Config(format!("plain.sasl.jaas.config (listener {listener}): {e}"))
            })?);
        }
        if let Some(path) = config.listener_value(listener, "sasl.plain.users.file") {
            let text = std::fs::read_to_string(path.trim()).map_err(|e| {
                BrokerError::Config(format!(
                    "sasl.plain.users.file (listener {listener}): {path}: {e}"
                ))
            })?;
            for (n, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let (user, password) = line.split_once(':').ok_or_else(|| {
                    BrokerError::Config(format!(
                        "sasl.plain.users.file {path}: line {} is not user:password",
                        n + 1
                    ))
                })?;
                plain_users.insert(user.trim().to_string(), password.to_string());
            }
        }
        Ok(Self {
            mechanisms,
            plain_users,
        })
    }

    fn enabled(&self, mechanism: &str) -> bool {
        self.mechanisms.iter().any(|m| m == mechanism)
    }

    /// PLAIN's check: the user's password, compared in constant time (over the longer
    /// of the two lengths, so that the time says nothing of the stored one's length
    /// beyond what a wrong length already does).
    pub(crate) fn check_plain(&self, user: &str, password: &str) -> bool {
        let Some(expected) = self.plain_users.get(user) else {
            // Same work as a known user, so that timing does not reveal who exists.
            let _ = password.as_bytes().ct_eq(password.as_bytes());
            return false;
        };
        bool::from(expected.as_bytes().ct_eq(password.as_bytes()))
    }
}

/// `user_<name>="<password>"` options of a JAAS `PlainLoginModule` line.
fn parse_jaas_users(jaas: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut rest = jaas;
    while let Some(i) = rest.find("user_") {
        let after = &rest[i + 5..];
        let (name, value) = after
            .split_once('=')
            .ok_or_else(|| "user_NAME without =\"PASSWORD\"".to_string())?;
        let value = value.trim_start();
        let value = value
            .strip_prefix('"')
            .ok_or_else(|| format!("user_{name}: the password must be in double quotes"))?;
        let end = value
            .find('"')
            .ok_or_else(|| format!("user_{name}: unterminated password"))?;
        out.push((name.trim().to_string(), value[..end].to_string()));
        rest = &value[end + 1..];
    }
    if out.is_empty() {
        return Err("no user_NAME=\"PASSWORD\" entry".into());
    }
    Ok(out)
}

/// A mechanism chosen by SaslHandshake, mid-exchange.
enum Exchange {
    Plain,
    Scram(Box<ScramServer>),
}

/// Where a connection is in authentication.
enum State {
    /// Waiting for SaslHandshake.
    Handshake,
    /// The mechanism's tokens, wrapped in SaslAuthenticate (`raw == false`) or bare.
    Authenticate { exchange: Exchange, raw: bool },
    /// Done: the principal.
    Authenticated(String),
}

/// What the connection does with a request or a token, decided by [`Authenticator`].
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not a SASL matter: hand it to the server.
    Pass,
    /// Send this response frame body (without the size prefix) and read on.
    Respond(Vec<u8>),
    /// Send this (when given), then close the connection.
    Close {
        response: Option<Vec<u8>>,
        reason: String,
    },
}

/// The per-connection SASL state machine of a SASL listener (none on other listeners).
pub struct Authenticator {
    config: std::sync::Arc<SaslConfig>,
    state: State,
}

/// Kafka's SaslHandshake/SaslAuthenticate api keys.
const SASL_HANDSHAKE: i16 = 17;
const SASL_AUTHENTICATE: i16 = 36;
const API_VERSIONS: i16 = 18;

/// The user-facing reason of every failed authentication (Kafka's wording).
const FAILED: &str = "Authentication failed: Invalid username or password";

impl Authenticator {
    pub fn new(config: std::sync::Arc<SaslConfig>) -> Self {
        Self {
            config,
            state: State::Handshake,
        }
    }

    /// The authenticated principal (`User:alice`), once there is one.
    pub fn principal(&self) -> Option<&str> {
        match &self.state {
            State::Authenticated(p) => Some(p),
            _ => None,
        }
    }

    /// Whether the next frame is a bare token (after a v0 handshake), not a request.
    pub fn expects_raw_token(&self) -> bool {
        matches!(self.state, State::Authenticate { raw: true, .. })
    }

    /// A bare token after a v0 handshake; the answer is sent as a bare frame too.
    pub fn raw_token(
        &mut self,
        token: &[u8],
        scram: impl FnOnce(&str, ScramMechanism) -> Option<ScramCredential>,
    ) -> Verdict {
        match self.exchange(token, scram) {
            Ok(reply) => Verdict::Respond(reply),
            Err(reason) => Verdict::Close {
                response: None,
                reason,
            },
        }
    }

    /// Looks at one request: SASL requests are answered here, ApiVersions passes, and
    /// before authentication anything else closes the connection.
    pub fn request(
        &mut self,
        api_key: i16,
        version: i16,
        correlation_id: i32,
        body: &mut bytes::Bytes,
        scram: impl FnOnce(&str, ScramMechanism) -> Option<ScramCredential>,
    ) -> Verdict {
        match api_key {
            SASL_HANDSHAKE => self.handshake(version, correlation_id, body),
            SASL_AUTHENTICATE => self.authenticate(version, correlation_id, body, scram),
            API_VERSIONS => Verdict::Pass,
            _ if self.principal().is_some() => Verdict::Pass,
            other => Verdict::Close {
                response: None,
                reason: format!("request of api key {other} before SASL authentication"),
            },
        }
    }

    fn handshake(&mut self, version: i16, correlation_id: i32, body: &mut bytes::Bytes) -> Verdict {
        if !(0..=1).contains(&version) {
            return close(format!("SaslHandshake v{version} is not supported"));
        }
        let request = match SaslHandshakeRequest::decode(body, version) {
            Ok(r) => r,
            Err(e) => return close(format!("SaslHandshake: {e}")),
        };
        let mut response = SaslHandshakeResponse {
            error_code: ErrorCode::NONE.code(),
            mechanisms: self.config.mechanisms.clone(),
        };
        if !matches!(self.state, State::Handshake) {
            // Re-authentication (KIP-368) is not offered: a second handshake is illegal.
            response.error_code = ErrorCode::ILLEGAL_SASL_STATE.code();
            return match encode(correlation_id, SASL_HANDSHAKE, version, &response) {
                Ok(b) => Verdict::Close {
                    response: Some(b),
                    reason: "SaslHandshake after the handshake".into(),
                },
                Err(e) => close(e),
            };
        }
        let mechanism = request.mechanism;
        let exchange = if !self.config.enabled(&mechanism) {
            None
        } else if mechanism == "PLAIN" {
            Some(Exchange::Plain)
        } else {
            ScramMechanism::from_name(&mechanism)
                .map(|m| Exchange::Scram(Box::new(ScramServer::new(m))))
        };
        let Some(exchange) = exchange else {
            response.error_code = ErrorCode::UNSUPPORTED_SASL_MECHANISM.code();
            return match encode(correlation_id, SASL_HANDSHAKE, version, &response) {
                Ok(b) => Verdict::Close {
                    response: Some(b),
                    reason: format!("SASL mechanism {mechanism:?} is not enabled"),
                },
                Err(e) => close(e),
            };
        };
        self.state = State::Authenticate {
            exchange,
            raw: version == 0,
        };
        match encode(correlation_id, SASL_HANDSHAKE, version, &response) {
            Ok(b) => Verdict::Respond(b),
            Err(e) => close(e),
        }
    }

    fn authenticate(
        &mut self,
        version: i16,
        correlation_id: i32,
        body: &mut bytes::Bytes,
        scram: impl FnOnce(&str, ScramMechanism) -> Option<ScramCredential>,
    ) -> Verdict {
        if !(0..=2).contains(&version) {
            return close(format!("SaslAuthenticate v{version} is not supported"));
        }
        let request = match SaslAuthenticateRequest::decode(body, version) {
            Ok(r) => r,
            Err(e) => return close(format!("SaslAuthenticate: {e}")),
        };
        if !matches!(self.state, State::Authenticate { raw: false, .. }) {
            let response = SaslAuthenticateResponse {
                error_code: ErrorCode::ILLEGAL_SASL_STATE.code(),
                error_message: Some("SaslAuthenticate without a SaslHandshake v1".into()),
                ..Default::default()
            };
            return match encode(correlation_id, SASL_AUTHENTICATE, version, &response) {
                Ok(b) => Verdict::Close {
                    response: Some(b),
                    reason: "SaslAuthenticate out of order".into(),
                },
                Err(e) => close(e),
            };
        }
        match self.exchange(&request.auth_bytes, scram) {
            Ok(reply) => {
                let response = SaslAuthenticateResponse {
                    error_code: ErrorCode::NONE.code(),
                    auth_bytes: bytes::Bytes::from(reply),
                    // No re-authentication: the session does not expire (KIP-368's 0).
                    session_lifetime_ms: 0,
                    ..Default::default()
                };
                match encode(correlation_id, SASL_AUTHENTICATE, version, &response) {
                    Ok(b) => Verdict::Respond(b),
                    Err(e) => close(e),
                }
            }
            Err(reason) => {
                let response = SaslAuthenticateResponse {
                    error_code: ErrorCode::SASL_AUTHENTICATION_FAILED.code(),
                    error_message: Some(FAILED.into()),
                    ..Default::default()
                };
                match encode(correlation_id, SASL_AUTHENTICATE, version, &response) {
                    Ok(b) => Verdict::Close {
                        response: Some(b),
                        reason,
                    },
                    Err(e) => close(e),
                }
            }
        }
    }

    /// One token of the chosen mechanism: the reply token, or why authentication failed.
    /// On success of the last step the state becomes `Authenticated`.
    fn exchange(
        &mut self,
        token: &[u8],
        scram: impl FnOnce(&str, ScramMechanism) -> Option<ScramCredential>,
    ) -> Result<Vec<u8>, String> {
        let State::Authenticate { exchange, .. } = &mut self.state else {
            return Err("a SASL token outside an exchange".into());
        };
        match exchange {
            Exchange::Plain => {
                let (user, password) = parse_plain(token).ok_or("malformed PLAIN message")?;
                if !self.config.check_plain(&user, &password) {
                    return Err(format!("PLAIN: invalid credentials for {user:?}"));
                }
                tracing::debug!(user, "authenticated with PLAIN");
                self.state = State::Authenticated(format!("User:{user}"));
                Ok(Vec::new())
            }
            Exchange::Scram(server) => {
                let mechanism = server.mechanism();
                let step = server.step(token, |user| scram(user, mechanism));
                match step {
                    Ok(ScramStep::Continue(reply)) => Ok(reply),
                    Ok(ScramStep::Done { user, response }) => {
                        tracing::debug!(user, "authenticated with SCRAM");
                        self.state = State::Authenticated(format!("User:{user}"));
                        Ok(response)
                    }
                    Err(e) => Err(format!("SCRAM: {e}")),
                }
            }
        }
    }
}

fn close(reason: String) -> Verdict {
    Verdict::Close {
        response: None,
        reason,
    }
}

/// PLAIN's message (RFC 4616): `[authzid] NUL authcid NUL passwd`. Kafka accepts an
/// authzid only when it is the authcid.
fn parse_plain(token: &[u8]) -> Option<(String, String)> {
    let text = std::str::from_utf8(token).ok()?;
    let mut parts = text.split('\0');
    let authzid = parts.next()?;
    let user = parts.next()?;
    let password = parts.next()?;
    if parts.next().is_some() || user.is_empty() || (!authzid.is_empty() && authzid != user) {
        return None;
    }
    Some((user.to_string(), password.to_string()))
}

/// A response frame's body (correlation id, header, body; no size prefix). SaslHandshake
/// and SaslAuthenticate v0–1 use response header v0; SaslAuthenticate v2 is flexible.
fn encode<T: Encodable>(
    correlation_id: i32,
    api_key: i16,
    version: i16,
    body: &T,
) -> Result<Vec<u8>, String> {
    let mut buf = bytes::BytesMut::new();
    let header_version = rill_protocol::ApiKey::from_i16(api_key)
        .map_or(0, |api| api.response_header_version(version));
    let header = rill_protocol::generated::response_header::ResponseHeader {
        correlation_id,
        ..Default::default()
    };
    header
        .encode(&mut buf, header_version)
        .map_err(|e| format!("encoding a SASL response header: {e}"))?;
    body.encode(&mut buf, version)
        .map_err(|e| format!("encoding a SASL response: {e}"))?;
    Ok(buf.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::scram::tests::{stored, Client};
    use bytes::{BufMut, Bytes, BytesMut};
    use std::sync::Arc;

    fn authenticator() -> Authenticator {
        Authenticator::new(Arc::new(SaslConfig::new(
            &MECHANISMS,
            &[("alice", "alice-secret")],
        )))
    }

    fn body<T: Encodable>(msg: &T, version: i16) -> Bytes {
        let mut b = BytesMut::new();
        msg.encode(&mut b, version).unwrap();
        b.freeze()
    }

    fn handshake(mechanism: &str, version: i16) -> Bytes {
        body(
            &SaslHandshakeRequest {
                mechanism: mechanism.into(),
            },
            version,
        )
    }

    fn authenticate(token: &[u8], version: i16) -> Bytes {
        body(
            &SaslAuthenticateRequest {
                auth_bytes: Bytes::copy_from_slice(token),
                ..Default::default()
            },
            version,
        )
    }

    /// The error code of a SaslHandshake/SaslAuthenticate v0-1 response body.
    fn error_code(response: &[u8]) -> i16 {
        i16::from_be_bytes([response[4], response[5]])
    }

    fn no_scram(_: &str, _: ScramMechanism) -> Option<ScramCredential> {
        None
    }

    #[test]
    fn before_authentication_only_api_versions_and_sasl_pass() {
        let mut a = authenticator();
        assert_eq!(
            a.request(18, 3, 1, &mut Bytes::new(), no_scram),
            Verdict::Pass
        );
        for api in [0, 1, 3, 8, 9, 10, 19, 32] {
            assert!(
                matches!(
                    authenticator().request(api, 0, 1, &mut Bytes::new(), no_scram),
                    Verdict::Close { response: None, .. }
                ),
                "api {api}"
            );
        }
        // SaslAuthenticate before the handshake: ILLEGAL_SASL_STATE, then closed.
        let v = authenticator().request(36, 1, 1, &mut authenticate(b"x", 1), no_scram);
        let Verdict::Close {
            response: Some(r), ..
        } = v
        else {
            panic!("{v:?}")
        };
        assert_eq!(error_code(&r), ErrorCode::ILLEGAL_SASL_STATE.code());
        assert_eq!(a.principal(), None);
    }

    #[test]
    fn plain_authenticates_then_everything_passes() {
        let mut a = authenticator();
        let Verdict::Respond(r) = a.request(17, 1, 1, &mut handshake("PLAIN", 1), no_scram) else {
            panic!()
        };
        assert_eq!(error_code(&r), 0);
        let v = a.request(
            36,
            2,
            2,
            &mut authenticate(b"\0alice\0alice-secret", 2),
            no_scram,
        );
        assert!(matches!(v, Verdict::Respond(_)), "{v:?}");
        assert_eq!(a.principal(), Some("User:alice"));
        assert_eq!(
            a.request(0, 9, 3, &mut Bytes::new(), no_scram),
            Verdict::Pass
        );
        // No re-authentication: a second handshake is illegal.
        let v = a.request(17, 1, 4, &mut handshake("PLAIN", 1), no_scram);
        assert!(
            matches!(
                v,
                Verdict::Close {
                    response: Some(_),
                    ..
                }
            ),
            "{v:?}"
        );
    }

    #[test]
    fn wrong_password_unknown_user_and_bad_messages_fail_and_close() {
        for token in [
            &b"\0alice\0wrong"[..],
            b"\0mallory\0alice-secret",
            b"bob\0alice\0alice-secret",
            b"\0alice",
            b"\0\0",
            b"\xff\0alice\0alice-secret",
        ] {
            let mut a = authenticator();
            a.request(17, 1, 1, &mut handshake("PLAIN", 1), no_scram);
            let v = a.request(36, 1, 2, &mut authenticate(token, 1), no_scram);
            let Verdict::Close {
                response: Some(r), ..
            } = v
            else {
                panic!("{token:?}: {v:?}")
            };
            assert_eq!(
                error_code(&r),
                ErrorCode::SASL_AUTHENTICATION_FAILED.code(),
                "{token:?}"
            );
            assert_eq!(a.principal(), None);
        }
    }

    #[test]
    fn a_mechanism_not_enabled_is_refused_with_the_list() {
        let mut a = Authenticator::new(Arc::new(SaslConfig::new(&["SCRAM-SHA-512"], &[])));
        let v = a.request(17, 1, 1, &mut handshake("PLAIN", 1), no_scram);
        let Verdict::Close {
            response: Some(r), ..
        } = v
        else {
            panic!("{v:?}")
        };
        assert_eq!(error_code(&r), ErrorCode::UNSUPPORTED_SASL_MECHANISM.code());
        let mut r = Bytes::from(r[4..].to_vec());
        let decoded = SaslHandshakeResponse::decode(&mut r, 1).unwrap();
        assert_eq!(decoded.mechanisms, ["SCRAM-SHA-512"]);
    }

    #[test]
    fn scram_over_v0_raw_tokens_authenticates() {
        let m = ScramMechanism::Sha256;
        let credential = stored(m, "pencil");
        let lookup =
            |u: &str, mech: ScramMechanism| (u == "user" && mech == m).then(|| credential.clone());
        let mut a = authenticator();
        assert!(matches!(
            a.request(17, 0, 1, &mut handshake("SCRAM-SHA-256", 0), no_scram),
            Verdict::Respond(_)
        ));
        assert!(a.expects_raw_token());
        let mut client = Client::new(m, "user", "pencil");
        let Verdict::Respond(first) = a.raw_token(&client.first(), lookup) else {
            panic!()
        };
        let last = client.final_message(&first);
        let Verdict::Respond(signature) = a.raw_token(&last, lookup) else {
            panic!()
        };
        assert_eq!(signature, client.server_signature());
        assert_eq!(a.principal(), Some("User:user"));
        assert!(!a.expects_raw_token());
    }

    #[test]
    fn jaas_users_parse_in_kafkas_form() {
        let users = parse_jaas_users(
            "org.apache.kafka.common.security.plain.PlainLoginModule required \
             username=\"admin\" password=\"x\" user_admin=\"admin-secret\" user_alice=\"a;b c\";",
        )
        .unwrap();
        assert_eq!(
            users,
            [
                ("admin".to_string(), "admin-secret".to_string()),
                ("alice".to_string(), "a;b c".to_string())
            ]
        );
        assert!(parse_jaas_users("PlainLoginModule required;").is_err());
        assert!(parse_jaas_users("user_x=unquoted").is_err());
        let mut b = BytesMut::new();
        b.put_u8(0);
        assert_eq!(parse_plain(&b), None);
    }

    proptest::proptest! {
        /// Whatever a peer sends before authenticating (any api key and version, any body,
        /// any token), the state machine neither panics nor lets it in without the
        /// password; SCRAM is fed the same bytes against a real credential.
        #[test]
        fn hostile_pre_auth_input_never_authenticates(
            steps in proptest::collection::vec(
                (0i16..70, -1i16..5, proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)),
                1..12,
            ),
            mechanism in 0usize..3,
        ) {
            let credential = stored(ScramMechanism::Sha512, "pw");
            let lookup = |_: &str, _: ScramMechanism| Some(credential.clone());
            let mut a = authenticator();
            let mut h = handshake(MECHANISMS[mechanism], 1);
            a.request(17, 1, 0, &mut h, lookup);
            for (api, version, raw) in steps {
                let mut body = Bytes::from(raw.clone());
                let verdict = if a.expects_raw_token() {
                    a.raw_token(&raw, lookup)
                } else {
                    a.request(api, version, 1, &mut body, lookup)
                };
                if let Verdict::Close { .. } = verdict {
                    break;
                }
            }
            proptest::prop_assert_eq!(a.principal(), None);
        }
    }
}
