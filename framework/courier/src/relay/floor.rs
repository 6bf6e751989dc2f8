//! A shard's floor: a seq below which a walk of the shard's unpublished rows need not look.
//!
//! While a long transaction pins the xmin horizon, every row published since the pin leaves
//! an index entry that a walk of unpublished rows cannot skip, so walks start at the floor
//! instead of the shard's start (P9). The claimer's full scans and the backlog gauge keep one
//! each.

use crate::relay::store::FloorLook;
use std::collections::VecDeque;

/// Statements [`Floor`] remembers for [`Floor::saw_visible`]: a few seconds of a busy
/// claimer's claims. Forgetting one only makes a later look start lower.
const SEEN_KEPT: usize = 256;

/// The floor and what settles it. A floor query (queries/claim_floor.sql) finds the lowest row
/// it may count from; that becomes the floor only once a later look saw every transaction
/// running at the first one ended, since one of them may still commit a row below it.
#[derive(Debug)]
pub struct Floor {
    floor: i64,
    /// A floor a look found, waiting to become the floor.
    pending: Option<Pending>,
    /// The next seq as the last look read it, after its snapshot: every seq below it was handed
    /// out before the next look's snapshot (see [`Floor::found`]).
    next_seq_seen: i64,
    /// `(next_xid, seq)` of recent statements that saw the row `seq` (see
    /// [`Floor::saw_visible`]), oldest first.
    seen: VecDeque<(i64, i64)>,
}

/// A floor a look found, and its `next_xid`: it becomes the floor once a later look's `xmin`
/// reaches that `next_xid`. Until then a row may still appear below it, but only from
/// `rescan_from` on: later looks start there, not at the floor.
#[derive(Debug, Clone, Copy)]
struct Pending {
    floor: i64,
    next_xid: i64,
    rescan_from: i64,
}

impl Floor {
    /// From the shard's start.
    pub fn start() -> Self {
        Self::settled_at(0)
    }

    /// At a floor settled elsewhere (one a relay recorded): a settled floor stays one.
    pub fn settled_at(floor: i64) -> Self {
        Self {
            floor,
            pending: None,
            next_seq_seen: floor,
            seen: VecDeque::new(),
        }
    }

    pub fn get(&self) -> i64 {
        self.floor
    }

    /// Where the next look starts: the floor, or above it where rows may no longer appear.
    ///
    /// A look passes the index entry of every row published since the floor. Settled one look
    /// behind, the floor is where the look before last found its row, so each look would pass
    /// the rows of two looks' intervals, and while a pin holds nothing marks the first pass's
    /// entries dead for the second to skip: twice the pages a call of the same look unpinned.
    /// Below the pending floor, though, a row can appear only from a transaction the pending
    /// look saw writing, and [`Floor::found`] knows how low such a transaction's seqs can go.
    pub fn look_from(&self) -> i64 {
        self.pending
            .map_or(self.floor, |pending| self.floor.max(pending.rescan_from))
    }

    /// Reads the next seq a look saw without taking its floor (a look voided by a rewind still
    /// bounds the one after it).
    pub fn saw_next_seq(&mut self, look: &FloorLook) {
        self.next_seq_seen = self.next_seq_seen.max(look.next_seq);
    }

    /// A statement with `next_xid` (its snapshot's, [`crate::relay::store::ClaimSnapshot`]) saw
    /// the row `seq` committed: a claim that took it, a look that found it. Every transaction
    /// with an id from `next_xid` on took its id after that snapshot and (the append's order,
    /// outbox/queries/insert_events.sql) its seqs after its id, so above `seq`.
    pub fn saw_visible(&mut self, next_xid: i64, seq: i64) {
        if self.seen.len() == SEEN_KEPT {
            self.seen.pop_front();
        }
        self.seen.push_back((next_xid, seq));
    }

    /// The lowest seq a transaction with an id from `xmin` on can have taken, as far as the
    /// statements remembered tell (`None`: nothing known, from the floor).
    fn lowest_seq_from(&self, xmin: i64) -> Option<i64> {
        self.seen
            .iter()
            .filter(|&&(next_xid, _)| next_xid <= xmin)
            .map(|&(_, seq)| seq + 1)
            .max()
    }

    /// What a look from [`Floor::look_from`] saw.
    ///
    /// If it saw no row, its floor is the next seq the previous look read, not the one it read
    /// itself: PostgreSQL takes a statement's snapshot before it runs, so a transaction may
    /// take its id just after the snapshot (not counted as running in it) and seqs before the
    /// query reads the sequence. Floored at that read, such rows were passed for good: 167 rows
    /// of a shard's first transaction once stayed unpublished (a full test run, where timings
    /// differ). Every seq below the previous read was handed out before this look began, by a
    /// transaction that had its id then (the append's order), so this snapshot sees that
    /// transaction as ended or running.
    ///
    /// Below the floor it finds, a row can still appear only from a transaction the look saw
    /// writing (ids from its `xmin` on; every other one takes its seqs later, above that
    /// floor). Such a transaction's seqs are above every row a statement with a `next_xid` at
    /// most its id saw ([`Floor::saw_visible`]), typically a claim a few milliseconds before
    /// the look, so the looks until this one settles start from there.
    pub fn found(&mut self, look: &FloorLook) {
        let found = look.lowest.unwrap_or(self.next_seq_seen);
        self.saw_next_seq(look);
        if let Some(pending) = self.pending {
            if look.snapshot.xmin >= pending.next_xid {
                // Whatever the transactions running at the pending floor's look wrote below
                // it is visible now, from where this look started, so this look found it:
                // `found` is at most its seq.
                self.floor = self.floor.max(pending.floor.min(found));
                self.pending = None;
            }
        }
        if self.pending.is_none() {
            let rescan_from = self
                .lowest_seq_from(look.snapshot.xmin)
                .map_or(self.floor, |lowest| lowest.min(found));
            self.pending = Some(Pending {
                floor: found,
                next_xid: look.snapshot.next_xid,
                rescan_from,
            });
        }
        if let Some(lowest) = look.lowest {
            self.saw_visible(look.snapshot.next_xid, lowest);
        }
    }

    /// Rows from `seq` on may be there again.
    pub fn lower_to(&mut self, seq: i64) {
        self.floor = self.floor.min(seq);
        if let Some(pending) = &mut self.pending {
            pending.floor = pending.floor.min(seq);
            pending.rescan_from = pending.rescan_from.min(seq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statements_remembered_are_bounded_and_the_oldest_forgotten_first() {
        let mut floor = Floor::start();
        for seq in 0..(SEEN_KEPT as i64 * 3) {
            floor.saw_visible(seq, seq);
        }
        assert_eq!(floor.seen.len(), SEEN_KEPT);
        assert_eq!(
            floor.lowest_seq_from(10),
            None,
            "forgotten: nothing known below"
        );
        let newest = SEEN_KEPT as i64 * 3 - 1;
        assert_eq!(floor.lowest_seq_from(newest), Some(newest + 1));
    }
}
