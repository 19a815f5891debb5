//! The SCRAM exchange from both ends (`network::scram`), fed arbitrary messages.
//!
//! Input: `[flags: u8][client-first…] 0x00 [client-final…] 0x00 [server-first…] 0x00
//! [server-final…]`. Bit 0 of the flags picks SHA-512 over SHA-256, bit 1 the known user
//! (`alice`) over an unknown one. The server (`ScramServer`) takes the first two messages;
//! in client-final, `r=*` stands for the nonce the server just chose (the fuzzer cannot
//! guess it), so that the proof check is reached. The client (`ScramClient`, what a broker
//! runs against another's inter-broker listener) takes the last two; in server-first,
//! `r=*` stands for its own nonce followed by `x`. Checks: no panic; the server never
//! authenticates without the proof (the fuzzer cannot forge one); the client never accepts
//! a server-final it did not compute.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use rill_broker::network::scram::{
    ScramClient, ScramCredential, ScramIdentity, ScramMechanism, ScramName, ScramServer,
    ScramStep, MIN_ITERATIONS,
};

fn credential(m: ScramMechanism) -> ScramCredential {
    static CREDS: OnceLock<[ScramCredential; 2]> = OnceLock::new();
    let creds = CREDS.get_or_init(|| {
        ScramMechanism::ALL.map(|m| m.credential(b"salt-of-alice", b"alice-secret", MIN_ITERATIONS))
    });
    creds[usize::from(m == ScramMechanism::Sha512)].clone()
}

/// `r=*` in `message` replaced by `r=<nonce>` (the first one only).
fn with_nonce(message: &[u8], nonce: &[u8]) -> Vec<u8> {
    match message.windows(3).position(|w| w == b"r=*") {
        Some(i) => [&message[..i + 2], nonce, &message[i + 3..]].concat(),
        None => message.to_vec(),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let m = if flags & 1 == 0 {
        ScramMechanism::Sha256
    } else {
        ScramMechanism::Sha512
    };
    let known = flags & 2 != 0;
    let mut parts = rest.splitn(4, |b| *b == 0);
    let client_first = parts.next().unwrap_or_default();
    let client_final = parts.next().unwrap_or_default();
    let server_first = parts.next().unwrap_or_default();
    let server_final = parts.next().unwrap_or_default();

    // The server's side.
    let mut server = ScramServer::new(m);
    let lookup = |_: ScramName<'_>| known.then(|| ScramIdentity::user(credential(m)));
    if let Ok(step) = server.step(client_first, lookup) {
        let ScramStep::Continue(first) = step else {
            panic!("authenticated on client-first");
        };
        let nonce = first
            .strip_prefix(b"r=")
            .and_then(|r| r.split(|b| *b == b',').next())
            .unwrap_or_default();
        let message = with_nonce(client_final, nonce);
        if let Ok(ScramStep::Done { .. }) = server.step(&message, lookup) {
            panic!("authenticated without the proof");
        }
        assert!(
            server.step(&message, lookup).is_err(),
            "a step after the end"
        );
    }

    // The client's side.
    let Ok(mut client) = ScramClient::new(m, "alice", "alice-secret") else {
        return;
    };
    let ours = client.client_first();
    let Some(nonce) = ours
        .windows(2)
        .position(|w| w == b"r=")
        .map(|i| &ours[i + 2..])
    else {
        return;
    };
    let nonce = [nonce, b"x"].concat();
    if client
        .client_final(&with_nonce(server_first, &nonce))
        .is_ok()
    {
        assert!(
            client.verify_server_final(server_final).is_err(),
            "accepted a server-final it did not compute"
        );
    }
});
