//! The HTTP server: `/mcp` (rmcp streamable HTTP behind bearer auth),
//! `/healthz`, `/readyz`, `/metrics` (see `metrics.rs`), and the graceful
//! shutdown sequence, bounded as a whole by the grace period: readiness
//! fails, in-flight calls get the grace minus a cleanup reserve, sessions end
//! and their owned (unretained) sandboxes are killed, then the listener closes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use super::http::auth::{AuthState, TokenSet, require_tenant};
use super::http::drain::track_in_flight;
use super::http::metrics;
use super::http::session_delete;
use super::oauth::{self, OAuth};
use super::provider;
use super::sessions::redis_store::RedisStore;
use super::sessions::{SessionEndHook, SessionRegistry, TrackingSessionManager};
use super::state::mcp_task_key::McpTaskIdKey;
use super::state::shared_sessions::{self, Shared};
use super::state::{Gateway, GatewayCore};
use super::tools::access::META_DEPLOYMENT;
use crate::config::Config;
use crate::masking::{MIN_SECRET_LEN, Masker};

/// Bound on the provider health check behind `/readyz`.
const READY_CHECK_TIMEOUT: Duration = Duration::from_secs(3);

/// Part of the shutdown grace kept for session cleanup (a quarter of the grace, at most this).
const MAX_CLEANUP_RESERVE: Duration = Duration::from_secs(5);
/// Cleanup always gets at least this much, even when the grace is used up.
const MIN_CLEANUP_BUDGET: Duration = Duration::from_secs(1);
/// With sessions in Redis: how long a stopping replica keeps serving (unready) so that active clients move
/// to another replica between two requests.
const HANDOVER_DRAIN: Duration = Duration::from_secs(2);
/// Bound on closing the remaining connections after cleanup.
const CONNECTION_CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// Least time given to ending the task channels at shutdown, even past the grace (one envd call each,
/// all at once).
const MIN_CHANNELS_BUDGET: Duration = Duration::from_millis(200);

/// Refuses a non-loopback listener without auth unless explicitly allowed.
pub fn check_auth_policy(config: &Config) -> anyhow::Result<()> {
    let listen = config.server.listen;
    if !config.has_auth() && !listen.ip().is_loopback() {
        if config.server.insecure_no_auth {
            tracing::warn!(%listen, "listening on a non-loopback address WITHOUT authentication (--insecure-no-auth)");
        } else {
            anyhow::bail!(
                "refusing to listen on {listen} without authentication: configure [auth] tokens \
                 (or SANDBOX_MCP_TOKENS) or [auth.oauth], listen on 127.0.0.1, or pass --insecure-no-auth"
            );
        }
    }
    Ok(())
}

/// Runs the gateway until SIGTERM/SIGINT.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(config.server.listen)
        .await
        .with_context(|| format!("cannot listen on {} (server.listen, or --listen)", config.server.listen))?;
    let stop = CancellationToken::new();
    let signal_stop = stop.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        signal_stop.cancel();
    });
    serve_on(config, listener, stop).await
}

/// The gateway's HTTP app (`/mcp`, `/healthz`, `/readyz`, `/metrics`, OAuth metadata), its shared
/// state, and the background pieces `serve_on` stops on shutdown.
pub struct GatewayApp {
    pub router: Router,
    pub core: Arc<GatewayCore>,
    /// Stops rmcp's sessions.
    pub sessions_stop: CancellationToken,
    /// Stops the admin (metrics) listener.
    pub metrics_stop: CancellationToken,
    pub admin: Option<tokio::task::JoinHandle<()>>,
    /// Stops the Redis session reaper.
    pub reaper_stop: CancellationToken,
    pub reaper: Option<tokio::task::JoinHandle<()>>,
}

/// Builds the gateway's app on a provider client (`api_key`: the provider key, masked and used for
/// the task-id key; `embedded`: the provider is the embedded local one). Binds nothing but the
/// admin listener when `metrics.listen` is set.
pub async fn build_app(
    config: Arc<Config>,
    provider: crate::e2b::E2bClient,
    api_key: Option<&str>,
    embedded: bool,
) -> anyhow::Result<GatewayApp> {
    let secrets = config.tasks.secrets.iter().map(String::as_str).chain(api_key);
    let masker = Masker::new(secrets)?;
    if masker.too_short() > 0 {
        tracing::warn!(
            count = masker.too_short(),
            min_len = MIN_SECRET_LEN,
            "some tasks.secrets are shorter than the minimum length and are not masked"
        );
    }
    let store = match config.sessions.redis_url() {
        None => None,
        Some(_) => {
            let idle = Duration::from_secs(config.server.session_idle_timeout_secs);
            let store = RedisStore::connect(&config.sessions, idle)
                .await
                .map_err(|e| anyhow::anyhow!("sessions.store: {e}"))?;
            tracing::info!(prefix = %config.sessions.key_prefix, "legacy MCP sessions are kept in Redis");
            Some(store)
        }
    };
    let sessions = match &store {
        Some(store) => SessionRegistry::shared(store.clone()),
        None => SessionRegistry::new(),
    };
    let task_key = McpTaskIdKey::resolve(&config, api_key, embedded);
    let core = Arc::new(GatewayCore::new(Arc::clone(&config), provider, Arc::clone(&sessions), masker, task_key));

    let mut local_sessions = match &store {
        Some(store) => LocalSessionManager::default().with_event_store(Arc::new(store.events().clone())),
        None => LocalSessionManager::default(),
    };
    local_sessions.session_config.keep_alive = Some(Duration::from_secs(config.server.session_idle_timeout_secs));
    // Request streams start with a priming event (rmcp's default): it gives the client an id to resume
    // from, and with Redis it names the stream bound to its session (`TrackingSessionManager::create_stream`).
    local_sessions.session_config.sse_retry.get_or_insert(Duration::from_secs(3));
    let hook: Arc<dyn SessionEndHook> = core.clone();
    let manager = Arc::new(TrackingSessionManager::new(local_sessions, Arc::clone(&sessions), hook));
    let shared = store.as_ref().map(|store| Shared::new(store.clone(), Arc::clone(&core), Arc::clone(&manager)));

    let sessions_stop = CancellationToken::new();
    let mut http_config = StreamableHttpServerConfig::default()
        .with_allowed_origins(effective_origins(&config.server.allowed_origins))
        .enforce_origin_validation()
        .with_sse_keep_alive(Some(Duration::from_secs(config.server.sse_keep_alive_secs.max(1))))
        .with_max_request_body_bytes(config.server.max_body_bytes)
        // Plain application/json when nothing streams before the result (SSE otherwise).
        .with_json_response(true)
        .with_cancellation_token(sessions_stop.clone());
    if let Some(store) = &store {
        http_config.session_store = Some(Arc::new(store.clone()));
    }
    http_config = if config.server.allowed_hosts.is_empty() {
        tracing::warn!("server.allowed_hosts is empty: Host checking (DNS-rebinding protection) is OFF");
        http_config.disable_allowed_hosts()
    } else {
        http_config.with_allowed_hosts(config.server.allowed_hosts.clone())
    };

    let routers = Arc::new(Gateway::routers());
    let factory_core = Arc::clone(&core);
    // Behind an `Arc`: every middleware clones the service it wraps on every request, and rmcp's own
    // clone copies its configuration (the Host and Origin lists).
    let service = Arc::new(StreamableHttpService::new(
        move || Ok(Gateway::new(Arc::clone(&factory_core), Arc::clone(&routers))),
        manager,
        http_config,
    ));
    let service = tower::service_fn(move |request: axum::extract::Request| {
        let service = Arc::clone(&service);
        async move { Ok::<_, std::convert::Infallible>(service.handle(request).await) }
    });
    let oauth = OAuth::from_config(&config.auth.oauth).map_err(|e| anyhow::anyhow!(e))?;
    let auth =
        AuthState { tokens: TokenSet::new(&config.auth.tokens), sessions: Arc::clone(&sessions), oauth: oauth.clone() };
    // ops (metrics): never readable with a tenant token. On the admin listener when one is set; else on
    // the main listener, behind the dedicated metrics token when auth is on (open when auth is off).
    let metrics_stop = CancellationToken::new();
    let mut admin = None;
    let mut main_metrics = None;
    if config.metrics.enabled {
        if config.metrics.listen.is_empty() {
            main_metrics = metrics_on_main_listener(&config, Arc::clone(&core.metrics));
        } else {
            let listen = config.metrics.listen.as_str();
            admin = Some(
                metrics::start_admin_listener(
                    listen,
                    Arc::clone(&core.metrics),
                    admin_limits(&config),
                    metrics_stop.clone(),
                )
                .await?,
            );
        }
    }
    let request_guard = super::http::parse_guard::RequestGuard::new(config.server.max_body_bytes);
    let session_limit = super::http::quotas::SessionLimit {
        sessions: Arc::clone(&sessions),
        limit: core.quotas.limits().sessions.clone(),
        idle_timeout_secs: config.server.session_idle_timeout_secs,
    };
    // The middlewares of /mcp, outermost first, composed as one service: layered route by route
    // (`Router::layer`), each layer would box the rest and clone all of it again on every request.
    let mcp_stack = tower::ServiceBuilder::new()
        // Outermost: every refusal below (auth, session, size, type, limits) leaves as a JSON-RPC error.
        .layer(axum::middleware::from_fn(super::http::error_body::json_refusals))
        .layer(axum::middleware::from_fn_with_state(core.drain.clone(), track_in_flight))
        .layer(axum::middleware::from_fn_with_state(auth, require_tenant))
        // With Redis: refresh the session's record (and idle deadline) after auth, and only for the tenant
        // and principal the session is bound to: a request with a stolen or guessed session id keeps
        // nothing alive.
        .option_layer(
            shared.clone().map(|shared| axum::middleware::from_fn_with_state(shared, shared_sessions::refresh)),
        )
        .layer(axum::middleware::from_fn_with_state(session_limit, super::http::quotas::limit_sessions))
        .layer(axum::middleware::from_fn_with_state(request_guard, super::http::parse_guard::check_request))
        // Inside the body check (it reads the buffered body): quick legacy answers as application/json.
        // Not with Redis sessions: their clients resume and replay streams by event id across replicas.
        .option_layer((config.server.legacy_json_window_ms > 0 && store.is_none()).then(|| {
            let window =
                super::http::legacy_json::JsonWindow(Duration::from_millis(config.server.legacy_json_window_ms));
            axum::middleware::from_fn_with_state(window, super::http::legacy_json::answer_json)
        }))
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&sessions), session_delete::session_delete))
        .service(service);
    let mcp = Router::new().nest_service("/mcp", mcp_stack);
    let reaper_stop = CancellationToken::new();
    let reaper = shared.clone().map(|shared| {
        let interval = Duration::from_secs(config.sessions.sweep_interval_secs);
        shared_sessions::spawn_reaper(shared, interval, reaper_stop.clone())
    });
    let mut app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(Arc::clone(&core))
        .merge(mcp);
    if let Some(metrics_router) = main_metrics {
        app = app.merge(metrics_router);
    }
    // OAuth protected resource metadata (RFC 9728): public, outside auth, behind the Host check.
    let router = match &oauth {
        Some(oauth) => app.merge(oauth::metadata::router(oauth, &config.server.allowed_hosts)),
        None => app,
    };
    let router = edge_layers(router);
    Ok(GatewayApp { router, core, sessions_stop, metrics_stop, admin, reaper_stop, reaper })
}

/// What every request of the gateway passes through first (tower-http): a request id (the
/// client's `x-request-id`, else a new UUID) set on the request, logged with the tool call and
/// answered in the response; credentials marked sensitive so no logged or debugged request shows
/// them; and a handler panic answered as a 500 JSON-RPC error instead of a dropped connection.
fn edge_layers(router: Router) -> Router {
    use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
    let request_id = http::HeaderName::from_static(super::tools::calls::REQUEST_ID_HEADER);
    // One layer of the router (outermost first): each `Router::layer` boxes every route once more.
    router.layer(
        tower::ServiceBuilder::new()
            .layer(SetRequestIdLayer::new(request_id.clone(), MakeRequestUuid))
            .layer(PropagateRequestIdLayer::new(request_id))
            .layer(tower_http::catch_panic::CatchPanicLayer::custom(panic_response))
            .layer(tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer::new([
                http::header::AUTHORIZATION,
                http::header::COOKIE,
            ])),
    )
}

/// The answer to a request whose handler panicked (a bug): 500 with a JSON-RPC error body.
fn panic_response(_panic: Box<dyn std::any::Any + Send + 'static>) -> axum::response::Response {
    tracing::error!("a gateway handler panicked; answered 500");
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": -32603, "message": "internal error in the gateway; the request was not completed"},
    });
    (http::StatusCode::INTERNAL_SERVER_ERROR, axum::Json(body)).into_response()
}

/// Runs the gateway on `listener` until `stop` is cancelled.
pub async fn serve_on(
    config: Config,
    listener: tokio::net::TcpListener,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let config = Arc::new(config);
    let connection = provider::connect(&config).await?;
    let embedded = connection.embedded.is_some();
    let GatewayApp { router: app, core, sessions_stop, metrics_stop, admin, reaper_stop, reaper } =
        build_app(Arc::clone(&config), connection.client, connection.api_key.as_deref(), embedded).await?;

    let addr: SocketAddr = listener.local_addr().context("reading the listening address")?;
    let workers = tokio::runtime::Handle::current().metrics().num_workers(); // ops: server.worker_threads in effect
    tracing::info!(%addr, auth = config.has_auth(), provider = ?config.provider.kind, workers, "sandbox-mcp gateway listening (MCP on /mcp)");
    log_deployment_sandboxes(Arc::clone(&core)); // ops: background, never blocks start-up
    let http_stop = CancellationToken::new();
    let http_stop_signal = http_stop.clone();
    let limits = config.server.listen_limits();
    let mut server =
        tokio::spawn(crate::listen::serve("gateway", listener, app, limits, http_stop_signal.cancelled_owned()));

    tokio::select! {
        _ = stop.cancelled() => {}
        result = &mut server => {
            // The server ended by itself: report why after cleaning up.
            core.drain.begin();
            core.end_all_sessions(Duration::from_secs(config.server.shutdown_grace_secs)).await;
            metrics_stop.cancel();
            if let Some(embedded) = connection.embedded { embedded.shutdown().await; }
            return result.context("HTTP server task failed");
        }
    }

    // The grace bounds the whole sequence: in-flight calls get the grace minus a reserve kept for
    // killing owned sandboxes, so cleanup still happens before an orchestrator's SIGKILL.
    let grace = Duration::from_secs(config.server.shutdown_grace_secs);
    let deadline = tokio::time::Instant::now() + grace;
    let cleanup_reserve = (grace / 4).min(MAX_CLEANUP_RESERVE);
    core.drain.begin();
    tracing::info!(
        in_flight = core.drain.in_flight.current(),
        grace_secs = grace.as_secs(),
        "shutting down: readiness off, waiting for in-flight calls"
    );
    let calls_deadline = deadline - cleanup_reserve;
    let store = core.sessions.store().cloned();
    if store.is_some() {
        // Sessions in Redis are handed over: keep serving a moment, unready, so that clients' keep-alive
        // connections close after a response (`Connection: close`, see drain.rs) and their next request
        // goes to another replica, instead of being cut under a request when the listener closes.
        let handover = HANDOVER_DRAIN.min(calls_deadline.saturating_duration_since(tokio::time::Instant::now()));
        tokio::time::sleep(handover).await;
    }
    let left =
        core.drain.in_flight.wait_idle(calls_deadline.saturating_duration_since(tokio::time::Instant::now())).await;
    if left > 0 {
        tracing::warn!(in_flight = left, "grace period over; ending sessions with calls still running");
    }
    // Our session records are taken (reason "shutdown"; with Redis, left there for the other
    // replicas) before rmcp's sessions are stopped: stopping them first raced, and a session could
    // end as "closed" instead (with Redis, be cleaned up instead of handed over).
    let cleanup_budget = deadline.saturating_duration_since(tokio::time::Instant::now()).max(MIN_CLEANUP_BUDGET);
    core.end_all_sessions(cleanup_budget).await;
    // Task channels in sandboxes that outlive this gateway end now rather than when idle.
    let channels_budget = deadline
        .saturating_duration_since(tokio::time::Instant::now())
        .clamp(MIN_CHANNELS_BUDGET, CONNECTION_CLOSE_TIMEOUT);
    core.tasks.close_channels(channels_budget).await;
    if store.is_some() {
        // The sessions live on in Redis (a rolling update): stop taking requests first (idle connections
        // close now, busy ones after their response, which says `Connection: close`), let the requests that
        // slipped in finish, and only then stop the session workers; stopping them first would fail a
        // request arriving in between, where another replica would have served it.
        http_stop.cancel();
        let settle = deadline.saturating_duration_since(tokio::time::Instant::now()).min(CONNECTION_CLOSE_TIMEOUT);
        core.drain.in_flight.wait_idle(settle).await;
    }
    sessions_stop.cancel();
    if let Some(store) = &store {
        // Events still queued for the shared log: a client resuming elsewhere may need them.
        store.events().flush_events(CONNECTION_CLOSE_TIMEOUT).await;
    }
    reaper_stop.cancel();
    if let Some(reaper) = reaper {
        let _ = tokio::time::timeout(CONNECTION_CLOSE_TIMEOUT, reaper).await;
    }
    http_stop.cancel();
    if tokio::time::timeout(CONNECTION_CLOSE_TIMEOUT, &mut server).await.is_err() {
        tracing::warn!("open connections did not close within {CONNECTION_CLOSE_TIMEOUT:?}; closing them");
        server.abort();
    }
    metrics_stop.cancel(); // ops: the admin listener closes last (metrics stay scrapable during the drain)
    if let Some(admin) = admin {
        let _ = tokio::time::timeout(CONNECTION_CLOSE_TIMEOUT, admin).await;
    }
    if let Some(embedded) = connection.embedded {
        embedded.shutdown().await;
    }
    tracing::info!("sandbox-mcp gateway stopped");
    Ok(())
}

/// `/metrics` for the main listener: open without auth, behind `metrics.token_sha256` with auth,
/// absent (with a warning) when auth is on and no metrics token is set.
fn metrics_on_main_listener(config: &Config, metrics: Arc<metrics::GatewayMetrics>) -> Option<Router> {
    let router = Router::new().route("/metrics", get(metrics::serve_metrics).with_state(metrics));
    if !config.has_auth() {
        return Some(router);
    }
    if config.metrics.token_sha256.is_empty() {
        tracing::warn!(
            "/metrics is not served: auth is on and tenant tokens may not read it; set metrics.listen (admin \
             listener) or metrics.token_sha256 (a dedicated scrape token)"
        );
        return None;
    }
    let tokens = TokenSet::new(&[crate::config::TokenEntry {
        tenant: "metrics".into(),
        sha256: config.metrics.token_sha256.to_ascii_lowercase(),
    }]);
    let auth = AuthState { tokens, sessions: SessionRegistry::new(), oauth: None };
    Some(router.layer(axum::middleware::from_fn_with_state(auth, require_tenant)))
}

/// The admin (metrics) listener's limits: the server's timeouts, a small connection cap.
fn admin_limits(config: &Config) -> crate::listen::ListenLimits {
    let mut limits = config.server.listen_limits();
    limits.max_connections = limits.max_connections.min(ADMIN_MAX_CONNECTIONS);
    limits
}

/// Connection cap of the admin listener (scrapers need a handful).
const ADMIN_MAX_CONNECTIONS: usize = 64;

/// Bound on the start-up count of this deployment's sandboxes.
const STARTUP_LIST_TIMEOUT: Duration = Duration::from_secs(10);

/// Logs (info) how many sandboxes tagged with this deployment are alive; best effort, in the background.
fn log_deployment_sandboxes(core: Arc<GatewayCore>) {
    tokio::spawn(async move {
        let deployment = core.deployment().to_owned();
        let filter = [(META_DEPLOYMENT.to_string(), deployment.clone())];
        match tokio::time::timeout(STARTUP_LIST_TIMEOUT, core.provider.list_all_sandboxes(&filter)).await {
            Ok(Ok(sandboxes)) => tracing::info!(
                deployment = %deployment,
                alive = sandboxes.len(),
                "sandboxes of this deployment alive at start-up (left by earlier gateway runs or retained for tasks)"
            ),
            Ok(Err(err)) => tracing::warn!(deployment = %deployment, error = %core.masker.mask(&err.to_string()),
                "cannot count this deployment's sandboxes at start-up (provider unreachable?)"),
            Err(_) => tracing::warn!(deployment = %deployment,
                "counting this deployment's sandboxes at start-up timed out after {STARTUP_LIST_TIMEOUT:?}"),
        }
    });
}

/// Origins of browsers on this machine (local tools such as MCP Inspector).
pub const LOOPBACK_ORIGINS: [&str; 6] = [
    "http://localhost:*",
    "http://127.0.0.1:*",
    "http://[::1]:*",
    "https://localhost:*",
    "https://127.0.0.1:*",
    "https://[::1]:*",
];

/// The Origin allow-list: the configured one, or loopback origins only when none is configured
/// (so a page from any other site, e.g. after DNS rebinding, gets 403).
fn effective_origins(configured: &[String]) -> Vec<String> {
    if configured.is_empty() { LOOPBACK_ORIGINS.iter().map(|o| o.to_string()).collect() } else { configured.to_vec() }
}

async fn healthz() -> impl IntoResponse {
    (StatusCode::OK, "ok\n")
}

async fn readyz(State(core): State<Arc<GatewayCore>>) -> impl IntoResponse {
    if core.drain.is_shutting_down() {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n".to_string());
    }
    if let Some(store) = core.sessions.store()
        && let Err(err) = store.ping().await
    {
        return (StatusCode::SERVICE_UNAVAILABLE, format!("{err}\n"));
    }
    match tokio::time::timeout(READY_CHECK_TIMEOUT, core.provider.health()).await {
        Ok(Ok(())) => (StatusCode::OK, "ready\n".to_string()),
        Ok(Err(err)) => {
            (StatusCode::SERVICE_UNAVAILABLE, format!("provider unreachable: {}\n", core.masker.mask(&err.to_string())))
        }
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "provider health check timed out\n".to_string()),
    }
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => tracing::info!("SIGINT received"),
                    _ = term.recv() => tracing::info!("SIGTERM received"),
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot watch SIGTERM; only SIGINT stops the gateway");
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

#[cfg(test)]
mod edge_tests {
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;

    fn app() -> Router {
        let panics = get(|| async {
            if std::hint::black_box(true) {
                panic!("a bug");
            }
            "unreachable"
        });
        edge_layers(Router::new().route("/panic", panics).route("/ok", get(|| async { "fine" })))
    }

    #[tokio::test]
    async fn a_handler_panic_is_a_500_json_rpc_error_and_the_service_keeps_serving() {
        let app = app();
        let response = app.clone().oneshot(http::Request::get("/panic").body(axum::body::Body::empty()).unwrap());
        let response = response.await.unwrap();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(response.headers().contains_key("x-request-id"));
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"]["code"], -32603, "{body}");
        let response = app.oneshot(http::Request::get("/ok").body(axum::body::Body::empty()).unwrap()).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn requests_get_an_id_and_a_client_id_is_kept() {
        let response = app().oneshot(http::Request::get("/ok").body(axum::body::Body::empty()).unwrap()).await.unwrap();
        let made = response.headers()["x-request-id"].to_str().unwrap().to_owned();
        assert_eq!(made.len(), 36, "a UUID: {made}");
        let request = http::Request::get("/ok").header("x-request-id", "client-7").body(axum::body::Body::empty());
        let response = app().oneshot(request.unwrap()).await.unwrap();
        assert_eq!(response.headers()["x-request-id"], "client-7");
    }
}
