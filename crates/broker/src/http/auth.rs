//! Who may use the HTTP listener: HTTP Basic authentication against the cluster's own
//! users, and a Host-header check against DNS rebinding.
//!
//! `http.authentication` is `none` or `basic`; unset, it is `basic` when any client
//! listener speaks SASL (`SASL_PLAINTEXT` or `SASL_SSL`), because a node whose Kafka
//! listeners demand credentials should not show its topics, groups and metrics to
//! anyone who can reach port 9644. The users are the ones Kafka clients authenticate
//! as: SCRAM credentials from the metadata image (either mechanism) and the PLAIN users
//! of the SASL listeners' config (`plain.sasl.jaas.config`, `sasl.plain.users.file`).
//!
//! With `http.bearer.tokens.file` (one token a line, `#` comments) set, an
//! `Authorization: Bearer <token>` header of one of its tokens is accepted too, for
//! scrapers and scripts that should not hold a user's password. Tokens are compared as
//! SHA-256 digests in constant time, so that neither a token's bytes nor its length
//! leak through the time of an answer; the file is read once, at start.
//!
//! A SCRAM credential stores no password, only `StoredKey = H(HMAC(SaltedPassword,
//! "Client Key"))` with the salt and the iterations: so the check salts the given
//! password the same way and compares the StoredKey it derives, in constant time.
//! PBKDF2 costs milliseconds by design; it runs on the blocking pool, a few at a time
//! ([`DERIVATIONS_MAX`]), so that requests with wrong passwords cannot take the
//! runtime's workers from the Kafka listeners.
//!
//! A password that checked out is remembered for [`VERIFIED_TTL`] ([`Verified`]): a
//! console page polls every 3 s and a scraper every 15, and each request would otherwise
//! cost a derivation. Only successes are kept, under an HMAC of the user and password with
//! a key made at start (no password is held), and an entry counts only while the user's
//! SCRAM credentials are still the ones it was checked against (a password changed or a
//! user deleted ends it at once); one checked against a PLAIN user is checked again
//! against the PLAIN users, which costs nothing. Wrong passwords are never remembered and
//! pay the derivation every time.
//!
//! `/health/live` and `/health/ready` stay open: orchestrators probe them without
//! credentials (as Redpanda's admin API lets them), and they say nothing but ready or
//! not. A refusal is a 401 with `WWW-Authenticate: Basic realm="rill"` and the same
//! body whatever was wrong, so that it does not tell which users exist.
//!
//! The Host check: a listener bound to a loopback address (the default `127.0.0.1`) is
//! meant for the machine itself, but a web page in the operator's browser can make a
//! name of its own resolve to 127.0.0.1 and then read the console as a same-origin page
//! (DNS rebinding). Such a request carries the attacker's name in `Host`; so a loopback
//! listener answers only requests whose Host is a loopback name or address.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::Semaphore;

use rill_metadata::MetadataImage;

use crate::config::BrokerConfig;
use crate::error::BrokerError;
use crate::network::sasl::SaslConfig;
use crate::network::scram::{ScramCredential, ScramMechanism, MIN_ITERATIONS};
use crate::server::scram_credential;

/// The longest `Authorization` header looked at: a Basic credential of a user name and
/// password of a few hundred bytes each fits many times over; a longer one is refused
/// before it is decoded.
pub const AUTHORIZATION_BYTES_MAX: usize = 4096;

/// How many password derivations (PBKDF2) run at once; more requests wait their turn.
pub const DERIVATIONS_MAX: usize = 4;

/// How long a password that checked out is remembered (see the module docs).
pub const VERIFIED_TTL: Duration = Duration::from_secs(300);

/// How many verified passwords are remembered; past it the oldest half is forgotten.
pub const VERIFIED_MAX: usize = 1024;

/// Passwords that checked out, by an HMAC of user and password under a key of this
/// process: when, and against which credentials.
pub struct Verified {
    key: [u8; 32],
    entries: Mutex<HashMap<[u8; 32], VerifiedEntry>>,
}

#[derive(Clone, Copy)]
struct VerifiedEntry {
    at: Instant,
    /// The digest of the user's SCRAM credentials when checked; `None` when the password
    /// was a PLAIN user's (then the PLAIN users are asked again).
    scram: Option<[u8; 32]>,
}

impl Verified {
    pub fn new() -> Self {
        let mut key = [0u8; 32];
        // Without randomness the key is still unknown to clients (the process's start
        // time and address), and nothing but this process ever sees the digests.
        if getrandom::fill(&mut key).is_err() {
            let seed = format!("{:?}{:p}", Instant::now(), &key);
            key = Sha256::digest(seed.as_bytes()).into();
        }
        Self {
            key,
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn digest(&self, user: &str, password: &str) -> [u8; 32] {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(&(user.len() as u64).to_be_bytes());
        mac.update(user.as_bytes());
        mac.update(password.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// Whether `user` and `password` checked out within the TTL and still would: the
    /// SCRAM credentials are unchanged, or the PLAIN users still accept them.
    pub fn check(
        &self,
        plain: &[Arc<SaslConfig>],
        image: &MetadataImage,
        user: &str,
        password: &str,
        now: Instant,
    ) -> bool {
        let digest = self.digest(user, password);
        let entry = match self.entries.lock() {
            Ok(entries) => entries.get(&digest).copied(),
            Err(_) => None,
        };
        let Some(entry) = entry else { return false };
        if now.saturating_duration_since(entry.at) >= VERIFIED_TTL {
            return false;
        }
        match entry.scram {
            Some(fingerprint) => scram_fingerprint(image, user) == Some(fingerprint),
            None => plain.iter().any(|l| l.check_plain(user, password)),
        }
    }

    /// Remembers a password that checked out (`by_plain`: against a PLAIN user).
    pub fn remember(
        &self,
        image: &MetadataImage,
        user: &str,
        password: &str,
        by_plain: bool,
        now: Instant,
    ) {
        let scram = if by_plain {
            None
        } else {
            match scram_fingerprint(image, user) {
                Some(f) => Some(f),
                None => return,
            }
        };
        let digest = self.digest(user, password);
        if let Ok(mut entries) = self.entries.lock() {
            if entries.len() >= VERIFIED_MAX {
                let mut ages: Vec<Instant> = entries.values().map(|e| e.at).collect();
                ages.sort_unstable();
                let cut = ages[ages.len() / 2];
                entries.retain(|_, e| e.at > cut);
            }
            entries.insert(digest, VerifiedEntry { at: now, scram });
        }
    }
}

impl Default for Verified {
    fn default() -> Self {
        Self::new()
    }
}

/// A digest of `user`'s SCRAM credentials of both mechanisms; `None` without any.
fn scram_fingerprint(image: &MetadataImage, user: &str) -> Option<[u8; 32]> {
    let mut hasher = Sha256::new();
    let mut any = false;
    for mechanism in [ScramMechanism::Sha256, ScramMechanism::Sha512] {
        hasher.update([mechanism as u8]);
        if let Some(c) = scram_credential(image, user, mechanism) {
            any = true;
            hasher.update(c.iterations.to_be_bytes());
            hasher.update((c.salt.len() as u64).to_be_bytes());
            hasher.update(&c.salt);
            hasher.update(&c.stored_key);
            hasher.update(&c.server_key);
        }
    }
    any.then(|| hasher.finalize().into())
}

/// `http.authentication`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authentication {
    None,
    Basic,
}

impl std::fmt::Display for Authentication {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Authentication::None => "none",
            Authentication::Basic => "basic",
        })
    }
}

/// Where SCRAM credentials are looked up: the image of the node serving the request.
pub type ScramLookup = Arc<dyn Fn() -> Arc<MetadataImage> + Send + Sync>;

/// The listener's settings and what its checks need.
#[derive(Clone)]
pub struct HttpAuth {
    pub authentication: Authentication,
    /// Why `authentication` is what it is, for the start-up log line.
    pub reason: &'static str,
    /// PLAIN users of every SASL client listener (each listener may have its own).
    plain: Vec<Arc<SaslConfig>>,
    /// SHA-256 digests of `http.bearer.tokens.file`'s tokens.
    bearer_tokens: Arc<Vec<[u8; 32]>>,
    /// Set when the listener is bound to a loopback address (see the module docs).
    loopback_only: bool,
    derivations: Arc<Semaphore>,
    verified: Arc<Verified>,
}

impl std::fmt::Debug for HttpAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpAuth")
            .field("authentication", &self.authentication)
            .field("plain", &self.plain)
            .field("bearer_tokens", &self.bearer_tokens.len())
            .field("loopback_only", &self.loopback_only)
            .finish_non_exhaustive()
    }
}

impl HttpAuth {
    /// Reads `http.authentication` and the SASL listeners' PLAIN users. A controller-only
    /// node has no client listener: it gets the PLAIN users of the unscoped keys.
    pub fn from_config(config: &BrokerConfig) -> Result<Self, BrokerError> {
        let sasl_listeners: Vec<String> = match config.client_listeners() {
            Ok(listeners) => listeners
                .into_iter()
                .filter(|l| l.protocol.uses_sasl())
                .map(|l| l.name)
                .collect(),
            Err(_) => Vec::new(),
        };
        let (authentication, reason) = match config
            .get("http.authentication")
            .map(|v| v.trim().to_ascii_lowercase())
            .filter(|v| !v.is_empty())
            .as_deref()
        {
            Some("none") => (Authentication::None, "http.authentication"),
            Some("basic") => (Authentication::Basic, "http.authentication"),
            Some(other) => {
                return Err(BrokerError::Config(format!(
                    "http.authentication: invalid value {other:?}: none or basic"
                )))
            }
            None if sasl_listeners.is_empty() => {
                (Authentication::None, "no client listener uses SASL")
            }
            None => (Authentication::Basic, "a client listener uses SASL"),
        };
        let mut plain = Vec::new();
        if authentication == Authentication::Basic {
            if sasl_listeners.is_empty() {
                plain.push(Arc::new(SaslConfig::from_config(config, "")?));
            }
            for name in &sasl_listeners {
                plain.push(Arc::new(SaslConfig::from_config(config, name)?));
            }
        }
        let bearer_tokens = match config
            .get("http.bearer.tokens.file")
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    BrokerError::Config(format!("http.bearer.tokens.file: {path}: {e}"))
                })?;
                bearer_tokens(&text)
            }
            None => Vec::new(),
        };
        Ok(Self {
            authentication,
            reason,
            plain,
            bearer_tokens: Arc::new(bearer_tokens),
            loopback_only: false,
            derivations: Arc::new(Semaphore::new(DERIVATIONS_MAX)),
            verified: Arc::new(Verified::new()),
        })
    }

    /// Turns the Host check on when the listener is bound to a loopback address.
    pub fn bound_to(mut self, local: SocketAddr) -> Self {
        self.loopback_only = local.ip().is_loopback();
        self
    }
}

/// What the middleware needs: the settings and where the SCRAM credentials are.
#[derive(Clone)]
pub struct Guard {
    pub auth: HttpAuth,
    pub image: ScramLookup,
}

/// The middleware in front of every route (see the module docs).
pub async fn guard(State(guard): State<Guard>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    if path == "/health/live" || path == "/health/ready" {
        return next.run(request).await;
    }
    if guard.auth.loopback_only && !host_is_loopback(request.headers()) {
        return (
            StatusCode::FORBIDDEN,
            "this listener is bound to a loopback address and answers requests for \
             localhost only (the Host header names another host)\n",
        )
            .into_response();
    }
    if guard.auth.authentication == Authentication::None {
        return next.run(request).await;
    }
    if let Some(token) = bearer_token(request.headers()) {
        return if check_bearer(&guard.auth.bearer_tokens, token) {
            next.run(request).await
        } else {
            unauthorized()
        };
    }
    let Some((user, password)) = basic_credentials(request.headers()) else {
        return unauthorized();
    };
    let image = (guard.image)();
    let verified = guard.auth.verified.clone();
    if verified.check(&guard.auth.plain, &image, &user, &password, Instant::now()) {
        return next.run(request).await;
    }
    // Bounded, and off the runtime's workers: see the module docs.
    let Ok(_permit) = guard.auth.derivations.clone().acquire_owned().await else {
        return unauthorized();
    };
    let plain = guard.auth.plain.clone();
    let checked = tokio::task::spawn_blocking(move || {
        let outcome = verify_password(&plain, Some(&image), &user, &password);
        if outcome.plain || outcome.scram {
            verified.remember(&image, &user, &password, !outcome.scram, Instant::now());
        }
        outcome.plain || outcome.scram
    })
    .await;
    match checked {
        Ok(true) => next.run(request).await,
        _ => unauthorized(),
    }
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"rill\", charset=\"UTF-8\""),
        )],
        "authentication required\n",
    )
        .into_response()
}

/// The user and password of an `Authorization: Basic` header; `None` when it is
/// missing, too long, of another scheme or not `base64(user:password)` in UTF-8.
pub fn basic_credentials(headers: &HeaderMap) -> Option<(String, String)> {
    let value = headers.get(header::AUTHORIZATION)?;
    if value.len() > AUTHORIZATION_BYTES_MAX {
        return None;
    }
    let value = value.to_str().ok()?.trim();
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, password) = decoded.split_once(':')?;
    if user.is_empty() {
        return None;
    }
    Some((user.to_string(), password.to_string()))
}

/// The digests of the tokens of a `http.bearer.tokens.file` (one a line; blank lines
/// and `#` comments skipped).
pub fn bearer_tokens(text: &str) -> Vec<[u8; 32]> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|t| Sha256::digest(t.as_bytes()).into())
        .collect()
}

/// The token of an `Authorization: Bearer` header (bounded like Basic's).
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?;
    if value.len() > AUTHORIZATION_BYTES_MAX {
        return None;
    }
    let (scheme, token) = value.to_str().ok()?.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
        .filter(|t| !t.is_empty())
}

/// Whether `token` is one of `tokens` (digests): every one is compared, in constant time.
pub fn check_bearer(tokens: &[[u8; 32]], token: &str) -> bool {
    let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
    let mut ok = subtle::Choice::from(0);
    for t in tokens {
        ok |= t.ct_eq(&digest);
    }
    bool::from(ok)
}

/// Whether `password` is `user`'s: a PLAIN user of any SASL listener, or a SCRAM
/// credential of either mechanism in `image`.
pub fn check_password(
    plain: &[Arc<SaslConfig>],
    image: Option<&MetadataImage>,
    user: &str,
    password: &str,
) -> bool {
    let outcome = verify_password(plain, image, user, password);
    outcome.plain || outcome.scram
}

/// Which of a user's credentials a password matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PasswordCheck {
    /// A PLAIN user of some SASL listener.
    pub plain: bool,
    /// A SCRAM credential of either mechanism.
    pub scram: bool,
}

/// [`check_password`], saying which credentials matched.
pub fn verify_password(
    plain: &[Arc<SaslConfig>],
    image: Option<&MetadataImage>,
    user: &str,
    password: &str,
) -> PasswordCheck {
    // Every listener is asked, so that the time does not depend on which one knows the
    // user.
    let mut plain_ok = false;
    for listener in plain {
        plain_ok |= listener.check_plain(user, password);
    }
    let mut scram_ok = false;
    let mut derived = false;
    if let Some(image) = image {
        for mechanism in [ScramMechanism::Sha256, ScramMechanism::Sha512] {
            if let Some(stored) = scram_credential(image, user, mechanism) {
                derived = true;
                scram_ok |= check_scram(mechanism, &stored, password);
            }
        }
    }
    if !derived {
        // An unknown SCRAM user costs one derivation too, so that the answer's time does
        // not say which users have credentials.
        let _ = ScramMechanism::Sha256.salted_password(
            password.as_bytes(),
            b"rill-http-no-such-user",
            MIN_ITERATIONS.unsigned_abs(),
        );
    }
    PasswordCheck {
        plain: plain_ok,
        scram: scram_ok,
    }
}

/// Salts `password` as the stored credential was salted and compares the StoredKey.
pub fn check_scram(mechanism: ScramMechanism, stored: &ScramCredential, password: &str) -> bool {
    // The image only holds what the controller accepted (4096..=16384); a negative or
    // zero count is a corrupt record, not a reason to derive for ever.
    let Ok(iterations) = u32::try_from(stored.iterations) else {
        return false;
    };
    if iterations == 0 {
        return false;
    }
    let salted = mechanism.salted_password(password.as_bytes(), &stored.salt, iterations);
    let derived = mechanism.credential(&stored.salt, &salted, stored.iterations);
    bool::from(derived.stored_key.ct_eq(&stored.stored_key))
}

/// Whether the request's Host is `localhost` or a loopback address (with any port). A
/// request without Host (HTTP/1.0) passes: a browser always sends one.
pub fn host_is_loopback(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST) else {
        return true;
    };
    let Ok(host) = host.to_str() else {
        return false;
    };
    let host = host.trim();
    let name = if let Some(rest) = host.strip_prefix('[') {
        // `[::1]` or `[::1]:9644`.
        match rest.split_once(']') {
            Some((inner, _)) => inner,
            None => return false,
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            Some(_) => return false,
            None => host,
        }
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.eq_ignore_ascii_case("localhost") {
        return true;
    }
    name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain_config(users: &[(&str, &str)]) -> Arc<SaslConfig> {
        Arc::new(SaslConfig::new(&["PLAIN"], users))
    }

    fn basic(raw: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        let value = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(raw)
        );
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&value).unwrap(),
        );
        h
    }

    fn image_with(user: &str, mechanism: ScramMechanism, password: &str) -> MetadataImage {
        let salt = b"0123456789abcdef";
        let iterations = 4096;
        let salted = mechanism.salted_password(password.as_bytes(), salt, iterations);
        let c = mechanism.credential(salt, &salted, iterations as i32);
        let mut image = MetadataImage::default();
        image.scram_credentials.insert(
            (user.to_string(), mechanism.kafka_type()),
            rill_metadata::ScramCredentialImage {
                salt: c.salt.into(),
                stored_key: c.stored_key.into(),
                server_key: c.server_key.into(),
                iterations: c.iterations,
            },
        );
        image
    }

    #[test]
    fn scram_users_of_either_mechanism_are_checked() {
        for mechanism in [ScramMechanism::Sha256, ScramMechanism::Sha512] {
            let image = image_with("alice", mechanism, "alice-secret");
            assert!(check_password(&[], Some(&image), "alice", "alice-secret"));
            assert!(!check_password(&[], Some(&image), "alice", "alice-secreT"));
            assert!(!check_password(&[], Some(&image), "alice", ""));
            assert!(!check_password(&[], Some(&image), "bob", "alice-secret"));
        }
    }

    /// What the guard does: the cache first, then a derivation whose success is kept.
    fn guarded(
        verified: &Verified,
        plain: &[Arc<SaslConfig>],
        image: &MetadataImage,
        user: &str,
        password: &str,
        now: Instant,
    ) -> (bool, bool) {
        if verified.check(plain, image, user, password, now) {
            return (true, true);
        }
        let outcome = verify_password(plain, Some(image), user, password);
        if outcome.plain || outcome.scram {
            verified.remember(image, user, password, !outcome.scram, now);
        }
        (outcome.plain || outcome.scram, false)
    }

    #[test]
    fn a_verified_password_is_remembered_until_its_credential_changes_or_it_expires() {
        let verified = Verified::new();
        let t0 = Instant::now();
        let image = image_with("alice", ScramMechanism::Sha256, "alice-secret");
        assert_eq!(
            guarded(&verified, &[], &image, "alice", "alice-secret", t0),
            (true, false)
        );
        assert_eq!(
            guarded(&verified, &[], &image, "alice", "alice-secret", t0),
            (true, true)
        );
        // Another password, or another user with the same one, is not a hit.
        assert!(!verified.check(&[], &image, "alice", "alice-secreT", t0));
        assert!(!verified.check(&[], &image, "bob", "alice-secret", t0));
        // Wrong passwords are never remembered.
        assert_eq!(
            guarded(&verified, &[], &image, "alice", "wrong", t0),
            (false, false)
        );
        assert!(!verified.check(&[], &image, "alice", "wrong", t0));
        // A changed password ends the entry at once; so does a deleted user.
        let changed = image_with("alice", ScramMechanism::Sha256, "new-secret");
        assert!(!verified.check(&[], &changed, "alice", "alice-secret", t0));
        assert_eq!(
            guarded(&verified, &[], &changed, "alice", "alice-secret", t0),
            (false, false)
        );
        assert!(!verified.check(&[], &MetadataImage::default(), "alice", "alice-secret", t0));
        // And time does.
        assert!(verified.check(&[], &image, "alice", "alice-secret", t0 + VERIFIED_TTL / 2));
        assert!(!verified.check(&[], &image, "alice", "alice-secret", t0 + VERIFIED_TTL));
    }

    #[test]
    fn a_remembered_plain_password_is_checked_against_the_plain_users_again() {
        let verified = Verified::new();
        let t0 = Instant::now();
        let image = MetadataImage::default();
        let plain = [plain_config(&[("admin", "admin-secret")])];
        assert_eq!(
            guarded(&verified, &plain, &image, "admin", "admin-secret", t0),
            (true, false)
        );
        assert_eq!(
            guarded(&verified, &plain, &image, "admin", "admin-secret", t0),
            (true, true)
        );
        let changed = [plain_config(&[("admin", "rotated")])];
        assert!(!verified.check(&changed, &image, "admin", "admin-secret", t0));
    }

    #[test]
    fn the_cache_is_bounded() {
        let verified = Verified::new();
        let t0 = Instant::now();
        for i in 0..(VERIFIED_MAX as u64 * 3) {
            verified.remember(
                &MetadataImage::default(),
                &format!("user-{i}"),
                "x",
                true,
                t0 + Duration::from_millis(i),
            );
        }
        let len = verified
            .entries
            .lock()
            .map(|e| e.len())
            .unwrap_or(usize::MAX);
        assert!(len <= VERIFIED_MAX, "{len} entries");
        // The newest are kept.
        let newest = format!("user-{}", VERIFIED_MAX as u64 * 3 - 1);
        assert!(verified
            .entries
            .lock()
            .unwrap()
            .contains_key(&verified.digest(&newest, "x")));
    }

    #[test]
    fn plain_users_are_checked() {
        let plain = [plain_config(&[("bob", "bob-secret")])];
        assert!(check_password(&plain, None, "bob", "bob-secret"));
        assert!(!check_password(&plain, None, "bob", "bob-secret "));
        assert!(!check_password(&plain, None, "carol", "bob-secret"));
        // A PLAIN user and a SCRAM user side by side.
        let image = image_with("alice", ScramMechanism::Sha256, "a");
        assert!(check_password(&plain, Some(&image), "bob", "bob-secret"));
        assert!(check_password(&plain, Some(&image), "alice", "a"));
        assert!(!check_password(&plain, Some(&image), "alice", "bob-secret"));
    }

    #[test]
    fn a_corrupt_iteration_count_fails_the_check() {
        let mut c = ScramMechanism::Sha256.credential(b"salt", b"x", 4096);
        c.iterations = -1;
        assert!(!check_scram(ScramMechanism::Sha256, &c, "x"));
        c.iterations = 0;
        assert!(!check_scram(ScramMechanism::Sha256, &c, "x"));
    }

    #[test]
    fn basic_headers_are_parsed_and_malformed_ones_refused() {
        assert_eq!(
            basic_credentials(&basic("alice:pa:ss")),
            Some(("alice".into(), "pa:ss".into()))
        );
        assert_eq!(
            basic_credentials(&basic("alice:")),
            Some(("alice".into(), String::new()))
        );
        assert_eq!(basic_credentials(&basic("no-colon")), None);
        assert_eq!(basic_credentials(&basic(":password")), None);
        assert_eq!(basic_credentials(&HeaderMap::new()), None);
        let mut h = HeaderMap::new();
        for bad in [
            "Bearer abc",
            "Basic !!!not-base64!!!",
            "Basic",
            "Basic /w==", // 0xff: not UTF-8
        ] {
            h.insert(header::AUTHORIZATION, HeaderValue::from_static(bad));
            assert_eq!(basic_credentials(&h), None, "{bad}");
        }
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bAsIc YWxpY2U6eA=="),
        );
        assert_eq!(basic_credentials(&h), Some(("alice".into(), "x".into())));
        let long = format!("alice:{}", "x".repeat(AUTHORIZATION_BYTES_MAX));
        assert_eq!(basic_credentials(&basic(&long)), None);
    }

    #[test]
    fn bearer_tokens_are_checked() {
        let tokens = bearer_tokens("# scrapers\n  tok-en-1 \n\ntok-en-2\n");
        assert_eq!(tokens.len(), 2);
        assert!(check_bearer(&tokens, "tok-en-1"));
        assert!(check_bearer(&tokens, "tok-en-2"));
        assert!(!check_bearer(&tokens, "tok-en-3"));
        assert!(!check_bearer(&tokens, "tok-en-"));
        assert!(!check_bearer(&tokens, "# scrapers"));
        assert!(!check_bearer(&[], "tok-en-1"));
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer  abc "),
        );
        assert_eq!(bearer_token(&h), Some("abc"));
        for bad in ["Bearer", "Bearer  ", "Basic abc", "Token abc"] {
            h.insert(header::AUTHORIZATION, HeaderValue::from_static(bad));
            assert_eq!(bearer_token(&h), None, "{bad}");
        }
    }

    #[test]
    fn loopback_hosts_are_told_from_others() {
        let host = |h: &'static str| {
            let mut m = HeaderMap::new();
            m.insert(header::HOST, HeaderValue::from_static(h));
            host_is_loopback(&m)
        };
        for ok in [
            "localhost",
            "LOCALHOST:9644",
            "localhost.",
            "127.0.0.1",
            "127.1.2.3:80",
            "[::1]",
            "[::1]:9644",
        ] {
            assert!(host(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:9644",
            "localhost.evil.example",
            "10.0.0.1:9644",
            "[::2]:1",
            "127.0.0.1:x",
            "[::1",
        ] {
            assert!(!host(bad), "{bad}");
        }
        assert!(host_is_loopback(&HeaderMap::new()));
    }

    #[test]
    fn the_default_follows_the_client_listeners() {
        let mut c = BrokerConfig::default();
        c.set("listeners", "PLAINTEXT://127.0.0.1:0");
        assert_eq!(
            HttpAuth::from_config(&c).unwrap().authentication,
            Authentication::None
        );
        c.set(
            "listeners",
            "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        );
        assert_eq!(
            HttpAuth::from_config(&c).unwrap().authentication,
            Authentication::Basic
        );
        c.set("http.authentication", "none");
        assert_eq!(
            HttpAuth::from_config(&c).unwrap().authentication,
            Authentication::None
        );
        c.set("http.authentication", "digest");
        assert!(HttpAuth::from_config(&c).is_err());
    }
}
