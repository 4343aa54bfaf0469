//! The process's tokio runtime, and how Python threads wait on the engine:
//! with the GIL released (other Python threads run, two threads query at
//! once), and on the main thread with Ctrl-C live — every 100 ms the wait
//! asks Python whether a signal arrived, and on `KeyboardInterrupt` it
//! drops the statement's future, which cancels the statement and its
//! downloads (the engine's streams stop when dropped).

use std::future::Future;
use std::sync::OnceLock;
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use pyo3::prelude::*;
use tokio::runtime::Runtime;

use crate::errors::InterfaceError;

/// How often a waiting main thread checks for Ctrl-C: well under the
/// second within which a user expects `KeyboardInterrupt`.
const SIGNAL_POLL: Duration = Duration::from_millis(100);

/// The runtime and the process it was started in.
static RUNTIME: OnceLock<(u32, Runtime)> = OnceLock::new();

/// The runtime every connection of this process runs on, started on first
/// use. A child forked after that cannot use it (tokio's threads do not
/// survive `fork`): it gets an error that says what to do instead.
pub fn runtime() -> PyResult<&'static Runtime> {
    let (pid, runtime) = RUNTIME.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("blobhouse")
            .build()
            .expect("a tokio runtime starts (threads and an I/O driver)");
        (std::process::id(), runtime)
    });
    if *pid != std::process::id() {
        return Err(InterfaceError::new_err(
            "blobhouse was started in the parent of this forked process and cannot run in it: connect in a process that has not \
             inherited a started engine (multiprocessing: use the 'spawn' or 'forkserver' start method)",
        ));
    }
    Ok(runtime)
}

/// Whether this is the process's main thread, the only one on which
/// Python runs signal handlers (elsewhere `check_signals` does nothing).
pub fn on_main_thread() -> bool {
    // SAFETY: both calls only read the calling thread's and process's ids.
    unsafe { libc::syscall(libc::SYS_gettid) as libc::pid_t == libc::getpid() }
}

/// Runs `future` to completion on the runtime with the GIL released. On
/// the main thread a Ctrl-C ends the wait with `KeyboardInterrupt` and
/// aborts the task, which drops the future (and with it the statement)
/// at its next await.
///
/// The wait is a channel with a timeout on the calling thread, not a tokio
/// timer: a statement's CPU-bound operators can keep every worker thread
/// busy, and a timer that needs a worker to fire would hold Ctrl-C back
/// until the statement ends (measured: 8 s on a scan of S3 data).
pub fn wait<F>(py: Python<'_>, future: F) -> PyResult<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    py.check_signals()?;
    let runtime = runtime()?;
    let main = on_main_thread();
    let (done, answer) = std::sync::mpsc::sync_channel(1);
    let task = runtime.spawn(async move {
        let _ = done.send(future.await);
    });
    py.detach(move || {
        loop {
            match answer.recv_timeout(SIGNAL_POLL) {
                Ok(output) => return Ok(output),
                Err(RecvTimeoutError::Timeout) if main => {
                    if let Err(interrupt) = Python::attach(|py| py.check_signals()) {
                        task.abort();
                        return Err(interrupt);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(InterfaceError::new_err("the statement's task ended without an answer (it panicked): the connection may be used again"));
                }
            }
        }
    })
}

/// [`wait`] for a caller that may or may not hold the GIL — a consumer
/// (pyarrow, Polars, DuckDB) pulling an exported Arrow stream, possibly on
/// one of its own threads. Only on the main thread is the GIL taken, to
/// check for Ctrl-C; elsewhere the calling thread just waits, so a
/// consumer that holds the GIL on another thread cannot deadlock it.
pub fn wait_anywhere<F>(future: F) -> PyResult<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    if on_main_thread() {
        return Python::attach(|py| wait(py, future));
    }
    if tokio::runtime::Handle::try_current().is_ok() {
        // A thread of the runtime itself (the engine loading a stream that
        // this package exported): it cannot block_on the runtime again.
        return Ok(futures::executor::block_on(future));
    }
    Ok(runtime()?.block_on(future))
}
