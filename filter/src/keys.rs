//! Numbers and times as ordered keys: big-endian bytes of these sort as
//! the values do, so one field's numbers are one range of keys.

/// Longest keyword a field index holds, in bytes (LMDB keys are at most
/// 511 bytes); a filter's keywords are held to it too.
pub const MAX_KEYWORD_BYTES: usize = 256;

/// The key of an integer: big-endian keys of these sort as the integers.
#[inline]
pub fn ord_i64(i: i64) -> u64 {
    (i as u64) ^ (1 << 63)
}

/// The key of a float: big-endian keys of these sort as the floats
/// (`-0.0` is taken as `0.0`). Never 0 for a number JSON can hold.
#[inline]
pub fn ord_f64(f: f64) -> u64 {
    let f = if f == 0.0 { 0.0 } else { f };
    let bits = f.to_bits();
    if bits >> 63 == 1 { !bits } else { bits | (1 << 63) }
}

/// The float a key of [`ord_f64`] stands for.
pub fn f64_of(key: u64) -> f64 {
    f64::from_bits(if key >> 63 == 1 { key & !(1 << 63) } else { !key })
}

/// An RFC 3339 timestamp in microseconds since the Unix epoch.
pub fn parse_datetime(s: &str) -> Option<i64> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos().div_euclid(1000)).ok()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn keys_sort_as_their_numbers(a: i64, b: i64, x in proptest::num::f64::NORMAL | proptest::num::f64::ZERO | proptest::num::f64::SUBNORMAL,
                                      y in proptest::num::f64::NORMAL | proptest::num::f64::ZERO) {
            prop_assert_eq!(ord_i64(a).cmp(&ord_i64(b)), a.cmp(&b));
            prop_assert_eq!(ord_f64(x).partial_cmp(&ord_f64(y)), if x == y { Some(std::cmp::Ordering::Equal) } else { x.partial_cmp(&y) });
            prop_assert_ne!(ord_f64(x), 0);
            prop_assert_eq!(f64_of(ord_f64(x)), if x == 0.0 { 0.0 } else { x });
        }
    }

    #[test]
    fn times_are_rfc_3339_to_the_microsecond() {
        assert_eq!(parse_datetime("2026-12-02T11:00:00+01:00"), parse_datetime("2026-12-02T10:00:00Z"));
        assert_eq!(parse_datetime("1970-01-01T00:00:00.000001Z"), Some(1));
        assert_eq!(parse_datetime("2026-12-02"), None);
    }
}
