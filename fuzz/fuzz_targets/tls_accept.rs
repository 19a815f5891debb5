//! The TLS accept path of an `SSL`/`SASL_SSL` listener: arbitrary bytes as a client's
//! first flights into a rustls `ServerConnection` made from the config our listeners build
//! (`network::security::tls_server_config`: our protocol versions, our client-certificate
//! verifier with `ssl.client.auth=requested`, our certificate and key).
//!
//! Input: the client's bytes, cut at each `0x00 0xff 0x00` into flights; each flight is
//! read (`read_tls`) and processed (`process_new_packets`) and the server's answer drained
//! (`write_tls`), as the accept loop would. Stops at the first error (the connection would
//! be closed). Checks: no panic; what the server has buffered to send stays bounded.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use rill_broker::config::BrokerConfig;
use rill_broker::network::security::tls_server_config;
use rustls::{ServerConfig, ServerConnection};

fn server_config() -> Arc<ServerConfig> {
    static CONFIG: OnceLock<Arc<ServerConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            // A CA and a listener certificate it signs, written where the config reads them.
            let dir = tempfile::tempdir().expect("tempdir").keep();
            let ca_key = rcgen::KeyPair::generate().expect("ca key");
            let mut ca = rcgen::CertificateParams::new(Vec::new()).expect("ca params");
            ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            let ca = ca.self_signed(&ca_key).expect("ca cert");
            let key = rcgen::KeyPair::generate().expect("key");
            let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
                .expect("params")
                .signed_by(&key, &ca, &ca_key)
                .expect("cert");
            let keystore = dir.join("server.pem");
            let truststore = dir.join("ca.pem");
            std::fs::write(&keystore, format!("{}{}", key.serialize_pem(), cert.pem()))
                .expect("write keystore");
            std::fs::write(&truststore, ca.pem()).expect("write truststore");
            let mut config = BrokerConfig::default();
            config.set("ssl.keystore.type", "PEM");
            config.set("ssl.keystore.location", &keystore.display().to_string());
            config.set("ssl.truststore.location", &truststore.display().to_string());
            config.set("ssl.client.auth", "requested");
            Arc::new(tls_server_config(&config, "SSL").expect("the listener's TLS config"))
        })
        .clone()
}

fuzz_target!(|data: &[u8]| {
    let Ok(mut conn) = ServerConnection::new(server_config()) else {
        return;
    };
    let mut flights = Vec::new();
    let mut rest = data;
    while let Some(i) = rest.windows(3).position(|w| w == [0, 0xff, 0]) {
        flights.push(&rest[..i]);
        rest = &rest[i + 3..];
    }
    flights.push(rest);
    let mut sink = Vec::new();
    for flight in flights {
        let mut input = flight;
        while !input.is_empty() {
            match conn.read_tls(&mut input) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if conn.process_new_packets().is_err() {
                // rustls queues an alert for the peer; the listener sends it and closes.
                let _ = conn.write_tls(&mut sink);
                return;
            }
        }
        sink.clear();
        while conn.wants_write() {
            if conn.write_tls(&mut sink).is_err() {
                return;
            }
        }
        assert!(
            sink.len() < 1 << 20,
            "server flight of {} bytes",
            sink.len()
        );
        let mut plain = [0u8; 4096];
        let _ = std::io::Read::read(&mut conn.reader(), &mut plain);
    }
});
