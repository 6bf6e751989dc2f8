//! Where a claim starts looking: the scan start of one claimer's claims (see [`ScanFrom`]).

use crate::relay::floor::Floor;
use crate::relay::store::{Claimed, FloorLook};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Under a steady backlog a claim scans from the floor at least this often, for rows a claim
/// passed over (see [`ScanFrom`]).
const FULL_SCAN_EVERY: Duration = Duration::from_secs(1);

/// However the floor is kept, a full scan from the shard's start this often: a safety net for a
/// row the floor passed while no look could see it, which the append's order (a transaction
/// id before any seq, insert_events.sql) rules out for rows written through `Outbox::append`.
/// Such a scan walks every index entry a pinned xmin horizon keeps, so it waits while the
/// horizon is held (see [`ScanFrom::horizon_held`]) and runs as soon as it is released.
const RESCAN_ALL_EVERY: Duration = Duration::from_secs(600);

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
///   looked, so it had an id below that claim's `next_xid`. Such a stretch of seqs is
///   unsettled until a claim that scanned it saw every transaction below that `next_xid`
///   ended (its snapshot's `xmin` at least as high): that claim took whatever they committed.
///   Seqs are handed out in time order (an identity without a cache), so a transaction that
///   had no seq yet when a claim looked takes one past every row that claim could see.
/// * After a claim that took all it asked for (a backlog), the next one goes on after its
///   last row without marking the stretch unsettled: it would rescan a whole batch of rows
///   in flight each time.
///
/// So the next claim is a full scan after rows went back or failed, and at least every
/// [`FULL_SCAN_EVERY`]: that finds a row skipped as locked, held behind another owner's claim,
/// or passed over by a full claim, within that time. A full scan starts at the `floor`, not at
/// the shard's start: while a long transaction pins the xmin horizon, every row published
/// since the pin leaves an index entry the scan cannot skip, and a scan from the start walked
/// all of them every second (P9). Below the floor every never-failed row is published, in
/// flight with this claimer, or waiting behind a parked row of its key. A floor query before
/// each full scan finds the next floor; it holds only once the transactions running when it
/// looked have ended (one may commit a row below it), so it waits one full scan as `pending`,
/// and the looks meanwhile start where such a transaction's rows can be ([`Floor::look_from`]).
/// Rows going back lower the floor to their seq ([`ScanFrom::rewind_to`]); a row behind a
/// parked one is found once that one is published ([`ScanFrom::rewind_to`] its seq) or by an
/// operator's action ([`ScanFrom::rescan_all`]). Order does not depend on any of it: a row
/// goes out only right behind its key's previous version (`prev_version`), whichever claim
/// finds them.
#[derive(Debug)]
pub struct ScanFrom {
    /// The seq after the newest row claimed; 0 before the first claim.
    frontier: i64,
    /// Where full scans start (see above).
    floor: Floor,
    /// Counts rewinds: a floor query started before one may not raise the floor past the rows
    /// that went back.
    rewinds: u64,
    /// Stretches short claims passed over while other transactions ran, oldest first.
    unsettled: VecDeque<Unsettled>,
    last_full_scan: Instant,
    /// The last full scan from the shard's start.
    last_rescan_all: Instant,
    /// The xmin horizon was held back when last sampled: the timed scan from the start waits.
    horizon_held: bool,
    /// Rows went back: the next claim is a full scan.
    full_scan_due: bool,
}

/// Where the next claim looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// From this seq on.
    From(i64),
    /// A full scan: find the floor with a floor query from `look_from` on (the floor, or above
    /// it: [`Floor::look_from`]), then claim from what it found or from `regular`, whichever
    /// is lower (`i64::MAX`: nothing claimed yet). `rewinds` goes back with what the floor
    /// query found ([`ScanFrom::floor_found`]).
    Full {
        look_from: i64,
        regular: i64,
        rewinds: u64,
    },
}

/// Seqs from `start` on that a claim passed over while transactions below `next_xid` may
/// have been writing rows into them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Unsettled {
    start: i64,
    next_xid: i64,
}

impl ScanFrom {
    pub fn start() -> Self {
        Self {
            frontier: 0,
            floor: Floor::start(),
            rewinds: 0,
            unsettled: VecDeque::new(),
            last_full_scan: Instant::now(),
            last_rescan_all: Instant::now(),
            horizon_held: false,
            full_scan_due: false,
        }
    }

    /// Whether the xmin horizon is held back (sampled by the shard owner, `horizon::Horizon::
    /// is_held`). While it is, the timed scan from the shard's start waits: it would walk the
    /// entry of every row published since the horizon was pinned, a cost that grows with the
    /// pin (P9), to look for rows the floor's reasoning says cannot be there. It runs once the
    /// horizon is released; an operator's action still scans from the start at once.
    pub fn horizon_held(&mut self, held: bool) {
        self.horizon_held = held;
    }

    /// Where the next claim looks.
    pub fn next(&mut self) -> Scan {
        if !self.horizon_held && self.last_rescan_all.elapsed() >= RESCAN_ALL_EVERY {
            self.rescan_all();
        }
        let regular = self
            .unsettled
            .front()
            .map_or(self.frontier, |stretch| stretch.start);
        if self.full_scan_due
            || self.frontier == 0
            || self.last_full_scan.elapsed() >= FULL_SCAN_EVERY
        {
            self.full_scan_due = false;
            self.last_full_scan = Instant::now();
            return Scan::Full {
                look_from: self.floor.look_from(),
                regular: if self.frontier == 0 {
                    i64::MAX
                } else {
                    regular
                },
                rewinds: self.rewinds,
            };
        }
        Scan::From(regular)
    }

    /// What the floor query of the full scan handed out with `rewinds` saw ([`Floor::found`]);
    /// a query that began before rows went back only bounds the next one.
    pub fn floor_found(&mut self, rewinds: u64, look: FloorLook) {
        if rewinds == self.rewinds {
            self.floor.found(&look);
        } else {
            self.floor.saw_next_seq(&look);
        }
    }

    /// After a claim from `from` that asked for `asked` rows and took `claimed`.
    pub fn claimed(&mut self, from: i64, asked: usize, claimed: &Claimed) {
        let (Some(last), Some(snapshot)) =
            (claimed.rows.iter().map(|r| r.seq).max(), claimed.snapshot)
        else {
            return;
        };
        self.floor.saw_visible(snapshot.next_xid, last);
        self.unsettled
            .retain(|stretch| !(from <= stretch.start && stretch.next_xid <= snapshot.xmin));
        if last < self.frontier {
            return;
        }
        let others_running = snapshot.xmin < snapshot.next_xid;
        if claimed.rows.len() < asked && others_running {
            if self.unsettled.len() == MAX_UNSETTLED {
                if let (Some(oldest), Some(next)) =
                    (self.unsettled.pop_front(), self.unsettled.pop_front())
                {
                    self.unsettled.push_front(Unsettled {
                        start: oldest.start,
                        next_xid: oldest.next_xid.max(next.next_xid),
                    });
                }
            }
            self.unsettled.push_back(Unsettled {
                start: self.frontier,
                next_xid: snapshot.next_xid,
            });
        }
        self.frontier = last + 1;
    }

    /// The next claim is a full scan from the floor (a claim failed: nothing changed below).
    pub fn rewind(&mut self) {
        self.full_scan_due = true;
    }

    /// Rows from `seq` on may be claimable again (rows went back, or a parked row was published
    /// and its key's later versions may go): the floor goes down to `seq`, and the next claim
    /// is a full scan.
    pub fn rewind_to(&mut self, seq: i64) {
        self.floor.lower_to(seq);
        self.rewinds += 1;
        self.full_scan_due = true;
    }

    /// Where full scans start: below it every never-failed row is published, in flight with
    /// this claimer, or waiting behind a parked row of its key.
    pub fn floor(&self) -> i64 {
        self.floor.get()
    }

    /// Anything may be claimable again (an operator retried or skipped a dead row, or wakes
    /// may have been lost): the next claim is a full scan from the shard's start.
    pub fn rescan_all(&mut self) {
        self.last_rescan_all = Instant::now();
        self.rewind_to(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::store::{ClaimSnapshot, ClaimedRow};

    /// A floor query that saw a claimable row at `lowest`, with transactions `xmin..next_xid`
    /// running.
    fn seen(lowest: i64, xmin: i64, next_xid: i64) -> FloorLook {
        FloorLook {
            lowest: Some(lowest),
            next_seq: lowest,
            snapshot: ClaimSnapshot { xmin, next_xid },
        }
    }

    /// A floor query that saw no claimable row and then read `next_seq` from the sequence.
    fn saw_none(next_seq: i64, xmin: i64, next_xid: i64) -> FloorLook {
        FloorLook {
            lowest: None,
            next_seq,
            snapshot: ClaimSnapshot { xmin, next_xid },
        }
    }

    /// Where the claimer would claim from (a full scan: from the floor it holds).
    fn start(scan: &mut ScanFrom) -> i64 {
        match scan.next() {
            Scan::From(seq) => seq,
            Scan::Full {
                look_from, regular, ..
            } => look_from.min(regular),
        }
    }

    fn full_scan(scan: &mut ScanFrom) -> (i64, u64) {
        scan.last_full_scan -= FULL_SCAN_EVERY;
        match scan.next() {
            Scan::Full {
                look_from, rewinds, ..
            } => (look_from, rewinds),
            other => panic!("expected a full scan, got {other:?}"),
        }
    }

    /// A claim's outcome: rows with these seqs, seen with transactions `xmin..next_xid` running.
    fn claim(seqs: &[i64], xmin: i64, next_xid: i64) -> Claimed {
        Claimed {
            rows: seqs
                .iter()
                .map(|&seq| ClaimedRow::for_test(seq, "a", 1))
                .collect(),
            snapshot: (!seqs.is_empty()).then_some(ClaimSnapshot { xmin, next_xid }),
        }
    }

    #[test]
    fn a_full_claim_moves_the_scan_start_past_its_last_row() {
        let mut scan = ScanFrom::start();
        assert_eq!(start(&mut scan), 0, "the first claim scans the whole shard");
        scan.claimed(0, 2, &claim(&[5, 7], 100, 105));
        assert_eq!(start(&mut scan), 8);
    }

    #[test]
    fn a_short_claim_is_looked_at_again_until_the_transactions_it_saw_running_ended() {
        let mut scan = ScanFrom::start();
        scan.claimed(0, 200, &claim(&[3], 90, 90));
        assert_eq!(
            start(&mut scan),
            4,
            "nothing was running: nothing can appear below 4"
        );
        // Transactions 100..105 were running: one may hold a seq below 7, committing later.
        scan.claimed(4, 200, &claim(&[5, 7], 100, 105));
        assert_eq!(start(&mut scan), 4);
        // Still running (xmin 103 < 105): keep looking from 4; the new stretch from 8 too.
        scan.claimed(4, 200, &claim(&[9], 103, 110));
        assert_eq!(start(&mut scan), 4);
        // All below 105 ended, and this claim looked from 4: the first stretch is settled.
        scan.claimed(4, 200, &claim(&[6], 105, 112));
        assert_eq!(
            start(&mut scan),
            8,
            "the stretch after 7 waits for transactions below 110"
        );
        scan.claimed(8, 200, &claim(&[11], 110, 110));
        assert_eq!(start(&mut scan), 12);
    }

    #[test]
    fn a_claim_that_took_nothing_changes_nothing() {
        let mut scan = ScanFrom::start();
        scan.claimed(0, 200, &claim(&[5], 100, 105));
        scan.claimed(0, 200, &claim(&[], 0, 0));
        assert_eq!(start(&mut scan), 0, "the stretch from 0 is not settled yet");
    }

    #[test]
    fn a_stretch_is_settled_only_by_a_claim_that_looked_at_it() {
        let mut scan = ScanFrom::start();
        scan.claimed(0, 200, &claim(&[5], 90, 90));
        scan.claimed(6, 200, &claim(&[8], 100, 105));
        // A claim from 9 (not over 6..8) cannot have seen what committed there.
        scan.claimed(9, 200, &claim(&[10], 120, 120));
        assert_eq!(start(&mut scan), 6);
    }

    #[test]
    fn the_scan_starts_over_after_a_rewind_or_a_while() {
        let mut scan = ScanFrom::start();
        scan.claimed(0, 1, &claim(&[7], 100, 100));
        assert_eq!(start(&mut scan), 8);
        scan.rewind();
        assert_eq!(start(&mut scan), 0, "rows went back");
        scan.claimed(0, 1, &claim(&[9], 100, 100));
        scan.last_full_scan -= FULL_SCAN_EVERY;
        assert_eq!(start(&mut scan), 0, "a full scan is due");
        scan.claimed(0, 1, &claim(&[10], 100, 100));
        assert_eq!(start(&mut scan), 11, "and the next is a second away");
        scan.rewind();
        scan.claimed(11, 1, &claim(&[12], 100, 100));
        assert_eq!(start(&mut scan), 0, "rows went back while that claim ran");
    }

    #[test]
    fn unsettled_stretches_are_bounded_and_keep_the_oldest_start() {
        let mut scan = ScanFrom::start();
        scan.claimed(0, 200, &claim(&[1], 50, 50));
        for seq in 2..100 {
            scan.claimed(2, 200, &claim(&[seq], 60, 1_000 + seq));
        }
        assert_eq!(scan.unsettled.len(), MAX_UNSETTLED);
        assert_eq!(start(&mut scan), 2);
        scan.claimed(2, 200, &claim(&[100], 2_000, 2_000));
        assert_eq!(start(&mut scan), 101, "every stretch settled at once");
    }

    #[test]
    fn a_full_scan_starts_at_a_floor_found_once_the_transactions_then_running_ended() {
        let mut scan = ScanFrom::start();
        // Transactions 50..95 were running at this claim: they may take seqs below 100.
        scan.claimed(0, 10, &claim(&[100, 101], 50, 95));
        let (floor, rewinds) = full_scan(&mut scan);
        assert_eq!(floor, 0);
        // Nothing claimable below 102 as transactions 60..70 ran: one may commit below it.
        scan.floor_found(rewinds, seen(102, 60, 70));
        assert_eq!(
            full_scan(&mut scan).0,
            0,
            "transactions below 70 may still write"
        );
        scan.floor_found(rewinds, seen(150, 65, 80));
        assert_eq!(full_scan(&mut scan).0, 0, "65 may still write below 102");
        // All below 70 ended, and this look from 0 found a row at 90 they committed.
        scan.floor_found(rewinds, seen(90, 70, 85));
        assert_eq!(full_scan(&mut scan).0, 90);
        scan.floor_found(rewinds, seen(160, 85, 90));
        assert_eq!(
            scan.floor(),
            90,
            "the pending floor never goes above what was found then"
        );
        scan.floor_found(rewinds, seen(170, 90, 95));
        assert_eq!(scan.floor(), 160);
    }

    #[test]
    fn a_look_starts_above_the_floor_where_the_writers_it_waits_for_took_their_seqs() {
        let mut scan = ScanFrom::start();
        // Every transaction from id 50 on took its seqs after this claim saw row 101.
        scan.claimed(0, 10, &claim(&[100, 101], 40, 50));
        let (_, rewinds) = full_scan(&mut scan);
        scan.floor_found(rewinds, seen(102, 60, 70));
        assert_eq!(scan.floor(), 0, "transactions 60..70 may still write");
        let (look_from, rewinds) = full_scan(&mut scan);
        assert_eq!(look_from, 102, "but only above 101");
        scan.claimed(102, 10, &claim(&(102..=110).collect::<Vec<_>>(), 60, 75));
        // 65 still runs: the pending floor waits, and so does where looks start.
        scan.floor_found(rewinds, seen(111, 65, 80));
        let (look_from, rewinds) = full_scan(&mut scan);
        assert_eq!((scan.floor(), look_from), (0, 102));
        // All below 70 ended; one of them committed row 105 late.
        scan.floor_found(rewinds, seen(105, 70, 85));
        assert_eq!(scan.floor(), 102);
        let (look_from, rewinds) = full_scan(&mut scan);
        assert_eq!(
            look_from, 103,
            "transactions from 70 on took their seqs after the look that found 102"
        );
        scan.floor_found(rewinds, seen(130, 85, 90));
        assert_eq!(scan.floor(), 105);
        assert_eq!(
            full_scan(&mut scan).0,
            112,
            "transactions from 85 on began after the look that saw row 111"
        );
    }

    #[test]
    fn rows_going_back_lower_where_the_next_look_starts() {
        let mut scan = ScanFrom::start();
        scan.claimed(0, 10, &claim(&[100, 101], 40, 50));
        let (_, rewinds) = full_scan(&mut scan);
        scan.floor_found(rewinds, seen(102, 60, 70));
        assert_eq!(full_scan(&mut scan).0, 102);
        scan.rewind_to(101);
        assert_eq!(
            full_scan(&mut scan).0,
            101,
            "row 101 may be claimable again"
        );
        let mut scan = ScanFrom::start();
        scan.claimed(0, 10, &claim(&[100, 101], 40, 50));
        let (_, rewinds) = full_scan(&mut scan);
        scan.floor_found(rewinds, seen(150, 40, 50));
        assert_eq!(
            full_scan(&mut scan).0,
            0,
            "nothing remembered from before transaction 40 began: from the floor"
        );
        scan.claimed(150, 10, &claim(&(150..=155).collect::<Vec<_>>(), 55, 58));
        let (_, rewinds) = full_scan(&mut scan);
        scan.floor_found(rewinds, seen(160, 60, 70));
        assert_eq!((scan.floor(), full_scan(&mut scan).0), (150, 156));
        scan.rewind_to(153);
        assert_eq!(
            (scan.floor(), full_scan(&mut scan).0),
            (150, 153),
            "between the floor and where looks started"
        );
    }

    #[test]
    fn rows_going_back_lower_the_floor_and_void_a_floor_query_started_before() {
        let mut scan = ScanFrom::start();
        scan.claimed(0, 10, &claim(&[100], 50, 50));
        let (_, rewinds) = full_scan(&mut scan);
        scan.floor_found(rewinds, seen(101, 60, 60));
        let (_, rewinds) = full_scan(&mut scan);
        scan.floor_found(rewinds, seen(101, 60, 60));
        assert_eq!(full_scan(&mut scan).0, 101);
        // A floor query starts; row 100 goes back (given back untried) while it runs.
        let (_, stale) = full_scan(&mut scan);
        scan.rewind_to(100);
        assert_eq!(
            start(&mut scan),
            100,
            "the next claim is a full scan from 100"
        );
        scan.floor_found(stale, seen(200, 70, 70));
        let (floor, rewinds) = full_scan(&mut scan);
        assert_eq!(
            floor, 100,
            "a look from before the rewind may have missed row 100"
        );
        assert_ne!(rewinds, stale);
        scan.rescan_all();
        assert_eq!(
            start(&mut scan),
            0,
            "an operator's action: from the shard's start"
        );
    }

    #[test]
    fn a_while_after_the_last_scan_from_the_start_the_next_full_scan_starts_there_again() {
        let mut scan = ScanFrom::start();
        scan.claimed(0, 10, &claim(&[100], 50, 50));
        for _ in 0..2 {
            let (_, rewinds) = full_scan(&mut scan);
            scan.floor_found(rewinds, seen(101, 60, 60));
        }
        assert_eq!(full_scan(&mut scan).0, 101);
        scan.last_rescan_all -= RESCAN_ALL_EVERY;
        assert_eq!(start(&mut scan), 0, "the catch-all scan from the start");
        assert_eq!(
            start(&mut scan),
            101,
            "and not again until the next interval"
        );
    }

    #[test]
    fn the_timed_scan_from_the_start_waits_while_the_horizon_is_held() {
        let mut scan = ScanFrom::start();
        scan.claimed(0, 10, &claim(&[100], 50, 50));
        for _ in 0..2 {
            let (_, rewinds) = full_scan(&mut scan);
            scan.floor_found(rewinds, seen(101, 60, 60));
        }
        scan.horizon_held(true);
        scan.last_rescan_all -= RESCAN_ALL_EVERY * 3;
        assert_eq!(full_scan(&mut scan).0, 101, "held: from the floor");
        scan.rescan_all();
        assert_eq!(
            start(&mut scan),
            0,
            "an operator's action does not wait for the horizon"
        );
        scan.last_rescan_all -= RESCAN_ALL_EVERY;
        scan.claimed(0, 10, &claim(&[102], 70, 70));
        for _ in 0..2 {
            let (_, rewinds) = full_scan(&mut scan);
            scan.floor_found(rewinds, seen(103, 70, 70));
        }
        assert_eq!(full_scan(&mut scan).0, 103);
        scan.horizon_held(false);
        assert_eq!(
            start(&mut scan),
            0,
            "released: the overdue scan runs at once"
        );
    }

    #[test]
    fn a_floor_never_passes_rows_whose_transaction_began_as_the_look_took_its_snapshot() {
        let mut scan = ScanFrom::start();
        let (_, rewinds) = full_scan(&mut scan);
        scan.floor_found(rewinds, saw_none(1, 100, 100));
        // Transaction 100 takes its id just after this look's snapshot (so it is not counted
        // as running) and seqs 1..=1000 before the look reads the sequence.
        let (_, rewinds) = full_scan(&mut scan);
        scan.floor_found(rewinds, saw_none(1_001, 100, 100));
        // The next look sees 100 running; the one after sees its rows.
        let (floor, rewinds) = full_scan(&mut scan);
        assert_eq!(floor, 0);
        scan.floor_found(rewinds, saw_none(1_001, 100, 101));
        let (floor, rewinds) = full_scan(&mut scan);
        assert!(
            floor <= 4,
            "the floor passed transaction 100's rows: {floor}"
        );
        scan.floor_found(rewinds, seen(4, 101, 101));
        assert_eq!(full_scan(&mut scan).0, 4);
    }

    #[test]
    fn an_idle_shard_floor_follows_the_sequence_one_look_behind() {
        let mut scan = ScanFrom::start();
        for (next_seq, xid) in [(10, 50), (20, 60), (30, 70), (40, 80)] {
            let (_, rewinds) = full_scan(&mut scan);
            scan.floor_found(rewinds, saw_none(next_seq, xid, xid));
        }
        assert_eq!(
            full_scan(&mut scan).0,
            20,
            "the floor read two looks back, applied one look later"
        );
    }
}
