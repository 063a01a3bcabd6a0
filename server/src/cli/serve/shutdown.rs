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

/// SIGTERM and SIGINT (ctrl-c), listened for from the moment they are installed: tokio sets its
/// handler when a signal stream is made, not when it is first awaited, so a signal that comes
/// before the server awaits it (a supervisor stopping a server that has just said it is loading)
/// still begins a shutdown instead of meeting the default action, which kills the process.
pub(super) struct ShutdownSignals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
}

impl ShutdownSignals {
    /// Installs the handlers (inside the runtime).
    pub(super) fn install() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Self { term: signal(SignalKind::terminate()).ok(), int: signal(SignalKind::interrupt()).ok() }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// Resolves at the first SIGTERM or SIGINT since [`ShutdownSignals::install`].
    pub(super) async fn recv(self) {
        #[cfg(unix)]
        {
            let (mut term, mut int) = (self.term, self.int);
            async fn first(s: Option<&mut tokio::signal::unix::Signal>) {
                match s {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            }
            tokio::select! { _ = first(term.as_mut()) => {}, _ = first(int.as_mut()) => {} }
        }
        #[cfg(not(unix))]
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
        tracing::info!("shutdown signal received");
    }
}
