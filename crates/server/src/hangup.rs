//! Noticing a PostgreSQL client that went away while its statement runs.
//!
//! pgwire reads the socket only between statements, so a client killed in
//! the middle of a long query would leave the query running (downloads,
//! memory, a queue slot) until it finished and its answer failed to send.
//! The connection's task therefore also watches the socket for the peer's
//! hang-up and, on it, drops the whole connection: the statement's future
//! with it, which aborts the statement (see `exec::Runner::run`). Tokio
//! already has the socket registered with its reactor, and a descriptor can
//! be registered only once, so the watch asks the kernel directly with a
//! zero-timeout `poll(2)` every [`HANGUP_POLL`]: one cheap system call per
//! connection per tick.

use std::os::fd::RawFd;
use std::time::Duration;

/// How often a connection's socket is checked for a hang-up: the most a
/// disconnected client's statement runs on.
pub(crate) const HANGUP_POLL: Duration = Duration::from_millis(100);

/// Resolves once the peer of `fd` has closed its side of the connection
/// (or the connection failed). `fd` must stay open while this is polled:
/// the caller drops this future before the socket.
pub(crate) async fn peer_gone(fd: RawFd) {
    let mut tick = tokio::time::interval(HANGUP_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if hung_up(fd) {
            return;
        }
    }
}

/// Whether the kernel reports the peer's FIN or an error on `fd`. Unread
/// data (a pipelined message) alone is not a hang-up.
fn hung_up(fd: RawFd) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLRDHUP, revents: 0 };
    // SAFETY: `p` is one valid pollfd for the duration of the call, and the
    // count passed is 1; a zero timeout makes the call return at once.
    let ready = unsafe { libc::poll(&mut p, 1, 0) };
    ready > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[tokio::test]
    async fn a_closed_peer_is_noticed_and_an_open_one_is_not() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        // Data waiting to be read is not a hang-up.
        client.try_write(b"Q").unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!hung_up(server.as_raw_fd()));
        assert!(tokio::time::timeout(3 * HANGUP_POLL, peer_gone(server.as_raw_fd())).await.is_err());
        drop(client);
        tokio::time::timeout(3 * HANGUP_POLL, peer_gone(server.as_raw_fd())).await.expect("the hang-up is noticed");
    }
}
