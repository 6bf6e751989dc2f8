//! Where a claim starts looking: the scan start of one claimer's claims (see [`ScanFrom`]).

use crate::outbox::store::Claimed;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Under a steady backlog a claim scans from the shard's start at least this often, for rows
/// a claim passed over (see [`ScanFrom`]).
const FULL_SCAN_EVERY: Duration = Duration::from_secs(1);

/// Unsettled stretches [`ScanFrom`] keeps at most; past it the two oldest merge (which only
/// keeps the scan start lower for longer).
const MAX_UNSETTLED: usize = 32;

/// Where a claim looks for never-failed rows. Rows in flight stay unpublished in the index
/// the claim walks, each costing a heap fetch, so with thousands in flight (a slow broker,
/// unique keys) scanning from the shard's start was most of a claim's cost. A claim looks
/// from the lowest seq where a row may have appeared since the claims before it looked:
/// * Past the newest row claimed (`frontier`), everything is new.
/// * Below it, a row appears when its transaction, which took its seq before rows claimed
///   already, commits after them. It was running when the claim that passed over its seq
///   looked, so it had an id below that claim's snapshot `xmax`. Such a stretch of seqs is
///   unsettled until a claim that scanned it saw every transaction below that `xmax` ended
///   (its snapshot's `xmin` at least as high): that claim took whatever they committed.
///   Seqs are handed out in time order (an identity without a cache), so a transaction that
///   had no seq yet when a claim looked takes one past every row that claim could see.
/// * After a claim that took all it asked for (a backlog), the next one goes on after its
///   last row without marking the stretch unsettled: it would rescan a whole batch of rows
///   in flight each time.
///
/// So the next claim scans from the start after any row went back or failed, and at least
/// every [`FULL_SCAN_EVERY`]: that finds a row skipped as locked, held behind another owner's
/// claim or a parked row, or passed over by a full claim, within that time. Order does not
/// depend on it: a row goes out only right behind its key's earlier versions (`prev_version`),
/// whichever claim finds them.
#[derive(Debug)]
pub struct ScanFrom {
    /// The seq after the newest row claimed; 0 before the first claim.
    frontier: i64,
    /// Stretches short claims passed over while other transactions ran, oldest first.
    unsettled: VecDeque<Unsettled>,
    last_full_scan: Instant,
    /// Rows went back: the next claim scans from the start.
    rescan_all: bool,
}

/// Seqs from `start` on that a claim passed over while transactions below `xmax` may have
/// been writing rows into them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Unsettled {
    start: i64,
    xmax: i64,
}

impl ScanFrom {
    pub fn start() -> Self {
        Self {
            frontier: 0,
            unsettled: VecDeque::new(),
            last_full_scan: Instant::now(),
            rescan_all: false,
        }
    }

    /// The seq the next claim scans from (0: the shard's start).
    pub fn next(&mut self) -> i64 {
        if self.rescan_all || self.frontier == 0 || self.last_full_scan.elapsed() >= FULL_SCAN_EVERY
        {
            self.rescan_all = false;
            self.last_full_scan = Instant::now();
            return 0;
        }
        self.unsettled
            .front()
            .map_or(self.frontier, |stretch| stretch.start)
    }

    /// After a claim from `from` that asked for `asked` rows and took `claimed`.
    pub fn claimed(&mut self, from: i64, asked: usize, claimed: &Claimed) {
        let (Some(last), Some(snapshot)) =
            (claimed.rows.iter().map(|r| r.seq).max(), claimed.snapshot)
        else {
            return;
        };
        self.unsettled
            .retain(|stretch| !(from <= stretch.start && stretch.xmax <= snapshot.xmin));
        if last < self.frontier {
            return;
        }
        let others_running = snapshot.xmin < snapshot.xmax;
        if claimed.rows.len() < asked && others_running {
            if self.unsettled.len() == MAX_UNSETTLED {
                if let (Some(oldest), Some(next)) =
                    (self.unsettled.pop_front(), self.unsettled.pop_front())
                {
                    self.unsettled.push_front(Unsettled {
                        start: oldest.start,
                        xmax: oldest.xmax.max(next.xmax),
                    });
                }
            }
            self.unsettled.push_back(Unsettled {
                start: self.frontier,
                xmax: snapshot.xmax,
            });
        }
        self.frontier = last + 1;
    }

    /// Rows went back (or failed): they and what waits behind them are below the scan start.
    pub fn rewind(&mut self) {
        self.rescan_all = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::store::{ClaimSnapshot, ClaimedRow};

    /// A claim's outcome: rows with these seqs, seen with transactions `xmin..xmax` running.
    fn claim(seqs: &[i64], xmin: i64, xmax: i64) -> Claimed {
        Claimed {
            rows: seqs
                .iter()
                .map(|&seq| ClaimedRow::for_test(seq, "a", 1))
                .collect(),
            snapshot: (!seqs.is_empty()).then_some(ClaimSnapshot { xmin, xmax }),
        }
    }

    #[test]
    fn a_full_claim_moves_the_scan_start_past_its_last_row() {
        let mut scan = ScanFrom::start();
        assert_eq!(scan.next(), 0, "the first claim scans the whole shard");
        scan.claimed(0, 2, &claim(&[5, 7], 100, 105));
        assert_eq!(scan.next(), 8);
    }

    #[test]
    fn a_short_claim_is_looked_at_again_until_the_transactions_it_saw_running_ended() {
        let mut scan = ScanFrom::start();
        scan.claimed(0, 200, &claim(&[3], 90, 90));
        assert_eq!(
            scan.next(),
            4,
            "nothing was running: nothing can appear below 4"
        );
        // Transactions 100..105 were running: one may hold a seq below 7, committing later.
        scan.claimed(4, 200, &claim(&[5, 7], 100, 105));
        assert_eq!(scan.next(), 4);
        // Still running (xmin 103 < 105): keep looking from 4; the new stretch from 8 too.
        scan.claimed(4, 200, &claim(&[9], 103, 110));
        assert_eq!(scan.next(), 4);
        // All below 105 ended, and this claim looked from 4: the first stretch is settled.
        scan.claimed(4, 200, &claim(&[6], 105, 112));
        assert_eq!(
            scan.next(),
            8,
            "the stretch after 7 waits for transactions below 110"
        );
        scan.claimed(8, 200, &claim(&[11], 110, 110));
        assert_eq!(scan.next(), 12);
    }

    #[test]
    fn a_claim_that_took_nothing_changes_nothing() {
        let mut scan = ScanFrom::start();
        scan.claimed(0, 200, &claim(&[5], 100, 105));
        scan.claimed(0, 200, &claim(&[], 0, 0));
        assert_eq!(scan.next(), 0, "the stretch from 0 is not settled yet");
    }

    #[test]
    fn a_stretch_is_settled_only_by_a_claim_that_looked_at_it() {
        let mut scan = ScanFrom::start();
        scan.claimed(0, 200, &claim(&[5], 90, 90));
        scan.claimed(6, 200, &claim(&[8], 100, 105));
        // A claim from 9 (not over 6..8) cannot have seen what committed there.
        scan.claimed(9, 200, &claim(&[10], 120, 120));
        assert_eq!(scan.next(), 6);
    }

    #[test]
    fn the_scan_starts_over_after_a_rewind_or_a_while() {
        let mut scan = ScanFrom::start();
        scan.claimed(0, 1, &claim(&[7], 100, 100));
        assert_eq!(scan.next(), 8);
        scan.rewind();
        assert_eq!(scan.next(), 0, "rows went back");
        scan.claimed(0, 1, &claim(&[9], 100, 100));
        scan.last_full_scan -= FULL_SCAN_EVERY;
        assert_eq!(scan.next(), 0, "a full scan is due");
        scan.claimed(0, 1, &claim(&[10], 100, 100));
        assert_eq!(scan.next(), 11, "and the next is a second away");
        scan.rewind();
        scan.claimed(11, 1, &claim(&[12], 100, 100));
        assert_eq!(scan.next(), 0, "rows went back while that claim ran");
    }

    #[test]
    fn unsettled_stretches_are_bounded_and_keep_the_oldest_start() {
        let mut scan = ScanFrom::start();
        scan.claimed(0, 200, &claim(&[1], 50, 50));
        for seq in 2..100 {
            scan.claimed(2, 200, &claim(&[seq], 60, 1_000 + seq));
        }
        assert_eq!(scan.unsettled.len(), MAX_UNSETTLED);
        assert_eq!(scan.next(), 2);
        scan.claimed(2, 200, &claim(&[100], 2_000, 2_000));
        assert_eq!(scan.next(), 101, "every stretch settled at once");
    }
}
