//! How quorum connections are made and accepted: the seam through which the broker puts
//! the controller listener's security (TLS, SASL) under the quorum RPCs.
//!
//! This crate knows the RPC frames, not TLS or SASL: those are the broker's network code,
//! which the layering rule keeps out of here. So the quorum dials and accepts through a
//! [`QuorumTransport`] it is given in [`super::QuorumConfig`]: `dial` returns a stream
//! that is connected and has passed whatever the peer's listener demands, and `accept`
//! turns a socket the quorum listener accepted into one whose peer has proved who it is
//! (or fails, and the connection is dropped before any RPC is read). [`Plaintext`], the
//! default, is plain TCP both ways.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::image::MetadataImage;

/// A byte stream the quorum RPCs run on (TCP, or TLS over it).
pub trait QuorumIo: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static> QuorumIo for T {}

/// A connected (and, when the transport demands it, authenticated) quorum connection.
pub type QuorumStream = Box<dyn QuorumIo>;

/// What the transport's methods return.
pub type TransportFuture<'a> = Pin<Box<dyn Future<Output = io::Result<QuorumStream>> + Send + 'a>>;

/// This node's view of the committed metadata, for an accepting transport's checks (the
/// SCRAM credentials and the ACLs live in the metadata log).
pub type ImageView = Arc<dyn Fn() -> MetadataImage + Send + Sync>;

/// Dials and accepts quorum connections (see the module docs).
pub trait QuorumTransport: std::fmt::Debug + Send + Sync + 'static {
    /// Connects to the quorum listener at `addr` and passes what it demands. A refused
    /// TCP connection must come back as [`io::ErrorKind::ConnectionRefused`]: the quorum
    /// reads it as "that peer's process is gone" (`DialLog`).
    fn dial(&self, addr: SocketAddr) -> TransportFuture<'_>;

    /// Secures a connection the quorum listener accepted from `peer`, or refuses it.
    /// Bounded in time by the caller.
    fn accept(&self, tcp: TcpStream, peer: SocketAddr, image: ImageView) -> TransportFuture<'_>;
}

/// Plain TCP both ways, `TCP_NODELAY` on.
#[derive(Debug, Default, Clone, Copy)]
pub struct Plaintext;

impl QuorumTransport for Plaintext {
    fn dial(&self, addr: SocketAddr) -> TransportFuture<'_> {
        Box::pin(async move {
            let s = TcpStream::connect(addr).await?;
            s.set_nodelay(true)?;
            Ok(Box::new(s) as QuorumStream)
        })
    }

    fn accept(&self, tcp: TcpStream, _peer: SocketAddr, _image: ImageView) -> TransportFuture<'_> {
        Box::pin(async move {
            tcp.set_nodelay(true)?;
            Ok(Box::new(tcp) as QuorumStream)
        })
    }
}
