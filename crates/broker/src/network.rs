//! Listener and connections: frames in, responses out, in order per connection.
//!
//! Each connection is one task that reads length-prefixed frames into a buffer, decodes
//! the header, hands the request to [`Broker::handle`] and writes the response before it
//! looks at the next frame, which is how Kafka keeps responses in request order (it mutes
//! a channel while a request is in flight). Different connections run in parallel on the
//! runtime's workers. The frame cap (`socket.request.max.bytes`) is checked on the size
//! prefix, before anything is buffered, and a frame that cannot be decoded closes that
//! connection only.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use rill_protocol::{decode_frame, decode_request_header, FrameError};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::Broker;

/// Initial read buffer per connection; it grows to the largest frame seen, up to the cap.
const READ_BUFFER_BYTES: usize = 64 * 1024;

/// Accepts connections until `shutdown` turns true.
pub async fn serve(
    listener: TcpListener,
    broker: Arc<Broker>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let broker = broker.clone();
                    let shutdown = shutdown.clone();
                    tokio::spawn(async move {
                        if let Err(e) = connection(stream, peer, broker, shutdown).await {
                            tracing::debug!(%peer, error = %e, "connection closed");
                        }
                    });
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            _ = shutdown.changed() => return,
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum ConnectionError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("frame: {0}")]
    Frame(#[from] FrameError),
    #[error("{0}")]
    Protocol(String),
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    broker: Arc<Broker>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), ConnectionError> {
    stream.set_nodelay(true)?;
    let (mut reader, writer) = stream.into_split();
    let mut writer = BufWriter::new(writer);
    let mut buf = BytesMut::with_capacity(READ_BUFFER_BYTES);
    let max_frame = broker.max_request_bytes;
    loop {
        while let Some(frame) = decode_frame(&mut buf, max_frame)? {
            let frame: Bytes = frame.freeze();
            let mut body = frame;
            let (header, api_key) = decode_request_header(&mut body)
                .map_err(|e| ConnectionError::Protocol(format!("request header: {e}")))?;
            match broker.handle(&header, api_key, body, peer).await {
                Ok(Some(response)) => writer.write_all(&response).await?,
                Ok(None) => {}
                Err(reason) => {
                    writer.flush().await?;
                    return Err(ConnectionError::Protocol(reason));
                }
            }
        }
        writer.flush().await?;
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(READ_BUFFER_BYTES);
        }
        tokio::select! {
            n = reader.read_buf(&mut buf) => {
                if n? == 0 {
                    return Ok(());
                }
            }
            _ = shutdown.changed() => return Ok(()),
        }
    }
}
