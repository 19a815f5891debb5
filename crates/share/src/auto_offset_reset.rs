//! [`ShareAutoOffsetReset`]: the group config `share.auto.offset.reset`, which says where a
//! share-partition with no persisted state starts: `earliest`, `latest` (the default) or
//! `by_duration:<ISO-8601 duration>` (KIP-1106), the first record no older than that.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::ShareError;

/// `share.auto.offset.reset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShareAutoOffsetReset {
    Earliest,
    #[default]
    Latest,
    ByDuration(Duration),
}

/// The offset the broker must look up in the log (ListOffsets' three answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetSpec {
    /// The log start offset.
    Earliest,
    /// The log end offset (the last stable offset under read_committed).
    Latest,
    /// The first offset whose timestamp is at or after this (ms); the end offset if none is.
    Timestamp(i64),
}

impl ShareAutoOffsetReset {
    /// What to look up at `now_ms`.
    pub fn spec(&self, now_ms: i64) -> ResetSpec {
        match self {
            ShareAutoOffsetReset::Earliest => ResetSpec::Earliest,
            ShareAutoOffsetReset::Latest => ResetSpec::Latest,
            ShareAutoOffsetReset::ByDuration(d) => {
                let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
                ResetSpec::Timestamp(now_ms.saturating_sub(ms))
            }
        }
    }
}

impl FromStr for ShareAutoOffsetReset {
    type Err = ShareError;

    fn from_str(s: &str) -> Result<Self, ShareError> {
        let lower = s.trim().to_ascii_lowercase();
        match lower.as_str() {
            "earliest" => Ok(ShareAutoOffsetReset::Earliest),
            "latest" => Ok(ShareAutoOffsetReset::Latest),
            _ => match lower.strip_prefix("by_duration:") {
                Some(d) => parse_iso8601_duration(d)
                    .map(ShareAutoOffsetReset::ByDuration)
                    .ok_or_else(|| {
                        ShareError::InvalidRequest(format!(
                            "share.auto.offset.reset: {s} is not a non-negative ISO-8601 duration"
                        ))
                    }),
                None => Err(ShareError::InvalidRequest(format!(
                    "share.auto.offset.reset must be earliest, latest or by_duration:<duration>, not {s}"
                ))),
            },
        }
    }
}

impl fmt::Display for ShareAutoOffsetReset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShareAutoOffsetReset::Earliest => f.write_str("earliest"),
            ShareAutoOffsetReset::Latest => f.write_str("latest"),
            ShareAutoOffsetReset::ByDuration(d) => {
                let (secs, nanos) = (d.as_secs(), d.subsec_nanos());
                if nanos == 0 {
                    write!(f, "by_duration:PT{secs}S")
                } else {
                    write!(f, "by_duration:PT{secs}.{nanos:09}S")
                }
            }
        }
    }
}

/// Java's `Duration.parse` for what Kafka accepts here: `PnDTnHnMn.nS`, every part
/// optional but one, no sign (Kafka refuses negative durations). Written by hand: it is a
/// dozen lines, and no maintained crate parses exactly Java's subset.
fn parse_iso8601_duration(s: &str) -> Option<Duration> {
    let rest = s.strip_prefix('p')?;
    let (date, time) = match rest.split_once('t') {
        Some((d, t)) if !t.is_empty() => (d, Some(t)),
        Some(_) => return None,
        None => (rest, None),
    };
    let mut secs: u64 = 0;
    let mut nanos: u32 = 0;
    let mut any = false;
    if !date.is_empty() {
        let days: u64 = date.strip_suffix('d')?.parse().ok()?;
        secs = days.checked_mul(86_400)?;
        any = true;
    }
    let mut t = time.unwrap_or("");
    for (unit, scale) in [('h', 3_600u64), ('m', 60)] {
        if let Some(i) = t.find(unit) {
            let n: u64 = t[..i].parse().ok()?;
            secs = secs.checked_add(n.checked_mul(scale)?)?;
            t = &t[i + 1..];
            any = true;
        }
    }
    if let Some(num) = t.strip_suffix('s') {
        let (whole, frac) = match num.split_once(['.', ',']) {
            Some((w, f)) => (w, f),
            None => (num, ""),
        };
        secs = secs.checked_add(whole.parse().ok()?)?;
        if !frac.is_empty() {
            if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            nanos = format!("{frac:0<9}").parse().ok()?;
        }
        any = true;
    } else if !t.is_empty() {
        return None;
    }
    any.then(|| Duration::new(secs, nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kafkas_three_forms() {
        assert_eq!("earliest".parse(), Ok(ShareAutoOffsetReset::Earliest));
        assert_eq!("LATEST".parse(), Ok(ShareAutoOffsetReset::Latest));
        assert_eq!(
            "by_duration:PT1H30M".parse(),
            Ok(ShareAutoOffsetReset::ByDuration(Duration::from_secs(5_400)))
        );
        assert_eq!(
            "by_duration:P1DT0.5S".parse(),
            Ok(ShareAutoOffsetReset::ByDuration(Duration::from_millis(
                86_400_500
            )))
        );
        for bad in [
            "none",
            "by_duration:",
            "by_duration:P",
            "by_duration:PT",
            "by_duration:-PT1S",
            "by_duration:PT1X",
        ] {
            assert!(bad.parse::<ShareAutoOffsetReset>().is_err(), "{bad}");
        }
        let d = ShareAutoOffsetReset::ByDuration(Duration::from_millis(1_500));
        assert_eq!(d.to_string().parse(), Ok(d));
    }

    #[test]
    fn by_duration_looks_back_from_now() {
        let d: ShareAutoOffsetReset = "by_duration:PT10S".parse().unwrap();
        assert_eq!(d.spec(100_000), ResetSpec::Timestamp(90_000));
        assert_eq!(ShareAutoOffsetReset::default().spec(5), ResetSpec::Latest);
    }
}
