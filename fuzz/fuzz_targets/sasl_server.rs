//! The pre-authentication state machine of a SASL listener (`network::sasl`): what a
//! client can send before it has authenticated, PLAIN and SCRAM included (OAUTHBEARER's
//! own parsing and validation have the `oauthbearer` target).
//!
//! Input: a sequence of frames `[len: u16][frame…]`, fed in order to one connection's
//! `Authenticator` as the network does: a bare token after a v0 SaslHandshake, otherwise
//! a request header then `request`. The listener offers PLAIN (user `alice`), SCRAM-SHA-256
//! and SCRAM-SHA-512 (`alice` has a credential, any other user gets the made-up one). Stops
//! at the first close, as the connection would. Checks: no panic; a response is a frame
//! under `sasl.server.max.receive.size` (the responses echo bounded input only); a
//! principal only ever comes from a completed exchange (`User:alice`).
#![no_main]

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use rill_broker::network::sasl::{AuthTime, Authenticator, SaslConfig, Verdict, DEFAULT_MECHANISMS};
use rill_broker::network::scram::{
    ScramCredential, ScramIdentity, ScramMechanism, ScramName, TokenOwner, MIN_ITERATIONS,
};
use rill_protocol::decode_request_header;

fn config() -> Arc<SaslConfig> {
    static CONFIG: OnceLock<Arc<SaslConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| Arc::new(SaslConfig::new(&DEFAULT_MECHANISMS, &[("alice", "alice-secret")])))
        .clone()
}

fn credential(m: ScramMechanism) -> ScramCredential {
    static CREDS: OnceLock<[ScramCredential; 2]> = OnceLock::new();
    let creds = CREDS.get_or_init(|| {
        ScramMechanism::ALL.map(|m| m.credential(b"salt-of-alice", b"alice-secret", MIN_ITERATIONS))
    });
    creds[usize::from(m == ScramMechanism::Sha512)].clone()
}

/// `alice` as a user, and as a delegation token of hers that never expires (the token
/// path of `tokenauth=true`).
fn lookup(n: ScramName<'_>) -> Option<ScramIdentity> {
    (n.name == "alice").then(|| ScramIdentity {
        credential: credential(n.mechanism),
        token_owner: n.token.then(|| TokenOwner {
            principal: "User:alice".into(),
            expiry_timestamp_ms: i64::MAX,
        }),
    })
}

fuzz_target!(|data: &[u8]| {
    let mut auth = Authenticator::new(config());
    let mut rest = data;
    while rest.len() >= 2 {
        let len = usize::from(u16::from_be_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        let frame = &rest[2..2 + len];
        rest = &rest[2 + len..];
        let verdict = if auth.expects_raw_token() {
            auth.raw_token(frame, AuthTime::now(), lookup)
        } else {
            let mut body = Bytes::copy_from_slice(frame);
            let Ok((header, _)) = decode_request_header(&mut body) else {
                return;
            };
            auth.request(
                header.request_api_key,
                header.request_api_version,
                header.correlation_id,
                &mut body,
                AuthTime::now(),
                lookup,
            )
        };
        match verdict {
            Verdict::Pass => {}
            Verdict::Respond(r) => assert!(r.len() <= 512 * 1024, "response of {}", r.len()),
            Verdict::Expired => return,
            Verdict::Close { response, .. } => {
                if let Some(r) = response {
                    assert!(r.len() <= 512 * 1024, "response of {}", r.len());
                }
                return;
            }
        }
        if let Some(p) = auth.principal() {
            assert_eq!(p, "User:alice");
        }
    }
});
