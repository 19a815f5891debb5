//! SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka's SASL server speaks
//! them: the server's side of the exchange, and the credential that is stored for a user
//! (salt, StoredKey, ServerKey, iterations; never the password, nor the salted password).
//!
//! The exchange: client-first `n,,n=<user>,r=<cnonce>`, server-first
//! `r=<cnonce><snonce>,s=<salt>,i=<iterations>`, client-final
//! `c=biws,r=<nonce>,p=<proof>`, server-final `v=<signature>`. The proof is checked by
//! recomputing StoredKey from it, compared in constant time (`subtle`). An unknown user
//! gets a server-first from a made-up credential and fails at the proof, like a wrong
//! password, so that the exchange does not say which users exist.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha512};
use subtle::ConstantTimeEq;

/// Kafka's bounds on SCRAM iterations (`ScramMechanism.minIterations`, and the maximum
/// AlterUserScramCredentials accepts).
pub const MIN_ITERATIONS: i32 = 4096;
pub const MAX_ITERATIONS: i32 = 16384;

/// A SCRAM mechanism, with Kafka's type ids (`ScramMechanism` in the admin APIs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScramMechanism {
    Sha256,
    Sha512,
}

impl ScramMechanism {
    pub const ALL: [ScramMechanism; 2] = [ScramMechanism::Sha256, ScramMechanism::Sha512];

    /// The mechanism's type in DescribeUserScramCredentials, AlterUserScramCredentials and
    /// `UserScramCredentialRecord`.
    pub fn kafka_type(self) -> i8 {
        match self {
            ScramMechanism::Sha256 => 1,
            ScramMechanism::Sha512 => 2,
        }
    }

    pub fn from_kafka_type(t: i8) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.kafka_type() == t)
    }

    /// The SASL mechanism name.
    pub fn name(self) -> &'static str {
        match self {
            ScramMechanism::Sha256 => "SCRAM-SHA-256",
            ScramMechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        // HMAC takes keys of any length; `new_from_slice` cannot fail for it.
        match self {
            ScramMechanism::Sha256 => match Hmac::<Sha256>::new_from_slice(key) {
                Ok(mut m) => {
                    m.update(data);
                    m.finalize().into_bytes().to_vec()
                }
                Err(_) => Vec::new(),
            },
            ScramMechanism::Sha512 => match Hmac::<Sha512>::new_from_slice(key) {
                Ok(mut m) => {
                    m.update(data);
                    m.finalize().into_bytes().to_vec()
                }
                Err(_) => Vec::new(),
            },
        }
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            ScramMechanism::Sha256 => Sha256::digest(data).to_vec(),
            ScramMechanism::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    /// `Hi(password, salt, iterations)`: PBKDF2 with this mechanism's HMAC.
    pub fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        match self {
            ScramMechanism::Sha256 => {
                let mut out = [0u8; 32];
                pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out);
                out.to_vec()
            }
            ScramMechanism::Sha512 => {
                let mut out = [0u8; 64];
                pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out);
                out.to_vec()
            }
        }
    }

    /// The stored credential for a salted password (what AlterUserScramCredentials
    /// carries; Kafka's client salts the password itself).
    pub fn credential(
        self,
        salt: &[u8],
        salted_password: &[u8],
        iterations: i32,
    ) -> ScramCredential {
        let client_key = self.hmac(salted_password, b"Client Key");
        ScramCredential {
            salt: salt.to_vec(),
            stored_key: self.hash(&client_key),
            server_key: self.hmac(salted_password, b"Server Key"),
            iterations,
        }
    }
}

/// A user's stored SCRAM credential for one mechanism, from a metadata image (the
/// listeners' and the controller listener's lookup).
pub fn image_credential(
    image: &rill_metadata::MetadataImage,
    user: &str,
    mechanism: ScramMechanism,
) -> Option<ScramCredential> {
    let c = image
        .scram_credentials
        .get(&(user.to_string(), mechanism.kafka_type()))?;
    Some(ScramCredential {
        salt: c.salt.to_vec(),
        stored_key: c.stored_key.to_vec(),
        server_key: c.server_key.to_vec(),
        iterations: c.iterations,
    })
}

/// What is stored of a user's password for one mechanism.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramCredential {
    pub salt: Vec<u8>,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
    pub iterations: i32,
}

impl std::fmt::Debug for ScramCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramCredential")
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

/// What an exchange asks its credential store for: the user name of client-first, and
/// whether the client sent Kafka's `tokenauth=true` extension, which makes the name a
/// delegation token's id (KIP-48).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScramName<'a> {
    pub name: &'a str,
    pub mechanism: ScramMechanism,
    pub token: bool,
}

/// What the store answers: the credential to check the proof against, and for a
/// delegation token, whom it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScramIdentity {
    pub credential: ScramCredential,
    pub token_owner: Option<TokenOwner>,
}

impl ScramIdentity {
    /// A user's own credential.
    pub fn user(credential: ScramCredential) -> Self {
        Self {
            credential,
            token_owner: None,
        }
    }
}

/// The owner of the delegation token an exchange authenticated with, and when the token
/// expires (which ends the session, as an OAUTHBEARER token's `exp` does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenOwner {
    /// The owner's principal (`User:alice`): the session's principal.
    pub principal: String,
    pub expiry_timestamp_ms: i64,
}

/// Random bytes from the operating system, base64 (no `,`, so safe in SCRAM messages).
pub fn random_base64(len: usize) -> Result<String, String> {
    let mut bytes = vec![0u8; len];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness: {e}"))?;
    Ok(BASE64.encode(bytes))
}

/// Random bytes from the operating system.
pub fn random_bytes(len: usize) -> Result<Vec<u8>, String> {
    let mut bytes = vec![0u8; len];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness: {e}"))?;
    Ok(bytes)
}

/// Why an exchange failed. The client is told only "authentication failed"; the
/// reason is for the server's log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScramError {
    #[error("malformed {0}")]
    Malformed(&'static str),
    #[error("channel binding is not supported")]
    ChannelBinding,
    #[error("the nonce of client-final is not the nonce of server-first")]
    NonceMismatch,
    #[error("invalid credentials")]
    InvalidCredentials,
    #[error("the server's signature is wrong: the peer does not know the credential")]
    ServerSignature,
    #[error("the exchange is over")]
    Finished,
    #[error("{0}")]
    Internal(String),
}

enum State {
    ClientFirst,
    ClientFinal(Box<Pending>),
    Finished,
}

/// What the server remembers between server-first and client-final.
struct Pending {
    user: String,
    credential: ScramCredential,
    token_owner: Option<TokenOwner>,
    known: bool,
    gs2_header: String,
    client_first_bare: String,
    server_first: String,
    nonce: String,
}

/// One step of an exchange.
#[derive(Debug, PartialEq, Eq)]
pub enum ScramStep {
    /// Send this and wait for the client's next message.
    Continue(Vec<u8>),
    /// Authenticated as `user` (for a delegation token, its id, and `token_owner` says
    /// whose it is); send this last message.
    Done {
        user: String,
        token_owner: Option<TokenOwner>,
        response: Vec<u8>,
    },
}

/// The server side of one SCRAM exchange.
pub struct ScramServer {
    mechanism: ScramMechanism,
    state: State,
}

impl ScramServer {
    pub fn new(mechanism: ScramMechanism) -> Self {
        Self {
            mechanism,
            state: State::ClientFirst,
        }
    }

    pub fn mechanism(&self) -> ScramMechanism {
        self.mechanism
    }

    /// Takes the client's next message; `lookup` finds the stored credential of the
    /// name client-first gives, for this mechanism.
    pub fn step(
        &mut self,
        message: &[u8],
        lookup: impl FnOnce(ScramName<'_>) -> Option<ScramIdentity>,
    ) -> Result<ScramStep, ScramError> {
        let message = std::str::from_utf8(message).map_err(|_| ScramError::Malformed("message"))?;
        match std::mem::replace(&mut self.state, State::Finished) {
            State::ClientFirst => self.client_first(message, lookup),
            State::ClientFinal(pending) => {
                let Pending {
                    user,
                    credential,
                    token_owner,
                    known,
                    gs2_header,
                    client_first_bare,
                    server_first,
                    nonce,
                } = *pending;
                let final_without_proof;
                let proof;
                {
                    let (without, p) = message
                        .rsplit_once(",p=")
                        .ok_or(ScramError::Malformed("client-final"))?;
                    final_without_proof = without.to_string();
                    proof = BASE64
                        .decode(p)
                        .map_err(|_| ScramError::Malformed("client proof"))?;
                }
                let mut attrs = final_without_proof.split(',');
                let channel = attrs
                    .next()
                    .and_then(|a| a.strip_prefix("c="))
                    .ok_or(ScramError::Malformed("channel binding"))?;
                let channel = BASE64
                    .decode(channel)
                    .map_err(|_| ScramError::Malformed("channel binding"))?;
                if channel != gs2_header.as_bytes() {
                    return Err(ScramError::ChannelBinding);
                }
                let client_nonce = attrs
                    .next()
                    .and_then(|a| a.strip_prefix("r="))
                    .ok_or(ScramError::Malformed("client-final nonce"))?;
                if !bool::from(client_nonce.as_bytes().ct_eq(nonce.as_bytes())) {
                    return Err(ScramError::NonceMismatch);
                }
                let auth_message =
                    format!("{client_first_bare},{server_first},{final_without_proof}");
                let m = self.mechanism;
                let signature = m.hmac(&credential.stored_key, auth_message.as_bytes());
                if proof.len() != signature.len() {
                    return Err(ScramError::InvalidCredentials);
                }
                let client_key: Vec<u8> =
                    proof.iter().zip(&signature).map(|(a, b)| a ^ b).collect();
                let matches = m.hash(&client_key).ct_eq(&credential.stored_key);
                if !bool::from(matches) || !known {
                    return Err(ScramError::InvalidCredentials);
                }
                let server_signature = m.hmac(&credential.server_key, auth_message.as_bytes());
                Ok(ScramStep::Done {
                    user,
                    token_owner,
                    response: format!("v={}", BASE64.encode(server_signature)).into_bytes(),
                })
            }
            State::Finished => Err(ScramError::Finished),
        }
    }

    fn client_first(
        &mut self,
        message: &str,
        lookup: impl FnOnce(ScramName<'_>) -> Option<ScramIdentity>,
    ) -> Result<ScramStep, ScramError> {
        // gs2-header: "n," or "y," (no channel binding), then an optional authzid.
        let mut parts = message.splitn(3, ',');
        let cbind = parts.next().ok_or(ScramError::Malformed("gs2 header"))?;
        let authzid = parts.next().ok_or(ScramError::Malformed("gs2 header"))?;
        let bare = parts.next().ok_or(ScramError::Malformed("client-first"))?;
        match cbind {
            "n" | "y" => {}
            c if c.starts_with("p=") => return Err(ScramError::ChannelBinding),
            _ => return Err(ScramError::Malformed("gs2 header")),
        }
        let mut user = None;
        let mut client_nonce = None;
        let mut token = false;
        for attr in bare.split(',') {
            match attr.split_once('=') {
                Some(("n", v)) => user = Some(decode_saslname(v)?),
                Some(("r", v)) => client_nonce = Some(v),
                Some(("m", _)) => return Err(ScramError::Malformed("mandatory extension")),
                // Kafka's one extension (`ScramLoginModule.TOKEN_AUTH_CONFIG`), read as its
                // `ScramExtensions.tokenAuthenticated` reads it.
                Some(("tokenauth", v)) => token = v.eq_ignore_ascii_case("true"),
                // Other extensions are ignored, as Kafka ignores them.
                Some(_) => {}
                None => return Err(ScramError::Malformed("client-first attribute")),
            }
        }
        let user = user.ok_or(ScramError::Malformed("client-first without a user"))?;
        let client_nonce =
            client_nonce.ok_or(ScramError::Malformed("client-first without a nonce"))?;
        if client_nonce.is_empty() || !client_nonce.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            return Err(ScramError::Malformed("client nonce"));
        }
        if let Some(a) = authzid.strip_prefix("a=") {
            if decode_saslname(a)? != user {
                return Err(ScramError::InvalidCredentials);
            }
        } else if !authzid.is_empty() {
            return Err(ScramError::Malformed("authzid"));
        }
        let found = lookup(ScramName {
            name: &user,
            mechanism: self.mechanism,
            token,
        });
        let (credential, token_owner, known) = match found {
            Some(identity) => (identity.credential, identity.token_owner, true),
            None => {
                // A made-up credential, so that the client learns only at the end.
                let salt = random_bytes(32).map_err(ScramError::Internal)?;
                let fake = random_bytes(32).map_err(ScramError::Internal)?;
                (
                    self.mechanism.credential(&salt, &fake, MIN_ITERATIONS),
                    None,
                    false,
                )
            }
        };
        let nonce = format!(
            "{client_nonce}{}",
            random_base64(24).map_err(ScramError::Internal)?
        );
        let server_first = format!(
            "r={nonce},s={},i={}",
            BASE64.encode(&credential.salt),
            credential.iterations
        );
        let response = server_first.clone().into_bytes();
        self.state = State::ClientFinal(Box::new(Pending {
            user,
            credential,
            token_owner,
            known,
            gs2_header: format!("{cbind},{authzid},"),
            client_first_bare: bare.to_string(),
            server_first,
            nonce,
        }));
        Ok(ScramStep::Continue(response))
    }
}

/// The client side of one exchange, as a broker speaks it to another over the
/// inter-broker listener (see `network::inter_broker`). RFC 5802's steps: client-first
/// with a fresh nonce, client-final with the proof once server-first gave the salt and
/// iterations, then server-final's signature checked, so that a peer that does not know
/// the credential is not believed either.
pub struct ScramClient {
    mechanism: ScramMechanism,
    user: String,
    password: String,
    client_nonce: String,
    client_first_bare: String,
    /// After client-final: `ServerSignature` to expect.
    server_signature: Option<Vec<u8>>,
}

impl std::fmt::Debug for ScramClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramClient")
            .field("mechanism", &self.mechanism)
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl ScramClient {
    pub fn new(mechanism: ScramMechanism, user: &str, password: &str) -> Result<Self, ScramError> {
        let client_nonce = random_base64(24).map_err(ScramError::Internal)?;
        Ok(Self::with_nonce(mechanism, user, password, client_nonce))
    }

    fn with_nonce(mechanism: ScramMechanism, user: &str, password: &str, nonce: String) -> Self {
        Self {
            mechanism,
            user: user.to_string(),
            password: password.to_string(),
            client_nonce: nonce,
            client_first_bare: String::new(),
            server_signature: None,
        }
    }

    /// client-first: `n,,n=<user>,r=<nonce>` (no channel binding, no authzid).
    pub fn client_first(&mut self) -> Vec<u8> {
        self.client_first_bare = format!(
            "n={},r={}",
            self.user.replace('=', "=3D").replace(',', "=2C"),
            self.client_nonce
        );
        format!("n,,{}", self.client_first_bare).into_bytes()
    }

    /// client-final for the server's server-first: the combined nonce must extend ours
    /// and the iterations be within Kafka's bounds (a peer cannot make us hash for ever).
    pub fn client_final(&mut self, server_first: &[u8]) -> Result<Vec<u8>, ScramError> {
        let server_first =
            std::str::from_utf8(server_first).map_err(|_| ScramError::Malformed("server-first"))?;
        let (mut nonce, mut salt, mut iterations) = (None, None, None);
        for attr in server_first.split(',') {
            match attr.split_once('=') {
                Some(("r", v)) => nonce = Some(v),
                Some(("s", v)) => {
                    salt = Some(
                        BASE64
                            .decode(v)
                            .map_err(|_| ScramError::Malformed("server-first salt"))?,
                    )
                }
                Some(("i", v)) => {
                    iterations = Some(
                        v.parse::<i32>()
                            .map_err(|_| ScramError::Malformed("server-first iterations"))?,
                    )
                }
                Some(("m", _)) => return Err(ScramError::Malformed("mandatory extension")),
                Some(_) => {}
                None => return Err(ScramError::Malformed("server-first attribute")),
            }
        }
        let nonce = nonce.ok_or(ScramError::Malformed("server-first without a nonce"))?;
        let salt = salt.ok_or(ScramError::Malformed("server-first without a salt"))?;
        let iterations =
            iterations.ok_or(ScramError::Malformed("server-first without iterations"))?;
        if nonce.len() <= self.client_nonce.len() || !nonce.starts_with(&self.client_nonce) {
            return Err(ScramError::NonceMismatch);
        }
        if !(MIN_ITERATIONS..=MAX_ITERATIONS).contains(&iterations) {
            return Err(ScramError::Malformed(
                "server-first iterations out of bounds",
            ));
        }
        let iterations = u32::try_from(iterations)
            .map_err(|_| ScramError::Malformed("server-first iterations"))?;
        let m = self.mechanism;
        let salted = m.salted_password(self.password.as_bytes(), &salt, iterations);
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let client_key = m.hmac(&salted, b"Client Key");
        let stored_key = m.hash(&client_key);
        let signature = m.hmac(&stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(a, b)| a ^ b)
            .collect();
        let server_key = m.hmac(&salted, b"Server Key");
        self.server_signature = Some(m.hmac(&server_key, auth_message.as_bytes()));
        Ok(format!("{without_proof},p={}", BASE64.encode(proof)).into_bytes())
    }

    /// Checks server-final (`v=<signature>`, compared in constant time); `e=<error>` is
    /// the server's refusal.
    pub fn verify_server_final(&self, server_final: &[u8]) -> Result<(), ScramError> {
        let expected = self.server_signature.as_ref().ok_or(ScramError::Finished)?;
        let server_final =
            std::str::from_utf8(server_final).map_err(|_| ScramError::Malformed("server-final"))?;
        if server_final.starts_with("e=") {
            return Err(ScramError::InvalidCredentials);
        }
        let v = server_final
            .split(',')
            .find_map(|a| a.strip_prefix("v="))
            .ok_or(ScramError::Malformed("server-final"))?;
        let got = BASE64
            .decode(v)
            .map_err(|_| ScramError::Malformed("server signature"))?;
        if got.len() != expected.len() || !bool::from(got.ct_eq(expected)) {
            return Err(ScramError::ServerSignature);
        }
        Ok(())
    }
}

/// RFC 5802's saslname: `=2C` is `,` and `=3D` is `=`; any other `=` is malformed.
fn decode_saslname(raw: &str) -> Result<String, ScramError> {
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        let code = rest.get(i + 1..i + 3);
        match code {
            Some("2C") => out.push(','),
            Some("3D") => out.push('='),
            _ => return Err(ScramError::Malformed("user name")),
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    if out.is_empty() {
        return Err(ScramError::Malformed("user name"));
    }
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The client side of an exchange, as Kafka's `ScramSaslClient` computes it.
    pub(crate) struct Client {
        pub mechanism: ScramMechanism,
        pub user: String,
        pub password: String,
        pub nonce: String,
        pub first_bare: String,
        pub auth_message: String,
        pub salted: Vec<u8>,
    }

    impl Client {
        pub(crate) fn new(mechanism: ScramMechanism, user: &str, password: &str) -> Self {
            Self {
                mechanism,
                user: user.into(),
                password: password.into(),
                nonce: "fyko+d2lbbFgONRv9qkxdawL".into(),
                first_bare: String::new(),
                auth_message: String::new(),
                salted: Vec::new(),
            }
        }

        pub(crate) fn first(&mut self) -> Vec<u8> {
            self.first_with("")
        }

        /// client-first with `extensions` (`,tokenauth=true`) after the nonce.
        pub(crate) fn first_with(&mut self, extensions: &str) -> Vec<u8> {
            self.first_bare = format!(
                "n={},r={}{extensions}",
                self.user.replace('=', "=3D").replace(',', "=2C"),
                self.nonce
            );
            format!("n,,{}", self.first_bare).into_bytes()
        }

        pub(crate) fn final_message(&mut self, server_first: &[u8]) -> Vec<u8> {
            let server_first = std::str::from_utf8(server_first).unwrap();
            let mut nonce = "";
            let mut salt = Vec::new();
            let mut iterations = 0;
            for a in server_first.split(',') {
                let (k, v) = a.split_once('=').unwrap();
                match k {
                    "r" => nonce = v,
                    "s" => salt = BASE64.decode(v).unwrap(),
                    "i" => iterations = v.parse().unwrap(),
                    _ => {}
                }
            }
            self.salted =
                self.mechanism
                    .salted_password(self.password.as_bytes(), &salt, iterations);
            let without = format!("c=biws,r={nonce}");
            self.auth_message = format!("{},{server_first},{without}", self.first_bare);
            let client_key = self.mechanism.hmac(&self.salted, b"Client Key");
            let stored = self.mechanism.hash(&client_key);
            let signature = self.mechanism.hmac(&stored, self.auth_message.as_bytes());
            let proof: Vec<u8> = client_key
                .iter()
                .zip(&signature)
                .map(|(a, b)| a ^ b)
                .collect();
            format!("{without},p={}", BASE64.encode(proof)).into_bytes()
        }

        pub(crate) fn server_signature(&self) -> Vec<u8> {
            let server_key = self.mechanism.hmac(&self.salted, b"Server Key");
            let sig = self
                .mechanism
                .hmac(&server_key, self.auth_message.as_bytes());
            format!("v={}", BASE64.encode(sig)).into_bytes()
        }
    }

    pub(crate) fn stored(mechanism: ScramMechanism, password: &str) -> ScramCredential {
        let salt = b"a salt of sixteen".to_vec();
        let salted = mechanism.salted_password(password.as_bytes(), &salt, 4096);
        mechanism.credential(&salt, &salted, 4096)
    }

    #[test]
    fn a_full_exchange_authenticates_and_signs_for_both_mechanisms() {
        for m in ScramMechanism::ALL {
            let credential = stored(m, "pencil");
            let mut client = Client::new(m, "user", "pencil");
            let mut server = ScramServer::new(m);
            let ScramStep::Continue(first) = server
                .step(&client.first(), |n| {
                    (n.name == "user" && !n.token).then(|| ScramIdentity::user(credential.clone()))
                })
                .unwrap()
            else {
                panic!("no server-first")
            };
            assert!(std::str::from_utf8(&first)
                .unwrap()
                .starts_with("r=fyko+d2lbbFgONRv9qkxdawL"));
            assert!(std::str::from_utf8(&first).unwrap().ends_with(",i=4096"));
            let last = client.final_message(&first);
            let done = server.step(&last, |_| unreachable!()).unwrap();
            assert_eq!(
                done,
                ScramStep::Done {
                    user: "user".into(),
                    token_owner: None,
                    response: client.server_signature()
                }
            );
            assert_eq!(server.step(b"again", |_| None), Err(ScramError::Finished));
        }
    }

    /// RFC 7677's test vector: SCRAM-SHA-256 of user "user", password "pencil".
    #[test]
    fn rfc_7677_vector_verifies() {
        let m = ScramMechanism::Sha256;
        let salt = BASE64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let salted = m.salted_password(b"pencil", &salt, 4096);
        let credential = m.credential(&salt, &salted, 4096);
        let auth_message = "n=user,r=rOprNGfwEbeRWgbNEkqO,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
        let client_key = m.hmac(&salted, b"Client Key");
        let signature = m.hmac(&credential.stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(a, b)| a ^ b)
            .collect();
        assert_eq!(
            BASE64.encode(proof),
            "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        let v = m.hmac(&credential.server_key, auth_message.as_bytes());
        assert_eq!(
            BASE64.encode(v),
            "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        );
    }

    #[test]
    fn a_wrong_password_and_an_unknown_user_fail_alike_at_the_proof() {
        let m = ScramMechanism::Sha512;
        let credential = stored(m, "right");
        for (user, password) in [("alice", "wrong"), ("nobody", "right")] {
            let mut client = Client::new(m, user, password);
            let mut server = ScramServer::new(m);
            let ScramStep::Continue(first) = server
                .step(&client.first(), |n| {
                    (n.name == "alice").then(|| ScramIdentity::user(credential.clone()))
                })
                .unwrap()
            else {
                panic!()
            };
            let last = client.final_message(&first);
            assert_eq!(
                server.step(&last, |_| None),
                Err(ScramError::InvalidCredentials),
                "{user}"
            );
        }
    }

    #[test]
    fn nonce_channel_binding_and_malformed_messages_are_refused() {
        let m = ScramMechanism::Sha256;
        let credential = stored(m, "pw");
        let lookup = |_: ScramName<'_>| Some(ScramIdentity::user(credential.clone()));
        for bad in [
            &b"p=tls-unique,,n=u,r=abc"[..],
            b"n,,r=abc",
            b"n,,n=u",
            b"n,,n=u,r=",
            b"n,,n=u=zz,r=abc",
            b"x,,n=u,r=abc",
            b"n,,n=u,r=abc,m=ext",
            b"\xff\xfe",
        ] {
            assert!(ScramServer::new(m).step(bad, lookup).is_err(), "{bad:?}");
        }
        // A client-final whose nonce is not the server's.
        let mut client = Client::new(m, "u", "pw");
        let mut server = ScramServer::new(m);
        let ScramStep::Continue(first) = server.step(&client.first(), lookup).unwrap() else {
            panic!()
        };
        let last = String::from_utf8(client.final_message(&first)).unwrap();
        let forged = last.replace("r=fyko", "r=fyk0");
        assert_eq!(
            server.step(forged.as_bytes(), lookup),
            Err(ScramError::NonceMismatch)
        );
        // A client-final that claims channel binding it did not announce.
        let mut server = ScramServer::new(m);
        let ScramStep::Continue(first) = server.step(&client.first(), lookup).unwrap() else {
            panic!()
        };
        let last = String::from_utf8(client.final_message(&first)).unwrap();
        let forged = last.replace("c=biws", "c=eSws");
        assert_eq!(
            server.step(forged.as_bytes(), lookup),
            Err(ScramError::ChannelBinding)
        );
    }

    /// Our client against our server: both mechanisms authenticate and the client
    /// believes the server's signature; a wrong password fails at the proof.
    #[test]
    fn the_client_authenticates_and_verifies_the_server() {
        for m in ScramMechanism::ALL {
            let stored = stored(m, "pencil");
            let mut client = ScramClient::new(m, "us=er,1", "pencil").unwrap();
            let mut server = ScramServer::new(m);
            let ScramStep::Continue(server_first) = server
                .step(&client.client_first(), |n| {
                    assert_eq!(n.name, "us=er,1");
                    Some(ScramIdentity::user(stored.clone()))
                })
                .unwrap()
            else {
                panic!("server-first expected")
            };
            let client_final = client.client_final(&server_first).unwrap();
            let ScramStep::Done { user, response, .. } =
                server.step(&client_final, |_| unreachable!()).unwrap()
            else {
                panic!("server-final expected")
            };
            assert_eq!(user, "us=er,1");
            client.verify_server_final(&response).unwrap();

            let mut wrong = ScramClient::new(m, "user", "pen").unwrap();
            let mut server = ScramServer::new(m);
            let ScramStep::Continue(server_first) = server
                .step(&wrong.client_first(), |_| {
                    Some(ScramIdentity::user(stored.clone()))
                })
                .unwrap()
            else {
                panic!("server-first expected")
            };
            let client_final = wrong.client_final(&server_first).unwrap();
            assert_eq!(
                server.step(&client_final, |_| unreachable!()),
                Err(ScramError::InvalidCredentials)
            );
        }
    }

    /// A server that does not know the credential, or answers nonsense, is not believed.
    #[test]
    fn the_client_refuses_a_forged_or_malformed_server() {
        let m = ScramMechanism::Sha512;
        let mut client = ScramClient::with_nonce(m, "u", "p", "abc".into());
        client.client_first();
        let salt = BASE64.encode(b"salt");
        // The combined nonce must extend ours.
        for bad in [
            format!("r=xyz123,s={salt},i=4096"),
            format!("r=abc,s={salt},i=4096"),
        ] {
            assert_eq!(
                client.client_final(bad.as_bytes()),
                Err(ScramError::NonceMismatch)
            );
        }
        // Iterations a peer could use to make us hash for ever, or too few.
        for i in ["1", "100000000", "-5", "x"] {
            assert!(client
                .client_final(format!("r=abc123,s={salt},i={i}").as_bytes())
                .is_err());
        }
        assert!(client.client_final(b"r=abc123,i=4096").is_err());
        assert!(
            client.verify_server_final(b"v=AAAA").is_err(),
            "before client-final"
        );
        client
            .client_final(format!("r=abc123,s={salt},i=4096").as_bytes())
            .unwrap();
        let forged = format!("v={}", BASE64.encode([0u8; 64]));
        assert_eq!(
            client.verify_server_final(forged.as_bytes()),
            Err(ScramError::ServerSignature)
        );
        assert_eq!(
            client.verify_server_final(b"e=invalid-proof"),
            Err(ScramError::InvalidCredentials)
        );
        assert!(client.verify_server_final(b"v=!!").is_err());
        assert!(client.verify_server_final(&[0xff, 0xfe]).is_err());
    }

    #[test]
    fn saslnames_decode_escapes() {
        assert_eq!(decode_saslname("a=2Cb=3Dc").unwrap(), "a,b=c");
        assert!(decode_saslname("a=").is_err());
        assert!(decode_saslname("").is_err());
    }
}
