//! A follower's fetch from the leader and its answer, as decisions: records
//! from the fetch offset, or where the follower's last epoch ends on the
//! leader (divergence); and how far a diverged follower truncates.

use strand_storage::epochs::EpochHistory;
use strand_wire::{LeaderEpoch, Offset};

/// What the leader answers a follower's fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchAnswer {
    /// The follower's log agrees with the leader's up to the fetch offset:
    /// records from there.
    Records,
    /// It does not: on the leader, epoch `epoch` (the follower's last, or
    /// the largest below it the leader has) ends at `end_offset`.
    Diverging { epoch: LeaderEpoch, end_offset: Offset },
    /// The follower and this leader disagree on the current leader epoch:
    /// one of them has not learned of the last election. Nothing is
    /// answered; the follower refreshes its metadata and asks the leader
    /// it then knows. (A diverging answer from a deposed leader could cut
    /// records the new leader committed.)
    Fenced { leader_epoch: LeaderEpoch },
}

/// The answer of a leader in epoch `leader_epoch` to a fetch made in epoch
/// `fetch_epoch` (the follower's current leader epoch) at `fetch_offset`
/// (its log end) whose last batch has epoch `last_epoch` (`None`: an empty
/// log), given the leader's epoch `history` and log end. The follower must
/// apply an answer only while its leader epoch and log end are still the
/// ones it fetched with.
pub fn answer_fetch(
    leader_epoch: LeaderEpoch,
    fetch_epoch: LeaderEpoch,
    history: &EpochHistory,
    log_end: Offset,
    fetch_offset: Offset,
    last_epoch: Option<LeaderEpoch>,
) -> FetchAnswer {
    if fetch_epoch != leader_epoch {
        return FetchAnswer::Fenced { leader_epoch };
    }
    let Some(last) = last_epoch else {
        return FetchAnswer::Records;
    };
    match history.end_offset_for(last, log_end) {
        Some((epoch, end_offset)) if epoch == last && end_offset >= fetch_offset => FetchAnswer::Records,
        Some((epoch, end_offset)) => FetchAnswer::Diverging { epoch, end_offset },
        // The follower's last epoch is newer than any batch here: it wrote
        // it under a leader that lost (this one took over before appending
        // in it). Nothing past this log's end is kept.
        None => FetchAnswer::Diverging {
            epoch: history.latest().map_or(LeaderEpoch(0), |e| e.epoch),
            end_offset: log_end,
        },
    }
}

/// Where a follower truncates on a `Diverging { epoch, end_offset }`
/// answer: at the leader's end of that epoch, or at its own end of it if
/// that comes first (its log may have a gap in epochs where the leader's
/// has none), and never past its log end.
///
/// Below its high watermark too, when that is where the leader's log
/// parts from its own, as Kafka's followers do. Committed records are on
/// every ISR member, so a current leader (only one answers `Diverging`: a
/// fetch in another epoch is `Fenced`) never lacks one and this never
/// happens while that holds. Where it did not hold (a 30-minute
/// strand-chaos run met it), the leader's log is what the partition
/// serves; a follower that kept records the leader lacks would refuse
/// every later answer and stay out of the ISR for good, keeping the
/// partition under-replicated (and, under min ISR, refusing acks=all
/// writes) while holding nothing a consumer can read. The caller says so
/// loudly ([`below_high_watermark`]).
pub fn truncation_point(own: &EpochHistory, log_end: Offset, epoch: LeaderEpoch, end_offset: Offset) -> Offset {
    let own_end = own.end_offset_for(epoch, log_end).map_or(log_end, |(_, end)| end);
    end_offset.min(own_end).min(log_end)
}

/// Whether cutting at `to` drops records this replica saw committed.
pub fn below_high_watermark(to: Offset, high_watermark: Offset) -> bool {
    to < high_watermark
}

#[cfg(test)]
mod tests {
    use super::*;

    fn history(entries: &[(u32, u64)]) -> EpochHistory {
        EpochHistory::from_pairs(entries).unwrap()
    }

    /// The leader epoch of the tests' fetches.
    const E: LeaderEpoch = LeaderEpoch(3);

    #[test]
    fn a_fetch_in_another_leader_epoch_is_fenced() {
        let leader = history(&[(1, 0), (3, 10)]);
        for (here, fetch) in [(3, 2), (2, 3)] {
            assert_eq!(
                answer_fetch(
                    LeaderEpoch(here),
                    LeaderEpoch(fetch),
                    &leader,
                    Offset(20),
                    Offset(12),
                    Some(LeaderEpoch(1))
                ),
                FetchAnswer::Fenced {
                    leader_epoch: LeaderEpoch(here)
                }
            );
        }
    }

    #[test]
    fn a_follower_in_step_gets_records_and_one_that_diverged_gets_the_epoch_end() {
        let leader = history(&[(1, 0), (3, 10)]);
        let end = Offset(20);
        assert_eq!(answer_fetch(E, E, &leader, end, Offset(0), None), FetchAnswer::Records);
        assert_eq!(
            answer_fetch(E, E, &leader, end, Offset(15), Some(LeaderEpoch(3))),
            FetchAnswer::Records
        );
        assert_eq!(
            answer_fetch(E, E, &leader, end, Offset(8), Some(LeaderEpoch(1))),
            FetchAnswer::Records
        );
        // Epoch 1 ran to 12 on the follower but ended at 10 here.
        assert_eq!(
            answer_fetch(E, E, &leader, end, Offset(12), Some(LeaderEpoch(1))),
            FetchAnswer::Diverging {
                epoch: LeaderEpoch(1),
                end_offset: Offset(10)
            }
        );
        // Epoch 2 never happened here: epoch 1's end.
        assert_eq!(
            answer_fetch(E, E, &leader, end, Offset(12), Some(LeaderEpoch(2))),
            FetchAnswer::Diverging {
                epoch: LeaderEpoch(1),
                end_offset: Offset(10)
            }
        );
        // Ahead of the leader in its own epoch.
        assert_eq!(
            answer_fetch(E, E, &leader, end, Offset(25), Some(LeaderEpoch(3))),
            FetchAnswer::Diverging {
                epoch: LeaderEpoch(3),
                end_offset: end
            }
        );
    }

    #[test]
    fn truncation_stops_at_the_first_end_and_follows_the_leader_below_the_high_watermark() {
        // The follower wrote epoch 2 from 10 to 14 under a leader that lost.
        let own = history(&[(1, 0), (2, 10)]);
        let end = Offset(14);
        assert_eq!(truncation_point(&own, end, LeaderEpoch(1), Offset(10)), Offset(10));
        // The leader's epoch 1 ran further than the follower's own.
        assert_eq!(truncation_point(&own, end, LeaderEpoch(1), Offset(12)), Offset(10));
        // Never past its own end.
        assert_eq!(truncation_point(&own, end, LeaderEpoch(2), Offset(30)), end);
        // The leader's log parts from this one below its high watermark
        // (11): it follows the leader, and that is said.
        let to = truncation_point(&own, end, LeaderEpoch(1), Offset(10));
        assert_eq!(to, Offset(10));
        assert!(below_high_watermark(to, Offset(11)));
        assert!(!below_high_watermark(to, Offset(10)));
    }
}
