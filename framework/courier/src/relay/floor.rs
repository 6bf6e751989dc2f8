//! A shard's floor: a seq below which a walk of the shard's unpublished rows need not look.
//!
//! While a long transaction pins the xmin horizon, every row published since the pin leaves
//! an index entry that a walk of unpublished rows cannot skip, so walks start at the floor
//! instead of the shard's start (P9). The claimer's full scans and the backlog gauge keep one
//! each.

use crate::relay::store::FloorLook;

/// The floor and what settles it. A floor query (queries/claim_floor.sql) finds the lowest row
/// it may count from; that becomes the floor only once a later look saw every transaction
/// running at the first one ended, since one of them may still commit a row below it.
#[derive(Debug)]
pub struct Floor {
    floor: i64,
    /// A floor a look found, and its `next_xid`: it may become the floor once a later look's
    /// `xmin` reaches that `next_xid`.
    pending: Option<(i64, i64)>,
    /// The next seq as the last look read it, after its snapshot: every seq below it was handed
    /// out before the next look's snapshot (see [`Floor::found`]).
    next_seq_seen: i64,
}

impl Floor {
    /// From the shard's start.
    pub fn start() -> Self {
        Self {
            floor: 0,
            pending: None,
            next_seq_seen: 0,
        }
    }

    /// At a floor settled elsewhere (one a relay recorded): a settled floor stays one.
    pub fn settled_at(floor: i64) -> Self {
        Self {
            floor,
            pending: None,
            next_seq_seen: floor,
        }
    }

    pub fn get(&self) -> i64 {
        self.floor
    }

    /// Reads the next seq a look saw without taking its floor (a look voided by a rewind still
    /// bounds the one after it).
    pub fn saw_next_seq(&mut self, look: &FloorLook) {
        self.next_seq_seen = self.next_seq_seen.max(look.next_seq);
    }

    /// What a look from the floor saw.
    ///
    /// If it saw no row, its floor is the next seq the previous look read, not the one it read
    /// itself: PostgreSQL takes a statement's snapshot before it runs, so a transaction may
    /// take its id just after the snapshot (not counted as running in it) and seqs before the
    /// query reads the sequence. Floored at that read, such rows were passed for good: 167 rows
    /// of a shard's first transaction once stayed unpublished (a full test run, where timings
    /// differ). Every seq below the previous read was handed out before this look began, by a
    /// transaction that had its id then (the append's order), so this snapshot sees that
    /// transaction as ended or running.
    pub fn found(&mut self, look: &FloorLook) {
        let found = look.lowest.unwrap_or(self.next_seq_seen);
        self.saw_next_seq(look);
        if let Some((pending, next_xid)) = self.pending {
            if look.snapshot.xmin >= next_xid {
                // Whatever the transactions running at the pending floor's look wrote below
                // it is visible now, so this look (from the floor) found it: `found` is at
                // most its seq.
                self.floor = self.floor.max(pending.min(found));
                self.pending = None;
            }
        }
        if self.pending.is_none() {
            self.pending = Some((found, look.snapshot.next_xid));
        }
    }

    /// Rows from `seq` on may be there again.
    pub fn lower_to(&mut self, seq: i64) {
        self.floor = self.floor.min(seq);
        if let Some((pending, _)) = &mut self.pending {
            *pending = (*pending).min(seq);
        }
    }
}
