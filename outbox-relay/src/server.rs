//! The operations endpoint (`--metrics-addr`): `/metrics` in Prometheus
//! text format, `/healthz` (the process answers) and `/readyz` (database and
//! broker reachable).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::health::Health;
use crate::shutdown::Shutdown;

#[derive(Clone)]
struct Endpoints {
    metrics: PrometheusHandle,
    health: Arc<Health>,
}

/// Binds `addr` (so a taken port fails at start) and serves until shutdown.
pub async fn serve(
    addr: SocketAddr,
    metrics: PrometheusHandle,
    health: Arc<Health>,
    shutdown: Shutdown,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let app = Router::new()
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(Endpoints { metrics, health });
    tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    Ok(tokio::spawn(async move {
        let serving = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.requested().await });
        if let Err(error) = serving.await {
            tracing::error!(%error, "the metrics endpoint stopped");
        }
    }))
}

async fn render_metrics(State(endpoints): State<Endpoints>) -> String {
    endpoints.metrics.render()
}

async fn ready(State(endpoints): State<Endpoints>) -> (StatusCode, String) {
    let health = &endpoints.health;
    let state = |up: bool| if up { "up" } else { "down" };
    let mut body = format!(
        "database {}\nbroker {}\n",
        state(health.database_up()),
        state(health.broker_up())
    );
    if let Some(days) = health.partition_days_ahead() {
        body.push_str(&format!("partitions {days} days ahead\n"));
        if days < crate::health::MIN_PARTITION_DAYS_AHEAD {
            // A warning, not unreadiness: rows of a day without its
            // partition go to the default one, and publishing goes on.
            body.push_str(&format!(
                "warning: fewer than {} days have partitions; run `outbox-relay partitions \
                 maintain` or the relay with --partition-maintenance\n",
                crate::health::MIN_PARTITION_DAYS_AHEAD
            ));
        }
    }
    let code = if health.ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, body)
}
