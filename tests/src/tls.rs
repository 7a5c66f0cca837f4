//! A MariaDB server of the test's own that accepts TLS connections only.
//!
//! The machine's MariaDB serves no TLS, so a test of TLS towards MariaDB
//! starts its own `mariadbd` (the same installed server) on a free port,
//! with a fresh data directory, the system's snakeoil certificate (issued
//! to `localhost`) and `require_secure_transport`: a plain connection is
//! refused, so any connection that works is encrypted. The server is
//! stopped and its directory removed when the value is dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::kafka::free_port;

/// The certificate the test servers present, self-signed, for `localhost`.
pub const SERVER_CERT: &str = "/etc/ssl/certs/ssl-cert-snakeoil.pem";
/// Its key (readable by root and the `ssl-cert` group).
pub const SERVER_KEY: &str = "/etc/ssl/private/ssl-cert-snakeoil.key";

/// A running TLS-only MariaDB with an empty database `test`.
pub struct TlsMariaDb {
    child: Child,
    dir: PathBuf,
    /// The TCP port it listens on (127.0.0.1).
    pub port: u16,
}

impl TlsMariaDb {
    /// Initialises a data directory and starts the server; panics with the
    /// server's log if it does not come up within 60 s.
    pub fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("outbox-mariadb-tls-{}", uuid::Uuid::now_v7()));
        let data = dir.join("data");
        std::fs::create_dir_all(&dir).expect("create the server's directory");
        let status = Command::new("mariadb-install-db")
            .args([
                "--no-defaults",
                "--user=root",
                "--auth-root-authentication-method=normal",
            ])
            .args(["--skip-test-db", &format!("--datadir={}", data.display())])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run mariadb-install-db (package mariadb-server)");
        assert!(status.success(), "mariadb-install-db failed");
        let port = free_port();
        let log = dir.join("error.log");
        let child = Command::new("mariadbd")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .args(["--user=root", "--bind-address=127.0.0.1"])
            .arg(format!("--port={port}"))
            .arg(format!("--socket={}", dir.join("sock").display()))
            .arg(format!("--pid-file={}", dir.join("pid").display()))
            .arg(format!("--log-error={}", log.display()))
            .arg(format!("--ssl-cert={SERVER_CERT}"))
            .arg(format!("--ssl-key={SERVER_KEY}"))
            .args([
                "--require-secure-transport=ON",
                "--innodb-buffer-pool-size=16M",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mariadbd");
        let server = Self { child, dir, port };
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::fs::read_to_string(&log)
            .map_or(true, |text| !text.contains("ready for connections"))
        {
            assert!(
                Instant::now() < deadline,
                "the TLS MariaDB did not start: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // The local socket counts as secure transport.
        let status = Command::new("mariadb")
            .args(["--no-defaults", "-uroot"])
            .arg(format!("--socket={}", server.dir.join("sock").display()))
            .args(["-e", "CREATE DATABASE test"])
            .status()
            .expect("run the mariadb client");
        assert!(status.success(), "cannot create database test");
        server
    }

    /// A URL for database `test` as root, by `host`, with `query` (the TLS
    /// settings).
    pub fn url(&self, host: &str, query: &str) -> String {
        format!("mysql://root@{host}:{}/test?{query}", self.port)
    }
}

impl Drop for TlsMariaDb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
