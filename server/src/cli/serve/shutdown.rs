//! How `serve` stops: on SIGTERM or ctrl-c, a drain of the requests in flight, or, during
//! start-up, a bounded wait for the load to stop.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use deltaserve::routes::AppState;

/// How long a shutdown during start-up waits for the load to stop at its next check (a warm-up
/// pass takes milliseconds; reading weights or the driver's first compile of a kernel module,
/// seconds) before the process exits without it.
pub(super) const START_UP_STOP_WAIT: Duration = Duration::from_secs(3);

/// Ends the process now with `status`, skipping exit handlers: the loader thread may be inside
/// the CUDA driver, whose exit-time teardown must not run beside it. Nothing is in flight (the
/// server never became ready); the log lines are already written.
pub(super) fn exit_now(status: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    #[cfg(unix)]
    // SAFETY: `_exit` ends the process; no Rust state is used after it.
    unsafe {
        libc::_exit(status)
    }
    #[cfg(not(unix))]
    std::process::exit(status)
}

/// Stops admission, waits for in-flight requests up to `timeout`, then aborts the rest.
pub(super) async fn drain(state: &AppState, timeout: Duration) {
    state.draining.store(true, Ordering::SeqCst);
    let Some(s) = state.serving.get() else { return };
    tracing::info!(in_flight = s.scheduler.in_flight(), timeout_s = timeout.as_secs(), "draining");
    let deadline = Instant::now() + timeout;
    while s.scheduler.in_flight() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if s.scheduler.in_flight() > 0 {
        tracing::warn!(in_flight = s.scheduler.in_flight(), "shutdown timeout reached; aborting the rest");
        s.scheduler.abort_all();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Resolves on SIGTERM or ctrl-c.
pub(super) async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!("shutdown signal received");
}
