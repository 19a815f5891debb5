//! The web console (issue #18 item 4): a single page served at `/` by the node's HTTP
//! listener, and the JSON API under `/api/` that the page calls.
//!
//! # Where its data comes from
//! The console is a Kafka client of its own node, as AKHQ or kafka-ui are of a cluster,
//! but in-process: every API call is a `rill-client` [`Admin`] request (or, for the
//! message browser, an assigned [`rill_client::Consumer`]) sent to one of this node's
//! client listeners. So it shows what any client would see, goes through the
//! same request handlers, authorizer and quotas, and needs nothing of the broker's
//! internals; `rill-broker` stays free of `rill-client` (the layering test), and only
//! takes a finished [`Router`] through `Server::http_routes`. The cost is a loopback
//! round trip per request, which an operator's page does not notice.
//!
//! The listener is `console.listener.name`, else the first PLAINTEXT one. On a secured
//! listener the console logs in with the client settings given as `console.client.*`
//! (`console.client.sasl.username`, `console.client.ssl.ca.location`, ...; the listener's
//! protocol and, for TLS, the broker's `ssl.truststore.location` are the defaults), as
//! that principal: the authorizer decides what it may see and do. A node whose client
//! listeners are all secured and that names none for the console answers every API call
//! with 503 and a sentence saying so, which the page shows.
//!
//! # Bounds
//! Request bodies are at most 64 KiB; the message browser returns at most
//! [`api::RECORDS_MAX`] records, scans at most [`api::SCAN_MAX`], each key, value and
//! header cut at [`render::SHOWN_BYTES_MAX`] bytes, and gives up after
//! [`api::BROWSE_TIME_MAX`]; group lists describe at most [`api::GROUPS_MAX`] groups.
//! Names are checked before they reach a request; errors are 4xx/5xx with a message.
//! A request that changes something must say `content-type: application/json`: a page
//! of another origin cannot send that without the browser's CORS preflight, which this
//! API never grants, so a form on a foreign site cannot create or reset anything here.
//!
//! # The page
//! `assets/`: plain HTML, CSS and JavaScript embedded with `include_str!`, no build step.
//! The page routes on the URL's hash (`#/topics/orders`), re-polls the API every 3 s,
//! and puts record data into the page with `textContent` only. Its metrics page reads
//! the node's own `/metrics` (same origin, so the same credentials) rather than an API of
//! its own: the charts show exactly what a Prometheus scrape of this node would.

mod api;
mod render;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::{get, post, put};
use axum::Router;

use rill_client::{Admin, ClientConfig};

/// Request bodies the API accepts (a topic to create, a config to set).
const BODY_BYTES_MAX: usize = 64 * 1024;

/// What the API handlers share: the admin client, or why there is none.
pub(crate) struct Console {
    /// `host:port` of the listener the console connects to.
    bootstrap: String,
    /// How its clients connect (the listener's security settings).
    client: ClientConfig,
    admin: Result<Admin, String>,
}

/// One of this node's client listeners, as the console may reach it.
pub struct ConsoleListener {
    pub name: String,
    pub addr: SocketAddr,
    /// `PLAINTEXT`, `SSL`, `SASL_PLAINTEXT` or `SASL_SSL`.
    pub protocol: &'static str,
}

/// Where the console connects and how: the listener named by `listener_name`
/// (`console.listener.name`), else the first PLAINTEXT one, by the address it bound (a
/// wildcard address is reached on loopback), with `security.protocol` set to the
/// listener's and `settings` (`console.client.*`, prefix removed) on top; `Err` says why
/// there is none.
pub fn target_for(
    listeners: &[ConsoleListener],
    listener_name: Option<&str>,
    settings: &[(String, String)],
) -> Result<(String, Vec<(String, String)>), String> {
    let chosen = match listener_name {
        Some(name) => Some(listeners.iter().find(|l| l.name == name).ok_or_else(|| {
            format!("console.listener.name {name} is not one of this node's client listeners")
        })?),
        None => listeners.iter().find(|l| l.protocol == "PLAINTEXT"),
    };
    match chosen {
        Some(l) => {
            let addr = l.addr;
            let ip = if addr.ip().is_unspecified() {
                match addr {
                    SocketAddr::V4(_) => "127.0.0.1".to_string(),
                    SocketAddr::V6(_) => "[::1]".to_string(),
                }
            } else if addr.is_ipv6() {
                format!("[{}]", addr.ip())
            } else {
                addr.ip().to_string()
            };
            let mut all = vec![("security.protocol".to_string(), l.protocol.to_string())];
            all.extend(settings.iter().cloned());
            Ok((format!("{ip}:{}", addr.port()), all))
        }
        None => Err(format!(
            "the console is a Kafka client of this node, and its client listeners ({}) are \
             all secured (TLS or SASL); name one with console.listener.name and give the \
             console's login as console.client.* settings, or add a PLAINTEXT listener on \
             loopback",
            listeners
                .iter()
                .map(|l| l.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// The console's routes, for the node's HTTP listener.
pub fn router(target: Result<(String, Vec<(String, String)>), String>) -> Router {
    let configured = target.and_then(|(b, settings)| {
        let mut client = ClientConfig::new(&b).request_timeout(std::time::Duration::from_secs(10));
        for (key, value) in &settings {
            client = client
                .set(key, value)
                .map_err(|e| format!("console.client.{key}: {e}"))?;
        }
        Ok((b, client))
    });
    let (bootstrap, client, admin) = match configured {
        Ok((b, client)) => {
            let admin = Admin::new(client.clone().client_id("rill-console"))
                .map_err(|e| format!("admin client: {e}"));
            (b, client, admin)
        }
        Err(reason) => (String::new(), ClientConfig::new(""), Err(reason)),
    };
    let state = Arc::new(Console {
        bootstrap,
        client,
        admin,
    });
    let api = Router::new()
        .route("/api/status", get(api::status))
        .route("/api/cluster", get(api::cluster))
        .route("/api/topics", get(api::topics).post(api::create_topic))
        .route(
            "/api/topics/{name}",
            get(api::topic).delete(api::delete_topic),
        )
        .route("/api/topics/{name}/partitions", post(api::add_partitions))
        .route("/api/topics/{name}/configs", put(api::alter_config))
        .route("/api/topics/{name}/messages", get(api::messages))
        .route("/api/groups", get(api::groups))
        .route("/api/groups/{id}", get(api::group))
        .route("/api/groups/{id}/reset", post(api::reset_offsets))
        .fallback(api::not_found)
        .layer(axum::middleware::from_fn(api::json_writes_only))
        .layer(DefaultBodyLimit::max(BODY_BYTES_MAX))
        .with_state(state);
    Router::new()
        .route("/", get(index))
        .route("/console.css", get(css))
        .route("/console.js", get(js))
        .merge(api)
}

const INDEX_HTML: &str = include_str!("assets/index.html");
const CONSOLE_CSS: &str = include_str!("assets/console.css");
const CONSOLE_JS: &str = include_str!("assets/console.js");

/// The page forbids inline scripts and every origin but its own: record data can never
/// run as script even if a bug put it into markup.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

async fn index() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        INDEX_HTML,
    )
}

async fn css() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        CONSOLE_CSS,
    )
}

async fn js() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        CONSOLE_JS,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(name: &str, addr: &str, protocol: &'static str) -> ConsoleListener {
        ConsoleListener {
            name: name.to_string(),
            addr: addr.parse().unwrap(),
            protocol,
        }
    }

    #[test]
    fn the_console_connects_to_the_first_plaintext_listener() {
        let bootstrap = |ls: &[ConsoleListener]| target_for(ls, None, &[]).map(|(b, _)| b);
        assert_eq!(
            bootstrap(&[
                l("SSL", "127.0.0.1:9093", "SSL"),
                l("PLAINTEXT", "0.0.0.0:9092", "PLAINTEXT")
            ]),
            Ok("127.0.0.1:9092".to_string())
        );
        assert_eq!(
            bootstrap(&[l("PLAINTEXT", "[::]:9092", "PLAINTEXT")]),
            Ok("[::1]:9092".to_string())
        );
        let secured = bootstrap(&[l("SASL_SSL", "127.0.0.1:9093", "SASL_SSL")]);
        assert!(
            secured.is_err_and(|e| e.contains("SASL_SSL") && e.contains("console.listener.name"))
        );
    }

    #[test]
    fn a_named_listener_is_reached_with_its_protocol_and_the_consoles_settings() {
        let listeners = [
            l("PLAINTEXT", "127.0.0.1:9092", "PLAINTEXT"),
            l("INTERNAL", "127.0.0.1:9094", "SASL_SSL"),
        ];
        let settings = [("sasl.username".to_string(), "console".to_string())];
        let (bootstrap, all) = target_for(&listeners, Some("INTERNAL"), &settings).unwrap();
        assert_eq!(bootstrap, "127.0.0.1:9094");
        assert_eq!(
            all,
            vec![
                ("security.protocol".to_string(), "SASL_SSL".to_string()),
                ("sasl.username".to_string(), "console".to_string()),
            ]
        );
        assert!(target_for(&listeners, Some("NOPE"), &[]).is_err_and(|e| e.contains("NOPE")));
    }
}
