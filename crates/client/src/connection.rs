//! One TCP connection to one broker, with pipelined requests.
//!
//! A connection is opened, then asks `ApiVersions` before anything else (v3, falling back
//! to v0 when the broker answers `UNSUPPORTED_VERSION`, as Kafka's clients do) and keeps
//! the broker's version ranges, so each request goes out at the highest version both sides
//! know ([`BrokerConnection::version`]).
//!
//! Pipelining: any number of tasks may call [`BrokerConnection::send`] at once. Each call
//! takes the next correlation id, registers a one-shot slot for it, and writes its frame
//! under the writer lock; one reader task per connection reads frames and completes the
//! slot whose correlation id the frame carries. Kafka answers a connection's requests in
//! order, but matching by id makes the order irrelevant here.
//!
//! Large requests: [`BrokerConnection::write_spliced`] writes a frame whose big byte
//! fields (the producer's record batches) are not copied into it but handed to one
//! vectored write between the encoded pieces around them, so that a batch goes from its
//! own buffer straight to the socket.
//!
//! Failure: every request has a deadline. When it passes, the connection is closed (the
//! broker may be stopped, or the answer lost) and every other waiting request fails with
//! [`Error::Disconnected`]; the owner then opens a new connection. A request therefore
//! never waits longer than its timeout, whatever the broker does.

use std::collections::HashMap;
use std::io::IoSlice;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rill_protocol::generated::{
    ApiVersionsRequest, ApiVersionsResponse, RequestHeader, ResponseHeader,
};
use rill_protocol::{
    begin_frame, decode_frame, encode_request_frame, ApiKey, Decodable, Encodable, ErrorCode,
    Request,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::security::{SaslClient, Security};

/// A connection's byte stream: TCP, or TLS over it.
trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}
type BoxedStream = Box<dyn Stream>;

/// Largest response frame accepted; a Fetch response is bounded by `fetch.max.bytes`
/// (50 MiB by default), so this leaves room without letting a bad prefix make us buffer
/// gigabytes.
const MAX_RESPONSE_BYTES: usize = 128 << 20;

type Slot = oneshot::Sender<Result<Bytes>>;

#[derive(Default)]
struct Pending {
    slots: HashMap<i32, Slot>,
    /// Why the connection is closed, once it is.
    closed: Option<String>,
}

struct Shared {
    addr: String,
    pending: Mutex<Pending>,
}

impl Shared {
    fn close(&self, why: &str) {
        let slots = {
            let Ok(mut p) = self.pending.lock() else {
                return;
            };
            if p.closed.is_none() {
                p.closed = Some(why.to_string());
            }
            std::mem::take(&mut p.slots)
        };
        for (_, slot) in slots {
            let _ = slot.send(Err(Error::Disconnected {
                addr: self.addr.clone(),
                message: why.to_string(),
            }));
        }
    }
}

/// An open connection to one broker.
pub(crate) struct BrokerConnection {
    shared: Arc<Shared>,
    writer: tokio::sync::Mutex<WriteHalf<BoxedStream>>,
    next_correlation_id: AtomicI32,
    client_id: String,
    request_timeout: Duration,
    versions: OnceLock<HashMap<i16, (i16, i16)>>,
    /// The feature levels the cluster finalized, as ApiVersions v3+ reported them.
    finalized_features: OnceLock<HashMap<String, i16>>,
    reader: JoinHandle<()>,
}

impl Drop for BrokerConnection {
    fn drop(&mut self) {
        self.reader.abort();
        self.shared.close("connection dropped");
    }
}

impl BrokerConnection {
    /// Opens a connection (TLS when `security` says so), negotiates api versions and
    /// logs in with SASL when `security` says so; bounded by `connect_timeout` (the TCP
    /// and TLS handshakes) and `request_timeout` (each request).
    pub(crate) async fn connect(
        addr: &str,
        client_id: &str,
        connect_timeout: Duration,
        request_timeout: Duration,
        security: &Security,
    ) -> Result<Arc<Self>> {
        let tls = security.tls_config()?;
        let stream = match tokio::time::timeout(connect_timeout, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                return Err(Error::Connect {
                    addr: addr.to_string(),
                    message: e.to_string(),
                })
            }
            Err(_) => {
                return Err(Error::Timeout {
                    what: format!("connecting to {addr}"),
                    after: connect_timeout,
                })
            }
        };
        let _ = stream.set_nodelay(true);
        let stream: BoxedStream = match tls {
            None => Box::new(stream),
            Some(config) => {
                let name = crate::security::server_name(addr)?;
                let connector = tokio_rustls::TlsConnector::from(config);
                match tokio::time::timeout(connect_timeout, connector.connect(name, stream)).await {
                    Ok(Ok(s)) => Box::new(s),
                    Ok(Err(e)) => {
                        return Err(Error::Connect {
                            addr: addr.to_string(),
                            message: format!("TLS handshake: {e}"),
                        })
                    }
                    Err(_) => {
                        return Err(Error::Timeout {
                            what: format!("the TLS handshake with {addr}"),
                            after: connect_timeout,
                        })
                    }
                }
            }
        };
        let (read, write) = tokio::io::split(stream);
        let shared = Arc::new(Shared {
            addr: addr.to_string(),
            pending: Mutex::new(Pending::default()),
        });
        let reader = tokio::spawn(read_loop(read, shared.clone()));
        let conn = Arc::new(BrokerConnection {
            shared,
            writer: tokio::sync::Mutex::new(write),
            next_correlation_id: AtomicI32::new(1),
            client_id: client_id.to_string(),
            request_timeout,
            versions: OnceLock::new(),
            finalized_features: OnceLock::new(),
            reader,
        });
        let mut response = conn.api_versions(3).await?;
        if ErrorCode::from_code(response.error_code) == ErrorCode::UNSUPPORTED_VERSION {
            response = conn.api_versions(0).await?;
        }
        crate::error::check(response.error_code, || format!("ApiVersions to {addr}"))?;
        let versions = response
            .api_keys
            .iter()
            .map(|k| (k.api_key, (k.min_version, k.max_version)))
            .collect();
        let _ = conn.versions.set(versions);
        let _ = conn.finalized_features.set(
            response
                .finalized_features
                .iter()
                .map(|f| (f.name.clone(), f.max_version_level))
                .collect(),
        );
        if security.protocol.sasl() {
            conn.authenticate(security).await?;
        }
        Ok(conn)
    }

    /// The SASL login: SaslHandshake v1 naming the mechanism, then its tokens in
    /// SaslAuthenticate requests until the exchange completes.
    async fn authenticate(&self, security: &Security) -> Result<()> {
        use rill_protocol::generated::{SaslAuthenticateRequest, SaslHandshakeRequest};
        let mechanism = security.sasl_mechanism.clone();
        let handshake = SaslHandshakeRequest {
            mechanism: mechanism.clone(),
        };
        let answer = self.send_at(&handshake, 1, self.request_timeout).await?;
        if answer.error_code != 0 {
            return Err(Error::Authentication(format!(
                "{} does not offer SASL mechanism {mechanism} (it offers {})",
                self.addr(),
                answer.mechanisms.join(", ")
            )));
        }
        let mut client = SaslClient::new(security)?;
        let mut server_token = Bytes::new();
        while let Some(token) = client.step(&server_token)? {
            let request = SaslAuthenticateRequest {
                auth_bytes: Bytes::from(token),
                ..Default::default()
            };
            let answer = self.send(&request, 2).await?;
            if answer.error_code != 0 {
                return Err(Error::Authentication(
                    answer
                        .error_message
                        .unwrap_or_else(|| format!("SASL {mechanism} login refused")),
                ));
            }
            server_token = answer.auth_bytes;
        }
        Ok(())
    }

    async fn api_versions(&self, version: i16) -> Result<ApiVersionsResponse> {
        let request = ApiVersionsRequest {
            client_software_name: "rill-client".into(),
            client_software_version: env!("CARGO_PKG_VERSION").into(),
            ..Default::default()
        };
        self.send_at(&request, version, self.request_timeout).await
    }

    /// The level the cluster finalized `feature` at, as this broker said (0: not
    /// finalized).
    pub(crate) fn finalized_feature(&self, feature: &str) -> i16 {
        self.finalized_features
            .get()
            .and_then(|f| f.get(feature).copied())
            .unwrap_or(0)
    }

    /// The broker's address, as dialled.
    pub(crate) fn addr(&self) -> &str {
        &self.shared.addr
    }

    /// Requests sent and not yet answered.
    pub(crate) fn in_flight(&self) -> usize {
        self.shared
            .pending
            .lock()
            .map(|p| p.slots.len())
            .unwrap_or(0)
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.shared
            .pending
            .lock()
            .map(|p| p.closed.is_some())
            .unwrap_or(true)
    }

    pub(crate) fn close(&self, why: &str) {
        self.shared.close(why);
    }

    /// The version to send `api` at: the highest both the broker and `ours` (the highest
    /// this client implements) support.
    pub(crate) fn version(&self, api: ApiKey, ours: i16) -> Result<i16> {
        let unsupported = || Error::UnsupportedVersion {
            addr: self.addr().to_string(),
            api,
            min: 0,
            max: ours,
        };
        let Some(&(lo, hi)) = self.versions.get().and_then(|v| v.get(&api.as_i16())) else {
            return Err(unsupported());
        };
        let v = hi.min(ours);
        if v < lo {
            return Err(unsupported());
        }
        Ok(v)
    }

    /// Sends `request` at the negotiated version (at most `ours`) and waits for its
    /// response, at most the connection's request timeout.
    pub(crate) async fn send<R: Request>(&self, request: &R, ours: i16) -> Result<R::Response> {
        self.send_with_timeout(request, ours, self.request_timeout)
            .await
    }

    /// [`Self::send`] with an explicit deadline (JoinGroup waits for a rebalance, Fetch
    /// for its max wait).
    pub(crate) async fn send_with_timeout<R: Request>(
        &self,
        request: &R,
        ours: i16,
        timeout: Duration,
    ) -> Result<R::Response> {
        let api = api_key::<R>()?;
        let version = self.version(api, ours)?;
        self.send_at(request, version, timeout).await
    }

    async fn send_at<R: Request>(
        &self,
        request: &R,
        version: i16,
        timeout: Duration,
    ) -> Result<R::Response> {
        self.write_at(request, version, timeout)
            .await?
            .response()
            .await
    }

    async fn write_at<R: Request>(
        &self,
        request: &R,
        version: i16,
        timeout: Duration,
    ) -> Result<InFlight<R>> {
        let api = api_key::<R>()?;
        let (correlation_id, frame) = self.encode(request, version)?;
        let (tx, rx) = oneshot::channel();
        {
            let mut p = self.shared.pending.lock().map_err(|_| Error::Closed)?;
            if let Some(why) = &p.closed {
                return Err(Error::Disconnected {
                    addr: self.addr().to_string(),
                    message: why.clone(),
                });
            }
            p.slots.insert(correlation_id, tx);
        }
        self.write(&frame, timeout).await?;
        Ok(InFlight {
            rx,
            api,
            version,
            timeout,
            shared: self.shared.clone(),
            conn: None,
            _response: std::marker::PhantomData,
        })
    }

    /// Starts a request frame for [`Self::write_spliced`]: the size prefix (filled in when
    /// it is written) and the request header at the negotiated version (at most `ours`).
    pub(crate) fn begin_spliced<R: Request>(&self, ours: i16) -> Result<SplicedFrame> {
        let api = api_key::<R>()?;
        let version = self.version(api, ours)?;
        let header = RequestHeader {
            request_api_key: R::API_KEY,
            request_api_version: version,
            correlation_id: self.next_correlation_id(),
            client_id: Some(self.client_id.clone()),
            ..Default::default()
        };
        SplicedFrame::new(&header, api.request_header_version(version))
    }

    /// Writes a frame begun with [`Self::begin_spliced`], its spliced byte fields in
    /// place, with vectored writes; returns the wait for its answer, or `None` when
    /// `expect_response` is false (Produce with acks=0).
    pub(crate) async fn write_spliced<R: Request>(
        self: &Arc<Self>,
        frame: SplicedFrame,
        spliced: &[&[u8]],
        expect_response: bool,
    ) -> Result<Option<InFlight<R>>> {
        let api = api_key::<R>()?;
        let SplicedFrame {
            mut head,
            splices,
            version,
            correlation_id,
        } = frame;
        if splices.len() != spliced.len() {
            return Err(Error::IllegalState(
                "spliced frame: slices do not match their places".into(),
            ));
        }
        let body_len = head.len() - 4 + spliced.iter().map(|s| s.len()).sum::<usize>();
        let size = i32::try_from(body_len)
            .map_err(|_| Error::Encode(rill_protocol::EncodeError::TooLong(body_len)))?;
        head[..4].copy_from_slice(&size.to_be_bytes());
        let mut slices = Vec::with_capacity(2 * spliced.len() + 1);
        let mut from = 0;
        for (&at, bytes) in splices.iter().zip(spliced) {
            let piece = head
                .get(from..at)
                .ok_or_else(|| Error::IllegalState("spliced frame: places out of order".into()))?;
            slices.push(IoSlice::new(piece));
            slices.push(IoSlice::new(bytes));
            from = at;
        }
        slices.push(IoSlice::new(head.get(from..).unwrap_or_default()));
        let (tx, rx) = oneshot::channel();
        {
            let mut p = self.shared.pending.lock().map_err(|_| Error::Closed)?;
            if let Some(why) = &p.closed {
                return Err(Error::Disconnected {
                    addr: self.addr().to_string(),
                    message: why.clone(),
                });
            }
            if expect_response {
                p.slots.insert(correlation_id, tx);
            }
        }
        self.write_vectored(&mut slices, self.request_timeout)
            .await?;
        if !expect_response {
            return Ok(None);
        }
        Ok(Some(InFlight {
            rx,
            api,
            version,
            timeout: self.request_timeout,
            shared: self.shared.clone(),
            conn: Some(self.clone()),
            _response: std::marker::PhantomData,
        }))
    }

    fn next_correlation_id(&self) -> i32 {
        self.next_correlation_id
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                Some(if c == i32::MAX { 1 } else { c + 1 })
            })
            .unwrap_or(1)
    }

    fn encode<R: Request>(&self, request: &R, version: i16) -> Result<(i32, BytesMut)> {
        let correlation_id = self.next_correlation_id();
        let header = RequestHeader {
            request_api_key: R::API_KEY,
            request_api_version: version,
            correlation_id,
            client_id: Some(self.client_id.clone()),
            ..Default::default()
        };
        let mut frame = BytesMut::with_capacity(request.encoded_len(version) + 64);
        encode_request_frame(&mut frame, &header, request)?;
        Ok((correlation_id, frame))
    }

    async fn write(&self, frame: &[u8], timeout: Duration) -> Result<()> {
        self.write_vectored(&mut [IoSlice::new(frame)], timeout)
            .await
    }
}

impl BrokerConnection {
    /// [`Self::write`] for a frame in pieces: one `writev` for as many pieces as the socket
    /// takes, the rest after it.
    async fn write_vectored(&self, slices: &mut [IoSlice<'_>], timeout: Duration) -> Result<()> {
        let result = tokio::time::timeout(timeout, async {
            let mut w = self.writer.lock().await;
            let mut slices = slices;
            while !slices.is_empty() {
                let n = w.write_vectored(slices).await?;
                if n == 0 {
                    return Err(std::io::Error::from(std::io::ErrorKind::WriteZero));
                }
                IoSlice::advance_slices(&mut slices, n);
            }
            // TLS holds records until flushed; TCP's flush does nothing.
            w.flush().await
        })
        .await;
        match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                self.close(&e.to_string());
                Err(Error::Disconnected {
                    addr: self.addr().to_string(),
                    message: e.to_string(),
                })
            }
            Err(_) => {
                self.close("write timed out");
                Err(Error::Timeout {
                    what: format!("writing to {}", self.addr()),
                    after: timeout,
                })
            }
        }
    }
}

/// A request frame with gaps for byte fields that are written from their own buffers:
/// see [`BrokerConnection::begin_spliced`]. The encoder appends to `head` and calls
/// [`Self::splice_here`] where each spliced field's bytes go.
pub(crate) struct SplicedFrame {
    pub(crate) head: BytesMut,
    splices: Vec<usize>,
    pub(crate) version: i16,
    correlation_id: i32,
}

impl SplicedFrame {
    /// A frame holding the size prefix (filled in when it is written) and `header`.
    pub(crate) fn new(header: &RequestHeader, header_version: i16) -> Result<Self> {
        let mut head = BytesMut::with_capacity(256);
        begin_frame(&mut head);
        header.encode(&mut head, header_version)?;
        Ok(Self {
            head,
            splices: Vec::new(),
            version: header.request_api_version,
            correlation_id: header.correlation_id,
        })
    }

    /// The whole frame as one buffer, with `spliced` in place (what `write_spliced` puts
    /// on the wire), for tests that compare it with the plain encoder's frame.
    #[cfg(test)]
    pub(crate) fn assemble(&self, spliced: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut from = 0;
        for (&at, bytes) in self.splices.iter().zip(spliced) {
            out.extend_from_slice(&self.head[from..at]);
            out.extend_from_slice(bytes);
            from = at;
        }
        out.extend_from_slice(&self.head[from..]);
        let size = (out.len() - 4) as i32;
        out[..4].copy_from_slice(&size.to_be_bytes());
        out
    }

    /// Marks the end of `head` as the place of the next spliced field.
    pub(crate) fn splice_here(&mut self) {
        self.splices.push(self.head.len());
    }
}

/// A request on the wire, waiting for its answer.
pub(crate) struct InFlight<R: Request> {
    rx: oneshot::Receiver<Result<Bytes>>,
    api: ApiKey,
    version: i16,
    timeout: Duration,
    shared: Arc<Shared>,
    /// Keeps the connection (and its reader task) alive while the answer is awaited.
    conn: Option<Arc<BrokerConnection>>,
    _response: std::marker::PhantomData<fn() -> R>,
}

impl<R: Request> InFlight<R> {
    /// Waits for the answer, at most the request timeout; on timeout the connection is
    /// closed, as in [`BrokerConnection::send`].
    pub(crate) async fn response(self) -> Result<R::Response> {
        let addr = self.shared.addr.clone();
        let bytes = match tokio::time::timeout(self.timeout, self.rx).await {
            Ok(Ok(r)) => r?,
            Ok(Err(_)) => {
                return Err(Error::Disconnected {
                    addr,
                    message: "reader stopped".into(),
                })
            }
            Err(_) => {
                // The broker may be stopped or wedged: nothing else on this connection will
                // be answered in time either, so fail them all now and reconnect later.
                self.shared.close("request timed out");
                return Err(Error::Timeout {
                    what: format!("{} request to {addr}", self.api.name()),
                    after: self.timeout,
                });
            }
        };
        drop(self.conn);
        let mut bytes = bytes;
        let result =
            ResponseHeader::decode(&mut bytes, self.api.response_header_version(self.version))
                .and_then(|_| R::Response::decode(&mut bytes, self.version));
        match result {
            Ok(r) => Ok(r),
            Err(e) => {
                self.shared.close("undecodable response");
                Err(e.into())
            }
        }
    }
}

fn api_key<R: Request>() -> Result<ApiKey> {
    ApiKey::from_i16(R::API_KEY).ok_or(Error::Encode(rill_protocol::EncodeError::UnknownApiKey(
        R::API_KEY,
    )))
}

async fn read_loop(mut read: ReadHalf<BoxedStream>, shared: Arc<Shared>) {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let why = loop {
        match decode_frame(&mut buf, MAX_RESPONSE_BYTES) {
            Ok(Some(frame)) => {
                if frame.len() < 4 {
                    break "response shorter than its header".to_string();
                }
                let correlation_id = i32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]);
                let slot = shared
                    .pending
                    .lock()
                    .ok()
                    .and_then(|mut p| p.slots.remove(&correlation_id));
                if let Some(slot) = slot {
                    let _ = slot.send(Ok(frame.freeze()));
                }
                // A response nobody waits for (its request timed out) is dropped.
                continue;
            }
            Ok(None) => {}
            Err(e) => break e.to_string(),
        }
        match read.read_buf(&mut buf).await {
            Ok(0) => break "closed by broker".to_string(),
            Ok(_) => {}
            Err(e) => break e.to_string(),
        }
    };
    shared.close(&why);
}
