//! The agent's small HTTP server: `/metrics`, `/healthz`, `/readyz`. Does network I/O.
//!
//! Same shape as the controller's `http` module. `/healthz` answers 200 while the alias
//! loop keeps turning (it beats [`Health`] at every renewal tick), so a hung loop — whose
//! aliases the kernel is about to expire — gets the pod restarted. `/readyz` answers 200
//! once the first reconcile on a complete Service list is done.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::metrics::{self, Metrics};

/// Liveness and readiness of the alias loop. Clones share the state.
#[derive(Debug, Clone)]
pub struct Health(Arc<HealthInner>);

#[derive(Debug)]
struct HealthInner {
    start: Instant,
    stall_after: Duration,
    last_beat_ms: AtomicU64,
    ready: AtomicBool,
}

impl Health {
    /// Alive (as if it just beat), not ready; unhealthy once no beat came for `stall_after`.
    pub fn new(stall_after: Duration) -> Self {
        Health(Arc::new(HealthInner {
            start: Instant::now(),
            stall_after,
            last_beat_ms: AtomicU64::new(0),
            ready: AtomicBool::new(false),
        }))
    }

    /// The loop is alive.
    pub fn beat(&self) {
        let ms = u64::try_from(self.0.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.0.last_beat_ms.store(ms, Ordering::Release);
    }

    /// Whether the loop beat within the stall window.
    pub fn is_alive(&self) -> bool {
        let last = Duration::from_millis(self.0.last_beat_ms.load(Ordering::Acquire));
        self.0.start.elapsed().saturating_sub(last) < self.0.stall_after
    }

    /// Mark the agent ready (first reconcile on a complete Service list done).
    pub fn set_ready(&self) {
        self.0.ready.store(true, Ordering::Release);
    }

    /// Whether [`Health::set_ready`] was called.
    pub fn is_ready(&self) -> bool {
        self.0.ready.load(Ordering::Acquire)
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// Address asked for.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// Bind the listen address.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, HttpError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| HttpError::Bind { addr, source })
}

/// Serve until `shutdown` completes. Accept errors are logged and retried.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    health: Health,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(error) => {
                    tracing::warn!(%error, "accepting an HTTP connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let metrics = metrics.clone();
        let health = health.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let response = respond(&req, &metrics, &health);
                async move { Ok::<_, Infallible>(response) }
            });
            if let Err(error) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%error, %peer, "HTTP connection ended with an error");
            }
        });
    }
}

fn respond(req: &Request<Incoming>, metrics: &Metrics, health: &Health) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
    }
    match req.uri().path() {
        "/healthz" if health.is_alive() => text(StatusCode::OK, "ok\n"),
        "/healthz" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "the alias loop is stuck: lifetimes are not being refreshed\n",
        ),
        "/readyz" if health.is_ready() => text(StatusCode::OK, "ok\n"),
        "/readyz" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "Service list not synced yet\n",
        ),
        "/metrics" => match metrics.encode() {
            Ok(body) => {
                let mut response = Response::new(Full::new(Bytes::from(body)));
                response.headers_mut().insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static(metrics::CONTENT_TYPE),
                );
                response
            }
            Err(error) => {
                tracing::error!(%error, "encoding metrics failed");
                text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "encoding metrics failed\n",
                )
            }
        },
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /healthz or /readyz\n",
        ),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// GET `path` with a bare HTTP/1.0 request; returns (status line, body).
    async fn get(addr: SocketAddr, path: &str) -> (String, String) {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: test\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut raw = String::new();
        stream.read_to_string(&mut raw).await.unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        (head.lines().next().unwrap().to_owned(), body.to_owned())
    }

    #[tokio::test]
    async fn serves_health_readiness_and_metrics() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = Arc::new(Metrics::new());
        metrics.record_renewal(true);
        let health = Health::new(Duration::from_millis(300));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, metrics, health.clone(), async move {
            let _ = stopped.await;
        }));

        assert_eq!(get(addr, "/healthz").await.0, "HTTP/1.0 200 OK");
        assert_eq!(
            get(addr, "/readyz").await.0,
            "HTTP/1.0 503 Service Unavailable"
        );
        health.set_ready();
        assert_eq!(get(addr, "/readyz").await.0, "HTTP/1.0 200 OK");
        let (status, body) = get(addr, "/metrics").await;
        assert_eq!(status, "HTTP/1.0 200 OK");
        assert!(body.contains("aliaslb_agent_api_reachable 1"), "{body}");
        assert_eq!(get(addr, "/nope").await.0, "HTTP/1.0 404 Not Found");

        // No beat for longer than the stall window: unhealthy, until the next beat.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let (status, body) = get(addr, "/healthz").await;
        assert_eq!(status, "HTTP/1.0 503 Service Unavailable");
        assert!(body.contains("stuck"), "{body}");
        health.beat();
        assert_eq!(get(addr, "/healthz").await.0, "HTTP/1.0 200 OK");

        stop.send(()).unwrap();
        server.await.unwrap();
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }
}
