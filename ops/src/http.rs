//! The small HTTP server both binaries run: `/metrics`, `/healthz`, `/readyz`. Does network
//! I/O.
//!
//! The server is the same for both; what the endpoints answer is the binary's: it passes a
//! [`Probes`] implementation. A probe that fails answers 503 with its reason as the body.
//! Other paths get 404, other methods than GET and HEAD get 405.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::metrics;

/// What the endpoints answer. Called on every request, so each method must be cheap.
pub trait Probes: Send + Sync + 'static {
    /// `/healthz`: `Ok` for 200 `ok`, else 503 with the reason (one line, no newline).
    fn healthz(&self) -> Result<(), String>;
    /// `/readyz`: `Ok` for 200 `ok`, else 503 with the reason (one line, no newline).
    fn readyz(&self) -> Result<(), String>;
    /// `/metrics`: the OpenMetrics text ([`metrics::CONTENT_TYPE`]); an error answers 500.
    fn metrics(&self) -> Result<String, std::fmt::Error>;
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

/// Serve until `shutdown` completes. Accept errors (e.g. out of file descriptors) are
/// logged and retried; one connection failing does not affect the others.
pub async fn serve<P: Probes>(
    listener: TcpListener,
    probes: Arc<P>,
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
        let probes = probes.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let response = respond(&req, &*probes);
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

fn respond(req: &Request<Incoming>, probes: &impl Probes) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n".into());
    }
    match req.uri().path() {
        "/healthz" => probe(probes.healthz()),
        "/readyz" => probe(probes.readyz()),
        "/metrics" => match probes.metrics() {
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
                    "encoding metrics failed\n".into(),
                )
            }
        },
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /healthz or /readyz\n".into(),
        ),
    }
}

/// 200 `ok`, or 503 with the reason.
fn probe(outcome: Result<(), String>) -> Response<Full<Bytes>> {
    match outcome {
        Ok(()) => text(StatusCode::OK, "ok\n".into()),
        Err(reason) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{reason}\n").into(),
        ),
    }
}

fn text(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
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
    use std::sync::Mutex;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Probes whose answers the test sets.
    #[derive(Debug, Default)]
    struct Fixed {
        healthz: Mutex<Option<String>>,
        readyz: Mutex<Option<String>>,
        metrics_fail: Mutex<bool>,
    }

    impl Probes for Fixed {
        fn healthz(&self) -> Result<(), String> {
            self.healthz.lock().unwrap().clone().map_or(Ok(()), Err)
        }
        fn readyz(&self) -> Result<(), String> {
            self.readyz.lock().unwrap().clone().map_or(Ok(()), Err)
        }
        fn metrics(&self) -> Result<String, std::fmt::Error> {
            if *self.metrics_fail.lock().unwrap() {
                return Err(std::fmt::Error);
            }
            Ok("test_up 1\n# EOF\n".to_owned())
        }
    }

    /// `method path` over HTTP/1.0; returns (status line, lower-cased headers, body).
    async fn send(addr: SocketAddr, method: &str, path: &str) -> (String, String, String) {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(format!("{method} {path} HTTP/1.0\r\nHost: test\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut raw = String::new();
        stream.read_to_string(&mut raw).await.unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
        (status.to_owned(), headers.to_lowercase(), body.to_owned())
    }

    async fn get(addr: SocketAddr, path: &str) -> (String, String) {
        let (status, _, body) = send(addr, "GET", path).await;
        (status, body)
    }

    #[tokio::test]
    async fn serves_the_probes_and_stops_on_shutdown() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let probes = Arc::new(Fixed::default());
        *probes.readyz.lock().unwrap() = Some("caches not synced yet".to_owned());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, probes.clone(), async move {
            let _ = stopped.await;
        }));

        assert_eq!(
            get(addr, "/healthz").await,
            ("HTTP/1.0 200 OK".to_owned(), "ok\n".to_owned())
        );
        assert_eq!(
            get(addr, "/readyz").await,
            (
                "HTTP/1.0 503 Service Unavailable".to_owned(),
                "caches not synced yet\n".to_owned()
            )
        );
        *probes.readyz.lock().unwrap() = None;
        assert_eq!(get(addr, "/readyz").await.0, "HTTP/1.0 200 OK");
        *probes.healthz.lock().unwrap() = Some("stuck".to_owned());
        assert_eq!(
            get(addr, "/healthz").await,
            (
                "HTTP/1.0 503 Service Unavailable".to_owned(),
                "stuck\n".to_owned()
            )
        );

        let (status, headers, body) = send(addr, "GET", "/metrics").await;
        assert_eq!(status, "HTTP/1.0 200 OK");
        assert!(
            headers.contains(&format!("content-type: {}", metrics::CONTENT_TYPE)),
            "{headers}"
        );
        assert_eq!(body, "test_up 1\n# EOF\n");
        *probes.metrics_fail.lock().unwrap() = true;
        assert_eq!(
            get(addr, "/metrics").await,
            (
                "HTTP/1.0 500 Internal Server Error".to_owned(),
                "encoding metrics failed\n".to_owned()
            )
        );

        assert_eq!(
            get(addr, "/nope").await,
            (
                "HTTP/1.0 404 Not Found".to_owned(),
                "not found: try /metrics, /healthz or /readyz\n".to_owned()
            )
        );
        let (status, headers, body) = send(addr, "POST", "/healthz").await;
        assert_eq!(status, "HTTP/1.0 405 Method Not Allowed");
        assert!(
            headers.contains("content-type: text/plain; charset=utf-8"),
            "{headers}"
        );
        assert_eq!(body, "only GET\n");
        let (status, _, body) = send(addr, "HEAD", "/readyz").await;
        assert_eq!(status, "HTTP/1.0 200 OK");
        assert_eq!(body, "");

        stop.send(()).unwrap();
        server.await.unwrap();
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }

    #[tokio::test]
    async fn a_taken_address_is_reported() {
        let taken = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = taken.local_addr().unwrap();
        let err = bind(addr).await.unwrap_err();
        assert!(matches!(err, HttpError::Bind { addr: a, .. } if a == addr));
        assert_eq!(err.to_string(), format!("cannot listen on {addr}"));
    }
}
