//! Deadlines that travel with a call: gRPC's `grpc-timeout` header, which
//! tonic's `Request::set_timeout` writes and its server enforces by dropping
//! the handler. A handler that hands work to another thread reads it here,
//! so that the work stops at the same moment.

use std::time::Duration;

use tonic::metadata::MetadataMap;

/// The time left that a request's `grpc-timeout` header gives, if any.
pub fn timeout_of(metadata: &MetadataMap) -> Option<Duration> {
    parse(metadata.get("grpc-timeout")?.to_str().ok()?)
}

/// `grpc-timeout` is at most 8 digits and a unit (H, M, S, m, u, n).
fn parse(v: &str) -> Option<Duration> {
    if v.len() < 2 || v.len() > 9 {
        return None;
    }
    let (digits, unit) = v.split_at(v.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_and_nonsense_does_not() {
        assert_eq!(parse("1500m"), Some(Duration::from_millis(1500)));
        assert_eq!(parse("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse("3H"), Some(Duration::from_secs(3 * 3600)));
        assert_eq!(parse("10u"), Some(Duration::from_micros(10)));
        for bad in ["", "m", "12", "1x", "-1S", "123456789S"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
        let mut req = tonic::Request::new(());
        req.set_timeout(Duration::from_millis(250));
        assert_eq!(timeout_of(req.metadata()), Some(Duration::from_millis(250)));
    }
}
