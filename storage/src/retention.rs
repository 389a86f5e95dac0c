//! Retention as a pure function: (policy, segments, now) → the offset below
//! which whole sealed segments may be deleted. The log applies the cut.
//!
//! Runs on: every shard, periodically for each of its logs, and in a log's
//! roll (which recycles the largest expired segment's file: `log::write`).

use crate::Offset;

/// How long and how much a log keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetentionPolicy {
    /// Delete a sealed segment once its newest record is older than this.
    pub time_ms: Option<u64>,
    /// Delete the oldest sealed segments while the log is larger than this.
    pub bytes: Option<u64>,
}

/// What retention needs to know about a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentSummary {
    pub base: Offset,
    pub size: u64,
    /// `None` for an empty segment.
    pub max_timestamp: Option<i64>,
}

/// The base offset of the first segment to keep, when some sealed segments
/// are past the policy; `None` when nothing is to be deleted. `sealed` are
/// the sealed segments oldest first; the active segment (`active_base`,
/// `active_size`) is never deleted.
pub fn cut_offset(
    policy: RetentionPolicy,
    sealed: &[SegmentSummary],
    active_base: Offset,
    active_size: u64,
    now_ms: i64,
) -> Option<Offset> {
    let mut drop_count = 0;
    if let Some(time_ms) = policy.time_ms {
        let horizon = now_ms.saturating_sub(i64::try_from(time_ms).unwrap_or(i64::MAX));
        drop_count = sealed
            .iter()
            .take_while(|s| s.max_timestamp.is_none_or(|t| t < horizon))
            .count();
    }
    if let Some(limit) = policy.bytes {
        let mut total: u64 = sealed.iter().map(|s| s.size).sum::<u64>() + active_size;
        let mut n = 0;
        for s in sealed {
            if total <= limit {
                break;
            }
            total -= s.size;
            n += 1;
        }
        drop_count = drop_count.max(n);
    }
    (drop_count > 0).then(|| sealed.get(drop_count).map_or(active_base, |s| s.base))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segs() -> Vec<SegmentSummary> {
        (0..4u64)
            .map(|i| SegmentSummary {
                base: Offset(i * 100),
                size: 1000,
                max_timestamp: Some(i as i64 * 10),
            })
            .collect()
    }

    #[test]
    fn time_cuts_the_expired_prefix_only() {
        let p = RetentionPolicy {
            time_ms: Some(15),
            bytes: None,
        };
        // now 40: horizon 25, segments with max ts 0, 10, 20 are expired.
        assert_eq!(cut_offset(p, &segs(), Offset(400), 10, 40), Some(Offset(300)));
        // A younger segment in front stops the cut even if later ones are old.
        let mut s = segs();
        s[0].max_timestamp = Some(1000);
        assert_eq!(cut_offset(p, &s, Offset(400), 10, 40), None);
        // Everything sealed expired: cut at the active segment, never past it.
        assert_eq!(cut_offset(p, &segs(), Offset(400), 10, 10_000), Some(Offset(400)));
    }

    #[test]
    fn size_cuts_oldest_until_under_the_limit() {
        let p = RetentionPolicy {
            time_ms: None,
            bytes: Some(2500),
        };
        // 4×1000 + 100 = 4100 → drop two (2100 ≤ 2500).
        assert_eq!(cut_offset(p, &segs(), Offset(400), 100, 0), Some(Offset(200)));
        let p = RetentionPolicy {
            time_ms: None,
            bytes: Some(10),
        };
        assert_eq!(cut_offset(p, &segs(), Offset(400), 100, 0), Some(Offset(400)));
        let p = RetentionPolicy {
            time_ms: None,
            bytes: Some(1 << 40),
        };
        assert_eq!(cut_offset(p, &segs(), Offset(400), 100, 0), None);
        assert_eq!(
            cut_offset(RetentionPolicy::default(), &segs(), Offset(400), 100, 0),
            None
        );
    }
}
