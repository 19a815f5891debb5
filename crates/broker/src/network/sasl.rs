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
use std::time::{Duration, Instant};

use rill_protocol::generated::{
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use rill_protocol::{Decodable, Encodable, ErrorCode};
use subtle::ConstantTimeEq;

use crate::config::BrokerConfig;
use crate::error::BrokerError;
use crate::network::oauthbearer::{ClientInitialResponse, OAuthBearerValidator};
use crate::network::scram::{ScramIdentity, ScramMechanism, ScramName, ScramServer, ScramStep};

/// The mechanisms Rill's server speaks.
pub const MECHANISMS: [&str; 4] = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"];

/// The mechanisms a SASL listener enables when `sasl.enabled.mechanisms` is not set:
/// OAUTHBEARER only when named, since its default validator (Kafka's unsecured one)
/// proves nothing about who a client is.
pub const DEFAULT_MECHANISMS: [&str; 3] = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];

/// A SASL listener's settings.
pub struct SaslConfig {
    /// `sasl.enabled.mechanisms`, in the order given.
    pub mechanisms: Vec<String>,
    /// PLAIN's users and passwords.
    plain_users: HashMap<String, String>,
    /// OAUTHBEARER's token validator, when the mechanism is enabled.
    oauthbearer: Option<OAuthBearerValidator>,
    /// `connections.max.reauth.ms` per mechanism, where positive (KIP-368).
    max_reauth_ms: HashMap<String, i64>,
}

impl std::fmt::Debug for SaslConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaslConfig")
            .field("mechanisms", &self.mechanisms)
            .field("plain_users", &self.plain_users.len())
            .field("oauthbearer", &self.oauthbearer)
            .field("max_reauth_ms", &self.max_reauth_ms)
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
            oauthbearer: None,
            max_reauth_ms: HashMap::new(),
        }
    }

    /// With sessions of `mechanism` ending `ms` after their authentication (KIP-368).
    pub fn with_max_reauth_ms(mut self, mechanism: &str, ms: i64) -> Self {
        self.max_reauth_ms.insert(mechanism.to_string(), ms);
        self
    }

    /// With OAUTHBEARER's tokens checked by `validator`.
    pub fn with_oauthbearer(mut self, validator: OAuthBearerValidator) -> Self {
        self.oauthbearer = Some(validator);
        self
    }

    /// `connections.max.reauth.ms` for a mechanism, when its sessions end.
    fn max_reauth_ms(&self, mechanism: &str) -> Option<i64> {
        self.max_reauth_ms.get(mechanism).copied()
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
                None => DEFAULT_MECHANISMS.iter().map(|m| m.to_string()).collect(),
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
        let oauthbearer = if mechanisms.iter().any(|m| m == "OAUTHBEARER") {
            Some(OAuthBearerValidator::from_config(config, listener)?)
        } else {
            None
        };
        // Kafka's `connections.max.reauth.ms`: the listener's value for the mechanism
        // (`listener.name.<l>.<mechanism>.connections.max.reauth.ms`), else the
        // listener's, else the broker's; 0 (the default) means sessions never end.
        let mut max_reauth_ms = HashMap::new();
        for m in &mechanisms {
            let scoped = format!(
                "listener.name.{}.{}.connections.max.reauth.ms",
                listener.to_ascii_lowercase(),
                m.to_ascii_lowercase()
            );
            let raw = config
                .get(&scoped)
                .or_else(|| config.listener_value(listener, "connections.max.reauth.ms"));
            let Some(raw) = raw else { continue };
            let ms: i64 = raw.trim().parse().map_err(|_| {
                BrokerError::Config(format!(
                    "connections.max.reauth.ms (listener {listener}, {m}): not a number: {raw}"
                ))
            })?;
            if ms > 0 {
                max_reauth_ms.insert(m.clone(), ms);
            }
        }
        Ok(Self {
            mechanisms,
            plain_users,
            oauthbearer,
            max_reauth_ms,
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
    /// OAUTHBEARER: one initial response; after a refused token the server has sent its
    /// JSON error and waits for the client's ^A, then fails (RFC 7628 §3.2.3).
    OAuthBearer {
        refused: Option<String>,
    },
}

/// Where a connection is in authentication.
enum State {
    /// Waiting for SaslHandshake.
    Handshake,
    /// The mechanism's tokens, wrapped in SaslAuthenticate (`raw == false`) or bare.
    Authenticate {
        exchange: Exchange,
        mechanism: String,
        raw: bool,
    },
    /// A re-authentication's handshake named a mechanism other than the session's: its
    /// next token fails the connection (Kafka's `REAUTH_BAD_MECHANISM`).
    BadMechanism { reason: String, raw: bool },
    /// Done: the session says who.
    Authenticated,
}

/// The outcome of the last successful (re-)authentication (Kafka's `ReauthInfo`).
struct AuthSession {
    principal: String,
    mechanism: String,
    /// Authenticated with a delegation token (SCRAM with `tokenauth`), which may not ask
    /// for delegation tokens itself (Kafka's `KafkaPrincipal.tokenAuthenticated`).
    token_authenticated: bool,
    /// When the session ends (KIP-368): `connections.max.reauth.ms` after the
    /// authentication, or the token's expiry if sooner; `None`, never.
    expires: Option<Instant>,
}

/// The time a step of authentication happens at: the monotonic clock for session expiry,
/// the wall clock for a token's `exp`. The connection reads both; tests pass their own.
#[derive(Debug, Clone, Copy)]
pub struct AuthTime {
    pub instant: Instant,
    pub unix_ms: i64,
}

impl AuthTime {
    pub fn now() -> Self {
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        Self {
            instant: Instant::now(),
            unix_ms,
        }
    }
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
    /// The session's lifetime is over and this request is no re-authentication: close the
    /// connection without an answer (Kafka's expired-connections-killed-count).
    Expired,
}

/// The per-connection SASL state machine of a SASL listener (none on other listeners).
///
/// # Re-authentication (KIP-368)
///
/// 1. A successful authentication ends the session at `connections.max.reauth.ms` (per
///    mechanism and listener) after it, or at the OAUTHBEARER token's `exp` if sooner;
///    SaslAuthenticate v1+ tells the client that lifetime (`session_lifetime_ms`), 0 when
///    the session does not expire.
/// 2. While the session lasts, requests pass as after any authentication.
/// 3. A SaslHandshake on an authenticated connection whose session has an end, and whose
///    last re-authentication began a second or more ago, starts a re-authentication, even
///    after the end: the mechanism must be the session's (another one is accepted by the
///    handshake and fails the connection at its next token, as Kafka does), the exchange
///    runs as the first one did, with its frames held to the pre-authentication limit,
///    and at its end the principal must be the session's, or the connection fails. The
///    new session replaces the old one with a lifetime of its own.
/// 4. Any other request after the end closes the connection ([`Verdict::Expired`]): a
///    client that cannot re-authenticate (SaslAuthenticate v0, or a v0 handshake) is
///    closed at its first request after the end and has to connect again.
/// 5. A SaslHandshake or SaslAuthenticate that starts no re-authentication is answered
///    ILLEGAL_SASL_STATE, and the connection stays, as Kafka's `KafkaApis` answers it.
///
/// Why requests in flight are safe: the connection reads and answers one request at a
/// time, in order, so every request a client sent before its re-authentication's
/// SaslHandshake has been answered under the old session before the handshake is read,
/// and the client sends nothing else until its re-authentication ends (it is Kafka's
/// rule for clients, and a request in the middle of the exchange fails it). The session's
/// principal never changes, so nothing a request was authorized for changes either.
pub struct Authenticator {
    config: std::sync::Arc<SaslConfig>,
    state: State,
    session: Option<AuthSession>,
    /// When the last re-authentication began: one a second at most (Kafka's
    /// `MIN_REAUTH_INTERVAL_ONE_SECOND_NANOS`).
    last_reauthentication: Option<Instant>,
}

/// Kafka's SaslHandshake/SaslAuthenticate api keys.
const SASL_HANDSHAKE: i16 = 17;
const SASL_AUTHENTICATE: i16 = 36;
const API_VERSIONS: i16 = 18;

/// The user-facing reason of every failed PLAIN or SCRAM authentication (Kafka's wording).
const FAILED: &str = "Authentication failed: Invalid username or password";

/// How often a connection may start a re-authentication.
const MIN_REAUTHENTICATION_INTERVAL: Duration = Duration::from_secs(1);

/// Why an exchange failed: what the client is told, and what the log says.
struct Failure {
    message: String,
    reason: String,
}

impl Failure {
    fn new(message: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            reason: reason.into(),
        }
    }
}

/// What an exchange step produced: the token to answer with, and when the exchange ended
/// with it, the session's lifetime in milliseconds for SaslAuthenticate v1+.
struct Step {
    reply: Vec<u8>,
    session_lifetime_ms: i64,
}

impl Authenticator {
    pub fn new(config: std::sync::Arc<SaslConfig>) -> Self {
        Self {
            config,
            state: State::Handshake,
            session: None,
            last_reauthentication: None,
        }
    }

    /// The authenticated principal (`User:alice`), once there is one; during a
    /// re-authentication, the session's.
    pub fn principal(&self) -> Option<&str> {
        self.session.as_ref().map(|s| s.principal.as_str())
    }

    /// Whether the session was authenticated with a delegation token.
    pub fn token_authenticated(&self) -> bool {
        self.session.as_ref().is_some_and(|s| s.token_authenticated)
    }

    /// Whether an authentication or a re-authentication is under way: its frames are held
    /// to the pre-authentication limit.
    pub fn exchanging(&self) -> bool {
        matches!(
            self.state,
            State::Authenticate { .. } | State::BadMechanism { .. }
        )
    }

    /// Whether the next frame is a bare token (after a v0 handshake), not a request.
    pub fn expects_raw_token(&self) -> bool {
        matches!(
            self.state,
            State::Authenticate { raw: true, .. } | State::BadMechanism { raw: true, .. }
        )
    }

    /// Whether this connection has been re-authenticated at least once.
    pub fn reauthenticating(&self) -> bool {
        self.last_reauthentication.is_some()
    }

    /// A bare token after a v0 handshake; the answer is sent as a bare frame too.
    pub fn raw_token(
        &mut self,
        token: &[u8],
        now: AuthTime,
        scram: impl FnOnce(ScramName<'_>) -> Option<ScramIdentity>,
    ) -> Verdict {
        match self.exchange(token, now, scram) {
            Ok(step) => Verdict::Respond(step.reply),
            Err(failure) => Verdict::Close {
                response: None,
                reason: failure.reason,
            },
        }
    }

    /// Looks at one request: SASL requests are answered here, ApiVersions passes, before
    /// authentication anything else closes the connection, and after the session's end
    /// anything but a re-authentication does (see the type's docs).
    pub fn request(
        &mut self,
        api_key: i16,
        version: i16,
        correlation_id: i32,
        body: &mut bytes::Bytes,
        now: AuthTime,
        scram: impl FnOnce(ScramName<'_>) -> Option<ScramIdentity>,
    ) -> Verdict {
        match self.state {
            State::Authenticated => {
                self.authenticated_request(api_key, version, correlation_id, body, now)
            }
            State::Handshake => match api_key {
                SASL_HANDSHAKE => self.handshake(version, correlation_id, body),
                SASL_AUTHENTICATE => illegal_authenticate(
                    version,
                    correlation_id,
                    body,
                    "SaslAuthenticate without a SaslHandshake v1",
                    true,
                ),
                API_VERSIONS => Verdict::Pass,
                other => close(format!(
                    "request of api key {other} before SASL authentication"
                )),
            },
            State::Authenticate { .. } | State::BadMechanism { .. } => match api_key {
                SASL_AUTHENTICATE => self.authenticate(version, correlation_id, body, now, scram),
                // A client may ask for versions before its first authentication ends, not
                // in the middle of a re-authentication.
                API_VERSIONS if self.session.is_none() => Verdict::Pass,
                SASL_HANDSHAKE => illegal_handshake(
                    version,
                    correlation_id,
                    body,
                    self.config.mechanisms.clone(),
                    true,
                ),
                other => close(format!(
                    "request of api key {other} during SASL authentication"
                )),
            },
        }
    }

    fn authenticated_request(
        &mut self,
        api_key: i16,
        version: i16,
        correlation_id: i32,
        body: &mut bytes::Bytes,
        now: AuthTime,
    ) -> Verdict {
        let Some(session) = &self.session else {
            return close("authenticated without a session".into());
        };
        let expires = session.expires;
        if api_key == SASL_HANDSHAKE
            && expires.is_some()
            && self.last_reauthentication.is_none_or(|t| {
                now.instant.saturating_duration_since(t) >= MIN_REAUTHENTICATION_INTERVAL
            })
        {
            self.last_reauthentication = Some(now.instant);
            return self.handshake(version, correlation_id, body);
        }
        if expires.is_some_and(|end| now.instant > end) {
            return Verdict::Expired;
        }
        match api_key {
            SASL_HANDSHAKE => illegal_handshake(version, correlation_id, body, Vec::new(), false),
            SASL_AUTHENTICATE => illegal_authenticate(
                version,
                correlation_id,
                body,
                "SaslAuthenticate request received after successful authentication",
                false,
            ),
            _ => Verdict::Pass,
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
        let mechanism = request.mechanism;
        let exchange = if !self.config.enabled(&mechanism) {
            None
        } else if mechanism == "PLAIN" {
            Some(Exchange::Plain)
        } else if mechanism == "OAUTHBEARER" {
            Some(Exchange::OAuthBearer { refused: None })
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
        let raw = version == 0;
        self.state = match &self.session {
            Some(session) if session.mechanism != mechanism => State::BadMechanism {
                reason: format!(
                    "SASL mechanism '{mechanism}' requested by client is not supported for \
                     re-authentication of mechanism '{}'",
                    session.mechanism
                ),
                raw,
            },
            _ => State::Authenticate {
                exchange,
                mechanism,
                raw,
            },
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
        now: AuthTime,
        scram: impl FnOnce(ScramName<'_>) -> Option<ScramIdentity>,
    ) -> Verdict {
        if !(0..=2).contains(&version) {
            return close(format!("SaslAuthenticate v{version} is not supported"));
        }
        let request = match SaslAuthenticateRequest::decode(body, version) {
            Ok(r) => r,
            Err(e) => return close(format!("SaslAuthenticate: {e}")),
        };
        if self.expects_raw_token() {
            return illegal_authenticate(
                version,
                correlation_id,
                body,
                "SaslAuthenticate after a SaslHandshake v0",
                true,
            );
        }
        match self.exchange(&request.auth_bytes, now, scram) {
            Ok(step) => {
                let response = SaslAuthenticateResponse {
                    error_code: ErrorCode::NONE.code(),
                    auth_bytes: bytes::Bytes::from(step.reply),
                    session_lifetime_ms: step.session_lifetime_ms,
                    ..Default::default()
                };
                match encode(correlation_id, SASL_AUTHENTICATE, version, &response) {
                    Ok(b) => Verdict::Respond(b),
                    Err(e) => close(e),
                }
            }
            Err(Failure { message, reason }) => {
                if matches!(self.state, State::BadMechanism { .. }) {
                    // Kafka fails a re-authentication with the wrong mechanism without an
                    // answer.
                    return close(reason);
                }
                let response = SaslAuthenticateResponse {
                    error_code: ErrorCode::SASL_AUTHENTICATION_FAILED.code(),
                    error_message: Some(message),
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
    /// On success of the last step the session begins (or is renewed).
    fn exchange(
        &mut self,
        token: &[u8],
        now: AuthTime,
        scram: impl FnOnce(ScramName<'_>) -> Option<ScramIdentity>,
    ) -> Result<Step, Failure> {
        let (exchange, mechanism) = match &mut self.state {
            State::Authenticate {
                exchange,
                mechanism,
                ..
            } => (exchange, mechanism.clone()),
            State::BadMechanism { reason, .. } => {
                return Err(Failure::new(reason.clone(), reason.clone()))
            }
            _ => {
                return Err(Failure::new(
                    "a SASL token outside an exchange",
                    "a SASL token outside an exchange",
                ))
            }
        };
        // (principal, the credential's own expiry in ms since the epoch, reply)
        let mut token_authenticated = false;
        let (user, credential_expiry_ms, reply) = match exchange {
            Exchange::Plain => {
                let (user, password) = parse_plain(token)
                    .ok_or_else(|| Failure::new(FAILED, "malformed PLAIN message"))?;
                if !self.config.check_plain(&user, &password) {
                    return Err(Failure::new(
                        FAILED,
                        format!("PLAIN: invalid credentials for {user:?}"),
                    ));
                }
                (user, None, Vec::new())
            }
            Exchange::Scram(server) => {
                match server.step(token, scram) {
                    Ok(ScramStep::Continue(reply)) => {
                        return Ok(Step {
                            reply,
                            session_lifetime_ms: 0,
                        })
                    }
                    Ok(ScramStep::Done {
                        user,
                        token_owner: None,
                        response,
                    }) => (user, None, response),
                    Ok(ScramStep::Done {
                        user: token_id,
                        token_owner: Some(owner),
                        response,
                    }) => {
                        // Kafka's principal builder makes a token's session its owner's,
                        // `User:` whatever type the owner was named with.
                        let name = owner
                            .principal
                            .split_once(':')
                            .map_or(owner.principal.as_str(), |(_, n)| n)
                            .to_string();
                        if owner.expiry_timestamp_ms < now.unix_ms {
                            return Err(Failure::new(
                                FAILED,
                                format!("SCRAM: delegation token {token_id} has expired"),
                            ));
                        }
                        token_authenticated = true;
                        (name, Some(owner.expiry_timestamp_ms), response)
                    }
                    Err(e) => return Err(Failure::new(FAILED, format!("SCRAM: {e}"))),
                }
            }
            Exchange::OAuthBearer { refused } => {
                if let Some(json) = refused {
                    // The client's answer to our error (normally a lone ^A).
                    return Err(Failure::new(
                        json.clone(),
                        format!("OAUTHBEARER: token refused: {json}"),
                    ));
                }
                let generic = "Authentication failed during authentication due to invalid \
                               credentials with SASL mechanism OAUTHBEARER";
                let initial = ClientInitialResponse::parse(token)
                    .map_err(|e| Failure::new(generic, format!("OAUTHBEARER: {e}")))?;
                let validator = self
                    .config
                    .oauthbearer
                    .as_ref()
                    .ok_or_else(|| Failure::new(generic, "OAUTHBEARER without a validator"))?;
                match validator.validate(&initial.token, now.unix_ms) {
                    Ok(t) => {
                        if !initial.authorization_id.is_empty()
                            && initial.authorization_id != t.principal_name
                        {
                            let m = format!(
                                "Authentication failed: Client requested an authorization id ({}) \
                                 that is different from the token's principal name ({})",
                                initial.authorization_id, t.principal_name
                            );
                            return Err(Failure::new(m.clone(), m));
                        }
                        (t.principal_name, Some(t.lifetime_ms), Vec::new())
                    }
                    Err(rejected) => {
                        tracing::debug!(reason = rejected.reason, "OAUTHBEARER token refused");
                        let json = rejected.json();
                        *refused = Some(json.clone());
                        return Ok(Step {
                            reply: json.into_bytes(),
                            session_lifetime_ms: 0,
                        });
                    }
                }
            }
        };
        let principal = format!("User:{user}");
        if let Some(previous) = &self.session {
            if previous.principal != principal {
                let m = format!(
                    "Cannot change principals during re-authentication from {}: {principal}",
                    previous.principal
                );
                return Err(Failure::new(m.clone(), m));
            }
        }
        let lifetime_ms = self.session_lifetime_ms(&mechanism, credential_expiry_ms, now);
        tracing::debug!(
            user,
            mechanism,
            lifetime_ms,
            reauthentication = self.session.is_some(),
            "authenticated"
        );
        if self.session.is_some() {
            crate::metrics::global()
                .network
                .successful_reauthentications
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.session = Some(AuthSession {
            principal,
            mechanism,
            token_authenticated,
            expires: lifetime_ms
                .map(|ms| now.instant + Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
        });
        self.state = State::Authenticated;
        Ok(Step {
            reply,
            session_lifetime_ms: lifetime_ms.unwrap_or(0),
        })
    }

    /// Kafka's `calcCompletionTimesAndReturnSessionLifetimeMs`: the lesser of the
    /// mechanism's `connections.max.reauth.ms` and the time left to the credential's
    /// expiry, never negative; `None` when neither applies (the session does not end).
    fn session_lifetime_ms(
        &self,
        mechanism: &str,
        credential_expiry_ms: Option<i64>,
        now: AuthTime,
    ) -> Option<i64> {
        let max = self.config.max_reauth_ms(mechanism);
        let left = credential_expiry_ms.map(|exp| exp.saturating_sub(now.unix_ms));
        let lifetime = match (max, left) {
            (None, None) => return None,
            (Some(max), None) => max,
            (None, Some(left)) => left,
            (Some(max), Some(left)) => max.min(left),
        };
        Some(lifetime.max(0))
    }
}

/// ILLEGAL_SASL_STATE for a SaslHandshake: with the connection closed when `fatal`
/// (mid-exchange), kept otherwise (after authentication, as Kafka's `KafkaApis` answers).
fn illegal_handshake(
    version: i16,
    correlation_id: i32,
    body: &mut bytes::Bytes,
    mechanisms: Vec<String>,
    fatal: bool,
) -> Verdict {
    if !(0..=1).contains(&version) || SaslHandshakeRequest::decode(body, version).is_err() {
        return close(format!("SaslHandshake v{version} out of order"));
    }
    let response = SaslHandshakeResponse {
        error_code: ErrorCode::ILLEGAL_SASL_STATE.code(),
        mechanisms,
    };
    answer(
        correlation_id,
        SASL_HANDSHAKE,
        version,
        &response,
        fatal,
        "SaslHandshake out of order",
    )
}

/// ILLEGAL_SASL_STATE for a SaslAuthenticate (see [`illegal_handshake`]).
fn illegal_authenticate(
    version: i16,
    correlation_id: i32,
    body: &mut bytes::Bytes,
    message: &str,
    fatal: bool,
) -> Verdict {
    if !(0..=2).contains(&version) {
        return close(format!("SaslAuthenticate v{version} is not supported"));
    }
    if !body.is_empty() && SaslAuthenticateRequest::decode(body, version).is_err() {
        return close(format!("SaslAuthenticate v{version} out of order"));
    }
    let response = SaslAuthenticateResponse {
        error_code: ErrorCode::ILLEGAL_SASL_STATE.code(),
        error_message: Some(message.into()),
        ..Default::default()
    };
    answer(
        correlation_id,
        SASL_AUTHENTICATE,
        version,
        &response,
        fatal,
        message,
    )
}

fn answer<T: Encodable>(
    correlation_id: i32,
    api_key: i16,
    version: i16,
    response: &T,
    fatal: bool,
    reason: &str,
) -> Verdict {
    match encode(correlation_id, api_key, version, response) {
        Ok(b) if fatal => Verdict::Close {
            response: Some(b),
            reason: reason.into(),
        },
        Ok(b) => Verdict::Respond(b),
        Err(e) => close(e),
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

    fn no_scram(_: ScramName<'_>) -> Option<ScramIdentity> {
        None
    }

    /// A fixed moment: the tests that need time pass later ones of their own.
    fn t0() -> AuthTime {
        AuthTime::now()
    }

    #[test]
    fn before_authentication_only_api_versions_and_sasl_pass() {
        let mut a = authenticator();
        assert_eq!(
            a.request(18, 3, 1, &mut Bytes::new(), t0(), no_scram),
            Verdict::Pass
        );
        for api in [0, 1, 3, 8, 9, 10, 19, 32] {
            assert!(
                matches!(
                    authenticator().request(api, 0, 1, &mut Bytes::new(), t0(), no_scram),
                    Verdict::Close { response: None, .. }
                ),
                "api {api}"
            );
        }
        // SaslAuthenticate before the handshake: ILLEGAL_SASL_STATE, then closed.
        let v = authenticator().request(36, 1, 1, &mut authenticate(b"x", 1), t0(), no_scram);
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
        let Verdict::Respond(r) = a.request(17, 1, 1, &mut handshake("PLAIN", 1), t0(), no_scram)
        else {
            panic!()
        };
        assert_eq!(error_code(&r), 0);
        let v = a.request(
            36,
            2,
            2,
            &mut authenticate(b"\0alice\0alice-secret", 2),
            t0(),
            no_scram,
        );
        assert!(matches!(v, Verdict::Respond(_)), "{v:?}");
        assert_eq!(a.principal(), Some("User:alice"));
        assert_eq!(
            a.request(0, 9, 3, &mut Bytes::new(), t0(), no_scram),
            Verdict::Pass
        );
        // Sessions do not end here, so there is no re-authentication: a second handshake
        // is answered ILLEGAL_SASL_STATE and the connection stays, as in Kafka.
        let v = a.request(17, 1, 4, &mut handshake("PLAIN", 1), t0(), no_scram);
        let Verdict::Respond(r) = v else {
            panic!("{v:?}")
        };
        assert_eq!(error_code(&r), ErrorCode::ILLEGAL_SASL_STATE.code());
        assert_eq!(a.principal(), Some("User:alice"));
    }

    /// `t0()` moved on by `ms`, on both clocks.
    fn later(base: AuthTime, ms: u64) -> AuthTime {
        AuthTime {
            instant: base.instant + Duration::from_millis(ms),
            unix_ms: base.unix_ms + i64::try_from(ms).unwrap_or(0),
        }
    }

    /// PLAIN as `user` at `at`; the SaslAuthenticate v1 answer's error code and session
    /// lifetime, or the verdict when it is no answer.
    fn plain_at(
        a: &mut Authenticator,
        user: &str,
        password: &str,
        at: AuthTime,
    ) -> Result<(i16, i64), Verdict> {
        let v = a.request(17, 1, 1, &mut handshake("PLAIN", 1), at, no_scram);
        if !matches!(v, Verdict::Respond(_)) {
            return Err(v);
        }
        let token = format!("\0{user}\0{password}");
        match a.request(
            36,
            1,
            2,
            &mut authenticate(token.as_bytes(), 1),
            at,
            no_scram,
        ) {
            Verdict::Respond(r) => {
                let mut r = Bytes::from(r[4..].to_vec());
                let decoded = SaslAuthenticateResponse::decode(&mut r, 1).unwrap();
                Ok((decoded.error_code, decoded.session_lifetime_ms))
            }
            other => Err(other),
        }
    }

    fn reauthenticating_authenticator(ms: i64) -> Authenticator {
        Authenticator::new(Arc::new(
            SaslConfig::new(&MECHANISMS, &[("alice", "a"), ("bob", "b")])
                .with_max_reauth_ms("PLAIN", ms),
        ))
    }

    #[test]
    fn a_session_ends_at_its_lifetime_unless_renewed() {
        let start = t0();
        let mut a = reauthenticating_authenticator(1000);
        assert_eq!(plain_at(&mut a, "alice", "a", start), Ok((0, 1000)));
        let fetch =
            |a: &mut Authenticator, at| a.request(1, 12, 9, &mut Bytes::new(), at, no_scram);
        assert_eq!(fetch(&mut a, later(start, 999)), Verdict::Pass);
        // Re-authenticated before the end, the session lasts its lifetime again.
        assert_eq!(
            plain_at(&mut a, "alice", "a", later(start, 800)),
            Ok((0, 1000))
        );
        assert!(a.reauthenticating());
        assert_eq!(fetch(&mut a, later(start, 1500)), Verdict::Pass);
        assert_eq!(fetch(&mut a, later(start, 1801)), Verdict::Expired);
        // A handshake after the end still re-authenticates (Kafka lets a late client in).
        assert_eq!(
            plain_at(&mut a, "alice", "a", later(start, 2500)),
            Ok((0, 1000))
        );
        assert_eq!(fetch(&mut a, later(start, 3000)), Verdict::Pass);
        assert_eq!(a.principal(), Some("User:alice"));
    }

    #[test]
    fn a_reauthentication_keeps_its_principal_and_mechanism() {
        let start = t0();
        let mut a = reauthenticating_authenticator(1000);
        assert_eq!(plain_at(&mut a, "alice", "a", start), Ok((0, 1000)));
        // Another user's credentials fail the connection.
        let v = plain_at(&mut a, "bob", "b", later(start, 500));
        assert!(
            matches!(
                v,
                Err(Verdict::Close {
                    response: Some(_),
                    ..
                })
            ),
            "{v:?}"
        );

        let mut a = reauthenticating_authenticator(1000);
        assert_eq!(plain_at(&mut a, "alice", "a", start), Ok((0, 1000)));
        // Another mechanism: the handshake is answered, its first token fails the
        // connection without an answer.
        let v = a.request(
            17,
            1,
            3,
            &mut handshake("SCRAM-SHA-256", 1),
            later(start, 500),
            no_scram,
        );
        assert!(matches!(v, Verdict::Respond(_)), "{v:?}");
        let v = a.request(
            36,
            1,
            4,
            &mut authenticate(b"n,,n=alice,r=x", 1),
            later(start, 500),
            no_scram,
        );
        assert!(matches!(v, Verdict::Close { response: None, .. }), "{v:?}");
    }

    #[test]
    fn one_reauthentication_a_second_and_no_other_request_in_the_middle() {
        let start = t0();
        let mut a = reauthenticating_authenticator(60_000);
        assert_eq!(plain_at(&mut a, "alice", "a", start), Ok((0, 60_000)));
        assert_eq!(
            plain_at(&mut a, "alice", "a", later(start, 1000)),
            Ok((0, 60_000))
        );
        // Within a second of the last: not a re-authentication, ILLEGAL_SASL_STATE.
        let v = a.request(
            17,
            1,
            5,
            &mut handshake("PLAIN", 1),
            later(start, 1500),
            no_scram,
        );
        let Verdict::Respond(r) = v else {
            panic!("{v:?}")
        };
        assert_eq!(error_code(&r), ErrorCode::ILLEGAL_SASL_STATE.code());
        // A request in the middle of an exchange closes the connection.
        let v = a.request(
            17,
            1,
            6,
            &mut handshake("PLAIN", 1),
            later(start, 2500),
            no_scram,
        );
        assert!(matches!(v, Verdict::Respond(_)), "{v:?}");
        assert!(a.exchanging());
        let v = a.request(0, 9, 7, &mut Bytes::new(), later(start, 2500), no_scram);
        assert!(matches!(v, Verdict::Close { .. }), "{v:?}");
    }

    #[test]
    fn an_oauthbearer_tokens_expiry_bounds_the_session() {
        use base64::Engine;
        let b64 = |v: &serde_json::Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
        };
        let start = t0();
        let now_s = start.unix_ms / 1000;
        let token = format!(
            "{}.{}.",
            b64(&serde_json::json!({"alg": "none"})),
            b64(&serde_json::json!({"sub": "carol", "iat": now_s, "exp": now_s + 5}))
        );
        let validator = crate::network::oauthbearer::OAuthBearerValidator::Unsecured(
            crate::network::oauthbearer::UnsecuredValidator::from_jaas("").unwrap(),
        );
        let config = SaslConfig::new(&["OAUTHBEARER"], &[])
            .with_oauthbearer(validator)
            .with_max_reauth_ms("OAUTHBEARER", 3_600_000);
        let mut a = Authenticator::new(Arc::new(config));
        let v = a.request(17, 1, 1, &mut handshake("OAUTHBEARER", 1), start, no_scram);
        assert!(matches!(v, Verdict::Respond(_)), "{v:?}");
        let initial = format!("n,,\u{1}auth=Bearer {token}\u{1}\u{1}");
        let Verdict::Respond(r) = a.request(
            36,
            1,
            2,
            &mut authenticate(initial.as_bytes(), 1),
            start,
            no_scram,
        ) else {
            panic!()
        };
        let decoded =
            SaslAuthenticateResponse::decode(&mut Bytes::from(r[4..].to_vec()), 1).unwrap();
        assert_eq!(decoded.error_code, 0);
        let lifetime = decoded.session_lifetime_ms;
        assert!((4_000..=5_000).contains(&lifetime), "{lifetime}");
        assert_eq!(a.principal(), Some("User:carol"));
        let fetch =
            |a: &mut Authenticator, at| a.request(1, 12, 9, &mut Bytes::new(), at, no_scram);
        assert_eq!(fetch(&mut a, later(start, 3_000)), Verdict::Pass);
        assert_eq!(fetch(&mut a, later(start, 5_001)), Verdict::Expired);
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
            a.request(17, 1, 1, &mut handshake("PLAIN", 1), t0(), no_scram);
            let v = a.request(36, 1, 2, &mut authenticate(token, 1), t0(), no_scram);
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
        let v = a.request(17, 1, 1, &mut handshake("PLAIN", 1), t0(), no_scram);
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
        let lookup = |n: ScramName<'_>| {
            (n.name == "user" && n.mechanism == m && !n.token)
                .then(|| ScramIdentity::user(credential.clone()))
        };
        let mut a = authenticator();
        assert!(matches!(
            a.request(17, 0, 1, &mut handshake("SCRAM-SHA-256", 0), t0(), no_scram),
            Verdict::Respond(_)
        ));
        assert!(a.expects_raw_token());
        let mut client = Client::new(m, "user", "pencil");
        let Verdict::Respond(first) = a.raw_token(&client.first(), t0(), lookup) else {
            panic!()
        };
        let last = client.final_message(&first);
        let Verdict::Respond(signature) = a.raw_token(&last, t0(), lookup) else {
            panic!()
        };
        assert_eq!(signature, client.server_signature());
        assert_eq!(a.principal(), Some("User:user"));
        assert!(!a.expects_raw_token());
    }

    /// A client with Kafka's `tokenauth=true` extension authenticates as the token's
    /// owner, for no longer than the token lives; an expired token is refused, and the
    /// token's id is no user name.
    #[test]
    fn a_delegation_token_authenticates_as_its_owner_until_it_expires() {
        let m = ScramMechanism::Sha512;
        let credential = stored(m, "hmac-as-base64");
        let owner = |expiry| crate::network::scram::TokenOwner {
            principal: "User:alice".into(),
            expiry_timestamp_ms: expiry,
        };
        let at = t0();
        let run = |expiry: i64, extension: &str| {
            let lookup = |n: ScramName<'_>| {
                (n.name == "tok-1" && n.token).then(|| ScramIdentity {
                    credential: credential.clone(),
                    token_owner: Some(owner(expiry)),
                })
            };
            let mut a = authenticator();
            a.request(17, 1, 1, &mut handshake("SCRAM-SHA-512", 1), at, no_scram);
            let mut client = Client::new(m, "tok-1", "hmac-as-base64");
            let first = client.first_with(extension);
            let Verdict::Respond(r) = a.request(36, 1, 2, &mut authenticate(&first, 1), at, lookup)
            else {
                panic!()
            };
            let r = SaslAuthenticateResponse::decode(&mut Bytes::from(r[4..].to_vec()), 1).unwrap();
            let last = client.final_message(&r.auth_bytes);
            let v = a.request(36, 1, 3, &mut authenticate(&last, 1), at, lookup);
            (a, v)
        };
        let now = at.unix_ms;
        let (a, v) = run(now + 60_000, ",tokenauth=true");
        let Verdict::Respond(r) = v else {
            panic!("{v:?}")
        };
        let r = SaslAuthenticateResponse::decode(&mut Bytes::from(r[4..].to_vec()), 1).unwrap();
        assert_eq!(r.error_code, 0);
        assert_eq!(
            r.session_lifetime_ms, 60_000,
            "the session ends with the token"
        );
        assert_eq!(a.principal(), Some("User:alice"));
        assert!(a.token_authenticated());
        let (a, v) = run(now - 1, ",tokenauth=true");
        assert!(matches!(v, Verdict::Close { .. }), "expired: {v:?}");
        assert_eq!(a.principal(), None);
        // Without the extension the name is looked up as a user, which it is not.
        let (a, v) = run(now + 60_000, "");
        assert!(matches!(v, Verdict::Close { .. }), "{v:?}");
        assert!(!a.token_authenticated());
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
            let lookup = |_: ScramName<'_>| Some(ScramIdentity::user(credential.clone()));
            let mut a = authenticator();
            let mut h = handshake(MECHANISMS[mechanism], 1);
            a.request(17, 1, 0, &mut h, t0(), lookup);
            for (api, version, raw) in steps {
                let mut body = Bytes::from(raw.clone());
                let verdict = if a.expects_raw_token() {
                    a.raw_token(&raw, t0(), lookup)
                } else {
                    a.request(api, version, 1, &mut body, t0(), lookup)
                };
                if let Verdict::Close { .. } = verdict {
                    break;
                }
            }
            proptest::prop_assert_eq!(a.principal(), None);
        }
    }
}
