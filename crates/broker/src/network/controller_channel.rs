//! The controller listener's security under the metadata quorum (Kafka's controller
//! listener, `controller.listener.names`): [`ControllerTransport`] is the
//! `rill_metadata::QuorumTransport` the broker hands the quorum, so that Raft, forwarded
//! controller requests and observers' joins run over TLS and SASL like any listener.
//!
//! # Protocol
//! - The listener's protocol is its entry in `listener.security.protocol.map`
//!   (`CONTROLLER:SSL`, `SASL_SSL`, `SASL_PLAINTEXT`; PLAINTEXT when it has none). Its
//!   settings are the listener's, looked up as for any listener
//!   (`listener.name.controller.ssl.keystore.location`, then `ssl.keystore.location`, …).
//! - Dialing (every voter, and an observer joining): the inter-broker connector built for
//!   the controller listener ([`InterBrokerConnector::for_controller`]): TLS trusting the
//!   listener's truststore and presenting its keystore, then SaslHandshake and
//!   SaslAuthenticate with `sasl.mechanism.controller.protocol` (PLAIN unless set; Kafka's
//!   default is GSSAPI, which Rill does not speak, and PLAIN needs nothing but the JAAS
//!   line, while SCRAM needs credentials in the log before the quorum can form: see
//!   `rill format --add-scram`). The voters are dialed at the address in
//!   `controller.quorum.voters`, so with `ssl.endpoint.identification.algorithm=https`
//!   (the default) their certificates must name that IP address.
//! - Accepting: as a client listener does, a TLS handshake with the listener's
//!   `ssl.client.auth` (a client certificate gives the principal through
//!   `ssl.principal.mapping.rules`), then on a SASL listener the SASL exchange, Kafka
//!   framed, and nothing else before it completes, each frame held to
//!   `sasl.server.max.receive.size`. PLAIN users come from the listener's JAAS config,
//!   SCRAM credentials from this node's metadata image, else from the data directory's
//!   `bootstrap.scram` (`rill format --add-scram`): the quorum must authenticate its
//!   peers before the log can hold any credential, so a SCRAM controller login is the
//!   formatted one until the log has that user.
//! - The principal then needs CLUSTER_ACTION on the cluster when an authorizer is
//!   configured (`super.users` is the usual way), as Kafka asks of the controller RPCs.
//!   A PLAINTEXT controller listener checks nothing, as before.
//!
//! Whatever fails closes the connection before the quorum reads an RPC from it; the
//! dialing side backs off and retries, so a quorum whose logins are wrong does not form
//! and says why in the log.

use std::io;
use std::net::SocketAddr;

use bytes::BytesMut;
use rill_metadata::acl::host_address;
use rill_metadata::{
    AclOperation, Action, AuthorizationResult, ImageView, QuorumStream, QuorumTransport,
    RequestContext, ResourceType, ScramCredentialUpsertion, StandardAuthorizer, TransportFuture,
    CLUSTER_NAME,
};
use rill_protocol::{decode_frame, decode_request_header};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::config::BrokerConfig;
use crate::error::BrokerError;
use crate::network::inter_broker::{InterBrokerConnector, PeerEndpoint};
use crate::network::sasl::{AuthTime, Authenticator, Verdict};
use crate::network::scram::{ScramCredential, ScramIdentity, ScramMechanism, ScramName};
use crate::network::security::{ListenerSecurity, ANONYMOUS};

/// The SASL client id this node's quorum dials send.
const CLIENT_ID: &str = "rill-quorum";

/// How the quorum dials and accepts on the controller listener (see the module docs).
pub struct ControllerTransport {
    connector: InterBrokerConnector,
    /// The accepting side's TLS and SASL; `None` on a PLAINTEXT listener.
    security: Option<ListenerSecurity>,
    authorizer: Option<StandardAuthorizer>,
    /// `sasl.server.max.receive.size`.
    max_sasl_frame: usize,
    /// The static config, for the TLS acceptor's reloadable keys.
    config: BrokerConfig,
    /// `bootstrap.scram`'s credentials, for SCRAM logins the image cannot answer yet.
    bootstrap: Vec<ScramCredentialUpsertion>,
}

impl std::fmt::Debug for ControllerTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerTransport")
            .field("connector", &self.connector)
            .field("security", &self.security)
            .finish_non_exhaustive()
    }
}

impl ControllerTransport {
    /// Reads the controller listener's settings, both sides; a bad or missing one refuses
    /// the start with its key named.
    pub fn from_config(config: &BrokerConfig) -> Result<Self, BrokerError> {
        let listener = config.controller_listener()?;
        let connector = InterBrokerConnector::for_controller(config)?;
        let security = if listener.protocol.uses_tls() || listener.protocol.uses_sasl() {
            Some(ListenerSecurity::from_config(config, &listener)?)
        } else {
            None
        };
        let limits = crate::network::ConnectionLimits::from_config(config)?;
        Ok(Self {
            connector,
            security,
            authorizer: config.authorizer()?,
            max_sasl_frame: limits.first_request_max_bytes,
            config: config.clone(),
            bootstrap: crate::network::bootstrap_scram::read(&config.data_dir())?,
        })
    }

    async fn accept_secure(
        &self,
        tcp: TcpStream,
        peer: SocketAddr,
        image: ImageView,
    ) -> io::Result<QuorumStream> {
        tcp.set_nodelay(true)?;
        let Some(security) = &self.security else {
            return Ok(Box::new(tcp));
        };
        let mut principal = ANONYMOUS.to_string();
        let mut stream: QuorumStream = match &security.tls {
            None => Box::new(tcp),
            Some(tls) => {
                let acceptor = tls.acceptor(|key| self.config.get(key).map(str::to_string));
                let tls = acceptor.accept(tcp).await?;
                if let Some(cert) = tls.get_ref().1.peer_certificates().and_then(|c| c.first()) {
                    principal = security.principal_of_certificate(cert).ok_or_else(|| {
                        denied("no ssl.principal.mapping.rules rule matches the certificate")
                    })?;
                }
                Box::new(tls)
            }
        };
        if let Some(sasl) = &security.sasl {
            let auth = Authenticator::new(sasl.clone());
            // Brokers and controllers log in as users; a delegation token is a client's.
            let scram = |n: ScramName<'_>| {
                if n.token {
                    return None;
                }
                crate::network::scram::image_credential(&image(), n.name, n.mechanism)
                    .or_else(|| self.bootstrap_credential(n.name, n.mechanism))
                    .map(ScramIdentity::user)
            };
            principal = authenticate(&mut stream, auth, scram, self.max_sasl_frame).await?;
        }
        if let Some(authorizer) = &self.authorizer {
            let host = host_address(peer.ip());
            let action = Action {
                operation: AclOperation::ClusterAction,
                resource_type: ResourceType::Cluster,
                resource_name: CLUSTER_NAME,
            };
            let ctx = RequestContext {
                principal: &principal,
                host: &host,
            };
            let acls = if authorizer.is_super_user(&principal) {
                None
            } else {
                Some(image().acls)
            };
            let allowed = match &acls {
                None => true,
                Some(acls) => {
                    authorizer.authorize(acls, true, ctx, action) == AuthorizationResult::Allowed
                }
            };
            if !allowed {
                return Err(denied(&format!(
                    "{principal} may not CLUSTER_ACTION on the cluster, which the controller \
                     listener asks of its peers (super.users or an ACL)"
                )));
            }
        }
        tracing::debug!(%peer, principal, "quorum connection authenticated");
        Ok(stream)
    }
}

impl ControllerTransport {
    fn bootstrap_credential(&self, user: &str, m: ScramMechanism) -> Option<ScramCredential> {
        let c = self
            .bootstrap
            .iter()
            .find(|c| c.name == user && c.mechanism == m.kafka_type())?;
        Some(ScramCredential {
            salt: c.salt.clone(),
            stored_key: c.stored_key.clone(),
            server_key: c.server_key.clone(),
            iterations: c.iterations,
        })
    }
}

impl QuorumTransport for ControllerTransport {
    fn dial(&self, addr: SocketAddr) -> TransportFuture<'_> {
        Box::pin(async move {
            let stream = self
                .connector
                .connect(&PeerEndpoint::of_addr(addr), CLIENT_ID)
                .await?;
            Ok(Box::new(stream) as QuorumStream)
        })
    }

    fn accept(&self, tcp: TcpStream, peer: SocketAddr, image: ImageView) -> TransportFuture<'_> {
        Box::pin(self.accept_secure(tcp, peer, image))
    }
}

fn denied(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, what.to_string())
}

/// The server side of the SASL exchange, Kafka framed, until `auth` has a principal;
/// anything but SaslHandshake and SaslAuthenticate (or a v0 handshake's bare tokens)
/// refuses the connection.
async fn authenticate(
    stream: &mut QuorumStream,
    mut auth: Authenticator,
    scram: impl Fn(ScramName<'_>) -> Option<ScramIdentity>,
    max_frame: usize,
) -> io::Result<String> {
    let mut buf = BytesMut::with_capacity(1024);
    loop {
        let frame = loop {
            match decode_frame(&mut buf, max_frame) {
                Ok(Some(frame)) => break frame,
                Ok(None) => {}
                Err(e) => return Err(denied(&format!("SASL frame: {e}"))),
            }
            if stream.read_buf(&mut buf).await? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection during authentication",
                ));
            }
        };
        let verdict = if auth.expects_raw_token() {
            auth.raw_token(&frame, AuthTime::now(), &scram)
        } else {
            let mut body = frame.freeze();
            let (header, _) = decode_request_header(&mut body)
                .map_err(|e| denied(&format!("request header: {e}")))?;
            auth.request(
                header.request_api_key,
                header.request_api_version,
                header.correlation_id,
                &mut body,
                AuthTime::now(),
                &scram,
            )
        };
        match verdict {
            Verdict::Respond(reply) => {
                write_frame(stream, &reply).await?;
                if let Some(principal) = auth.principal() {
                    return Ok(principal.to_string());
                }
            }
            Verdict::Close { response, reason } => {
                if let Some(reply) = response {
                    let _ = write_frame(stream, &reply).await;
                }
                return Err(denied(&reason));
            }
            // The controller channel authenticates once and never re-authenticates.
            Verdict::Expired | Verdict::Pass => {
                return Err(denied(
                    "the controller listener takes SaslHandshake and SaslAuthenticate only \
                     before authentication",
                ))
            }
        }
    }
}

async fn write_frame(stream: &mut QuorumStream, body: &[u8]) -> io::Result<()> {
    let len = i32::try_from(body.len()).map_err(|_| denied("SASL response too large"))?;
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(body);
    stream.write_all(&out).await?;
    stream.flush().await
}
