//! Database connections that send each statement at once (`TCP_NODELAY`).
//!
//! sqlx 0.9.0 leaves Nagle's algorithm on for its TCP connections (sqlx
//! issue 4335; later releases set the option again). A statement that
//! leaves in more than one write, such as any statement over one TLS record
//! (16 KiB: a claim ahead naming the 2,000 rows in flight, a settle marking
//! 2,000 ids), then has its last part held back until the server
//! acknowledges the first, and the server delays that acknowledgement by up
//! to 40 ms while it waits for the rest: two such stalls in every batch
//! made a relay on a TLS connection (`sslmode=prefer`, the default, with a
//! server that offers TLS) three times slower at 2,000-row batches.
//!
//! sqlx gives no access to its sockets, so each pool of the relay calls
//! [`set_on_database_sockets`] on every new connection: it finds the
//! process's TCP sockets connected to the database's port through the
//! descriptor table (`/proc/self/fd`, or `/dev/fd`) and sets the option on
//! them, as libpq and the MySQL client library do for theirs. Elsewhere
//! than on Unix it does nothing.

use sqlx::pool::PoolOptions;
use sqlx::{Database, Error};

/// `options` with [`set_on_database_sockets`] run for each new connection
/// to `port`, for a pool that has no `after_connect` of its own.
pub(crate) fn pool_options<DB: Database>(options: PoolOptions<DB>, port: u16) -> PoolOptions<DB> {
    options.after_connect(move |_, _| {
        Box::pin(async move {
            set_on_database_sockets(port);
            Ok::<(), Error>(())
        })
    })
}

/// Sets `TCP_NODELAY` on this process's TCP sockets connected to `port`
/// (a database's), among them the connection just opened. Failures are
/// ignored: a socket that went away meanwhile needs nothing, and a
/// connection left with Nagle's algorithm is slower, not wrong.
#[cfg(unix)]
pub(crate) fn set_on_database_sockets(port: u16) {
    use std::os::fd::{BorrowedFd, RawFd};

    let Ok(entries) = std::fs::read_dir("/proc/self/fd").or_else(|_| std::fs::read_dir("/dev/fd"))
    else {
        return;
    };
    let fds: Vec<RawFd> = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    for fd in fds {
        // SAFETY: the descriptor is only borrowed for the calls below,
        // which read and set socket options and never close it. Another
        // thread may close it meanwhile: the calls then fail (and are
        // ignored), or apply to the descriptor that took its number, which
        // is changed only if it too is a TCP socket to the database's port.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let socket = socket2::SockRef::from(&fd);
        let to_database = socket
            .peer_addr()
            .ok()
            .and_then(|peer| peer.as_socket())
            .is_some_and(|peer| peer.port() == port)
            && socket
                .r#type()
                .is_ok_and(|kind| kind == socket2::Type::STREAM);
        if to_database && !socket.tcp_nodelay().unwrap_or(true) {
            let _ = socket.set_tcp_nodelay(true);
        }
    }
}

/// Does nothing: descriptors are not listed here.
#[cfg(not(unix))]
pub(crate) fn set_on_database_sockets(_port: u16) {}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn sockets_to_the_port_send_at_once_and_others_are_left_alone() {
        let database = TcpListener::bind("127.0.0.1:0").expect("a listener");
        let other = TcpListener::bind("127.0.0.1:0").expect("a listener");
        let port = database.local_addr().expect("its address").port();
        let to_database = TcpStream::connect(database.local_addr().unwrap()).unwrap();
        let to_other = TcpStream::connect(other.local_addr().unwrap()).unwrap();
        assert!(
            !to_database.nodelay().unwrap(),
            "Nagle's algorithm is on by default"
        );

        set_on_database_sockets(port);

        assert!(to_database.nodelay().unwrap());
        assert!(!to_other.nodelay().unwrap());
    }
}
