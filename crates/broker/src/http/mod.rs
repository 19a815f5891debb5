//! The HTTP listener (`http.listeners`, default `127.0.0.1:9644`, off when empty): one
//! axum router beside the Kafka listeners, for operators and orchestrators.
//!
//! - `GET /health/live`: 200 while the process serves requests at all.
//! - `GET /health/ready`: 200 once the broker is registered with the controller (it holds
//!   its lease), has applied the metadata log up to what the quorum committed, and every
//!   partition the image names it leader of is open here; else 503 with the first reason
//!   in one line (`Broker::readiness`).
//! - `GET /metrics`: every metric in the Prometheus/OpenMetrics text format
//!   (`scrape.rs`); names and their Kafka JMX equivalents are in METRICS.md.
//!
//! - Everything else goes to the routes a caller installed with [`ExtraRoutes::install`]
//!   (the `rill` binary's web console at `/` and `/api/`), or is a 404 until it has. The
//!   console is a Kafka client of the node (`rill-client`), and this crate must not depend
//!   on the client: so the binary builds the routes and hands them over, once the node's
//!   client listeners are bound and it knows where to connect.
//!
//! Who may ask is `auth.rs`'s business: with `http.authentication = basic` (the default
//! when a client listener uses SASL) everything but the two health probes needs the
//! credentials of a cluster user, and a listener bound to a loopback address refuses
//! requests for another host (DNS rebinding). With `http.ssl.enabled` it speaks HTTPS
//! only (`tls.rs`).
//!
//! The listener is bound by `Server::start` before the broker registers, so that a port
//! taken is a start-up error and `/health/ready` answers 503 while the broker starts;
//! it stops with the server's shutdown signal. A controller-only node serves it too
//! (`ControllerServer::start`), ready once the quorum has an active controller, with
//! the process's and the quorum's metrics only. It shares the server's runtime: a scrape
//! is a few milliseconds of one worker, and nothing here holds a lock a request needs.

pub mod auth;
mod scrape;
mod tls;

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower::ServiceExt;

use rill_metadata::MetadataQuorum;

use crate::config::BrokerConfig;
use crate::error::BrokerError;
use crate::server::Broker;

pub use scrape::{MetricsSettings, PARTITION_SERIES_MAX_KEY};

/// The content type of the page `/metrics` serves (what prometheus-client encodes).
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The bound HTTP listener with its security settings.
pub struct HttpListener {
    tcp: TcpListener,
    local: SocketAddr,
    auth: auth::HttpAuth,
    tls: Option<Arc<tls::HttpTls>>,
}

impl HttpListener {
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// What the start-up log says of it.
    pub fn describe(&self) -> String {
        format!(
            "{}, authentication {} ({})",
            if self.tls.is_some() { "https" } else { "http" },
            self.auth.authentication,
            self.auth.reason
        )
    }
}

/// Binds `http.listeners` (`None` when it is empty). A port that cannot be bound is an
/// error naming the key and the address; so is a bad `http.authentication` or an
/// unreadable key file (read before the port is taken).
pub async fn bind(config: &BrokerConfig) -> Result<Option<HttpListener>, BrokerError> {
    let Some(addr) = config.http_listener()? else {
        return Ok(None);
    };
    let auth = auth::HttpAuth::from_config(config)?;
    let tls = tls::acceptor(config)?;
    let tcp = TcpListener::bind(addr).await.map_err(|e| {
        BrokerError::Config(format!("http.listeners: cannot listen on {addr}: {e}"))
    })?;
    let local = tcp
        .local_addr()
        .map_err(|e| BrokerError::Config(format!("http.listeners: {e}")))?;
    Ok(Some(HttpListener {
        tcp,
        local,
        auth: auth.bound_to(local),
        tls,
    }))
}

/// What the listener reports on: a broker (with or without the controller), or a
/// controller-only node, which has only its quorum and its process to show.
#[derive(Clone)]
pub enum Source {
    Broker(Arc<Broker>),
    Controller(Arc<MetadataQuorum>),
}

/// Routes served beside the built-in ones, installed once after the listener started
/// (the console needs the client listeners' bound addresses, known only then). Requests
/// that match no built-in route go to them.
#[derive(Clone, Default)]
pub struct ExtraRoutes(Arc<OnceLock<Router>>);

impl ExtraRoutes {
    /// Installs `routes`; false when routes were installed already (the first stay).
    pub fn install(&self, routes: Router) -> bool {
        self.0.set(routes).is_ok()
    }
}

#[derive(Clone)]
struct AppState {
    source: Source,
    settings: Arc<MetricsSettings>,
    extra: ExtraRoutes,
}

/// Serves the router on `listener` until `shutdown` turns true.
pub async fn serve(
    listener: HttpListener,
    source: Source,
    settings: MetricsSettings,
    extra: ExtraRoutes,
    mut shutdown: watch::Receiver<bool>,
) {
    let local = listener.local;
    let image: auth::ScramLookup = match &source {
        Source::Broker(broker) => {
            let broker = broker.clone();
            Arc::new(move || broker.image())
        }
        Source::Controller(quorum) => {
            let quorum = quorum.clone();
            Arc::new(move || Arc::new(quorum.image()))
        }
    };
    let guard = auth::Guard {
        auth: listener.auth,
        image,
    };
    let state = AppState {
        source,
        settings: Arc::new(settings),
        extra,
    };
    let app = Router::new()
        .route("/health/live", get(live))
        .route("/health/ready", get(ready))
        .route("/metrics", get(metrics))
        .fallback(extra_routes)
        .with_state(state)
        .layer(axum::middleware::from_fn_with_state(guard, auth::guard));
    let stop = async move {
        while !*shutdown.borrow() {
            if shutdown.changed().await.is_err() {
                return;
            }
        }
    };
    let served = match listener.tls {
        Some(acceptor) => {
            axum::serve(tls::TlsListener::new(listener.tcp, local, acceptor), app)
                .with_graceful_shutdown(stop)
                .await
        }
        None => {
            axum::serve(listener.tcp, app)
                .with_graceful_shutdown(stop)
                .await
        }
    };
    if let Err(e) = served {
        tracing::warn!(addr = %local, error = %e, "http listener stopped");
    }
}

/// Hands the request to the installed routes; a 404 before any are (or on a node that
/// has none, such as a controller-only node: the console needs a client listener).
async fn extra_routes(State(state): State<AppState>, request: Request) -> Response {
    match state.extra.0.get() {
        Some(routes) => match routes.clone().oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        },
        None => (
            StatusCode::NOT_FOUND,
            "not found (this node serves /metrics, /health/live and /health/ready)\n",
        )
            .into_response(),
    }
}

async fn live() -> &'static str {
    "live\n"
}

/// A controller-only node is ready once the quorum has an active controller: it then
/// takes part in every decision.
fn controller_readiness(quorum: &MetadataQuorum) -> Result<(), String> {
    match quorum.leader_id() {
        Some(_) => Ok(()),
        None => Err("no active controller (no quorum of voters yet)".into()),
    }
}

async fn ready(State(state): State<AppState>) -> Response {
    let readiness = match &state.source {
        Source::Broker(broker) => broker.readiness().await,
        Source::Controller(quorum) => controller_readiness(quorum),
    };
    match readiness {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason}\n"),
        )
            .into_response(),
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    let page = match &state.source {
        Source::Broker(broker) => {
            let groups = scrape::group_snapshot(broker).await;
            scrape::encode(broker, &state.settings, groups)
        }
        Source::Controller(quorum) => scrape::encode_controller(quorum),
    };
    match page {
        Ok(page) => ([(header::CONTENT_TYPE, OPENMETRICS)], page).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "encoding /metrics failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n").into_response()
        }
    }
}
