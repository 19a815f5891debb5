//! HTTPS for the HTTP listener (`http.ssl.enabled`): the Kafka listeners' rustls server
//! configuration, and an axum [`Listener`] that hands axum connections whose TLS
//! handshake is done.
//!
//! The key material is `http.ssl.keystore.location` (PEM: the chain and the key in one
//! file), or `http.ssl.certificate.location` with `http.ssl.key.location`; unset, the
//! broker's own `ssl.*` keys serve, as for a listener without `listener.name.` keys.
//! There is no client-certificate authentication here (`http.authentication` is how a
//! caller proves who it is). As on a Kafka listener, the files are loaded again when
//! they change on disk (their modification times, looked at for each connection), so a
//! renewed certificate needs no restart; files that do not load leave the old ones
//! serving.
//!
//! Handshakes run in tasks of their own, not in `accept`: one client that stalls its
//! handshake must not hold up every other connection. They are bounded in number
//! ([`HANDSHAKES_MAX`]) and in time ([`HANDSHAKE_TIMEOUT`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::Listener;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::server::TlsStream;

use crate::config::BrokerConfig;
use crate::error::BrokerError;
use crate::network::security::ReloadableTls;

/// Handshakes in progress at once; further connections wait in the kernel's backlog.
pub const HANDSHAKES_MAX: usize = 64;

/// A connection that has not finished its handshake by then is closed.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The name the HTTP listener's keys are read under by `tls_server_config`
/// (`listener.name.http.ssl.*`, laid over from `http.ssl.*`).
const LISTENER: &str = "http";

/// The keys `http.ssl.<key>` that become the listener's `ssl.<key>`.
const KEYS: [&str; 3] = ["keystore.location", "certificate.location", "key.location"];

/// The listener's TLS settings: its static keys, and the files they name as they are
/// on disk at each accept.
pub struct HttpTls {
    config: BrokerConfig,
    tls: ReloadableTls,
}

impl HttpTls {
    fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        self.tls.acceptor(|key| self.config.static_value(key))
    }
}

/// The TLS settings when `http.ssl.enabled` is true, else `None`.
pub fn acceptor(config: &BrokerConfig) -> Result<Option<Arc<HttpTls>>, BrokerError> {
    let enabled = config
        .get("http.ssl.enabled")
        .map(|v| v.trim().to_ascii_lowercase())
        .unwrap_or_default();
    match enabled.as_str() {
        "" | "false" => return Ok(None),
        "true" => {}
        other => {
            return Err(BrokerError::Config(format!(
                "http.ssl.enabled: invalid value {other:?}: true or false"
            )))
        }
    }
    let mut overlay = config.clone();
    for key in KEYS {
        if let Some(v) = config.get(&format!("http.ssl.{key}")) {
            overlay.set(&format!("listener.name.{LISTENER}.ssl.{key}"), v);
        }
    }
    // The Kafka listeners' `ssl.client.auth` is not for this one (see the module docs).
    overlay.set(&format!("listener.name.{LISTENER}.ssl.client.auth"), "none");
    let tls = ReloadableTls::with_alpn(&overlay, LISTENER, vec![b"http/1.1".to_vec()])?;
    Ok(Some(Arc::new(HttpTls {
        config: overlay,
        tls,
    })))
}

/// Accepts TCP connections and yields them once their TLS handshake is done.
pub struct TlsListener {
    local: SocketAddr,
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
}

impl TlsListener {
    /// Starts accepting on `tcp`; the accepting task ends when this listener is dropped.
    pub fn new(tcp: TcpListener, local: SocketAddr, acceptor: Arc<HttpTls>) -> Self {
        let (tx, ready) = mpsc::channel(HANDSHAKES_MAX);
        tokio::spawn(accept_loop(tcp, acceptor, tx));
        Self { local, ready }
    }
}

async fn accept_loop(
    tcp: TcpListener,
    tls: Arc<HttpTls>,
    tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let handshakes = Arc::new(Semaphore::new(HANDSHAKES_MAX));
    loop {
        let Ok(permit) = handshakes.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = tokio::select! {
            accepted = tcp.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors and the like: wait rather than spin.
                    tracing::debug!(error = %e, "http listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = tx.closed() => return,
        };
        let acceptor = tls.acceptor();
        let tx = tx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    let _ = tx.send((tls, peer)).await;
                }
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "http listener: tls handshake failed")
                }
                Err(_) => tracing::debug!(%peer, "http listener: tls handshake timed out"),
            }
        });
    }
}

impl Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            // The accepting task only ends once this listener is gone; until axum stops
            // asking, there is nothing more to hand over.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
