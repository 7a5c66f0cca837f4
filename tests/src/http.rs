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

/// The value of the first sample named as `series` whose labels include
/// those of `series` (`name` or `name{key="value",..}`): labels the sample
/// has beyond them, such as the relay's `sink`, do not matter.
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    let (name, wanted) = split_series(series);
    metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (line_name, labels) = split_series(series);
            (line_name == name && wanted.iter().all(|label| labels.contains(label)))
                .then(|| value.parse().ok())
                .flatten()
        })
}

/// A series' name and its `key="value"` labels.
fn split_series(series: &str) -> (&str, Vec<(&str, &str)>) {
    let Some((name, rest)) = series.split_once('{') else {
        return (series, Vec::new());
    };
    let mut labels = Vec::new();
    let mut rest = rest.trim_end_matches('}');
    while let Some((key, after)) = rest.split_once("=\"") {
        let end = after.find('"').unwrap_or(after.len());
        labels.push((key.trim_start_matches(','), &after[..end]));
        rest = after.get(end + 1..).unwrap_or_default();
    }
    (name, labels)
}

#[cfg(test)]
mod tests {
    use super::sample;

    #[test]
    fn samples_match_by_name_and_the_labels_asked_for() {
        let metrics = "# TYPE outbox_failed_total counter\n\
            outbox_failed_total{sink=\"kafka\",aggregate_type=\"Order\"} 1\n\
            outbox_failed_total{sink=\"kafka\",aggregate_type=\"Invoice\"} 2\n\
            outbox_pending_rows_total 9\n\
            outbox_pending_rows{sink=\"kafka\"} 3\n";
        assert_eq!(
            sample(metrics, r#"outbox_failed_total{aggregate_type="Invoice"}"#),
            Some(2.0)
        );
        assert_eq!(
            sample(metrics, r#"outbox_failed_total{sink="kafka"}"#),
            Some(1.0)
        );
        assert_eq!(sample(metrics, "outbox_pending_rows"), Some(3.0));
        assert_eq!(
            sample(metrics, r#"outbox_failed_total{aggregate_type="Cart"}"#),
            None
        );
        assert_eq!(sample(metrics, "outbox_failed"), None);
    }
}
