//! The accept loop: hyper connections with a bound on how long a client may take to send its
//! request headers (slow-loris), and a graceful stop. The body's bound is the JSON extractor's
//! ([`crate::routes::ApiJson`]), since hyper has none.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

/// Serves `app` on `listener` until `stop` resolves, closing any connection whose request
/// headers take longer than `header_timeout` to arrive (counted from the connection's first
/// byte, or from the end of its previous response on a kept-alive connection); then waits for
/// open connections to finish, at most `grace`.
pub async fn serve(listener: TcpListener, app: Router, header_timeout: Duration, stop: impl Future<Output = ()>, grace: Duration) {
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(header_timeout);
    builder.http2().timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of file descriptors and the like: back off rather than spin.
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service).into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection closed with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown()).await.is_err() {
        tracing::warn!(seconds = grace.as_secs(), "connections still open after the drain; exiting");
    }
}
