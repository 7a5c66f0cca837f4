//! Reading the relay's HTTP endpoints (`/metrics`, `/healthz`, `/readyz`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// `GET path` on `addr`; returns the status code and the body.
pub fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())?;
    Some((code, body))
}

/// The value of the sample whose name and labels start with `series`.
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .find(|line| line.starts_with(series))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}
