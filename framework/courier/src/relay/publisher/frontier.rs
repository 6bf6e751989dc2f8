//! Which of a key's rows may go to the client: only a row right behind what is already out.
//!
//! The claim returns each row with `prev_version`, its key's closest earlier version that was
//! unpublished at claim time (earlier in the same claim, in flight, or left behind by a
//! failure). A row may be handed to the client only when that version is already out —
//! handed to this client ahead of it, which publishes a key's rows in the order given — or
//! when there is none. [`Frontier`] is the highest version out in an unbroken run; a setback
//! (a failed row, rows given back untried) pulls it back below the lowest row left behind, so
//! nothing overtakes that row until its retry goes out.
//!
//! The rule is exact whatever the timing of claims, marks and releases. It replaces a timing
//! rule (admit later rows if their claim started after the failure was recorded), which let v9
//! overtake v7 and v8 when they were given back untried after the record of v6's failure
//! (`tests/congestion.rs` caught it with the broker frozen).

/// The highest version of a key out (handed to the client) in an unbroken run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Frontier {
    /// `None`: nothing is out since the key publisher started or since a setback reached
    /// back past every row it had handed.
    out_to: Option<i64>,
}

impl Frontier {
    /// A frontier with `version` out (none: nothing out).
    pub fn out_to(version: Option<i64>) -> Self {
        Self { out_to: version }
    }

    /// Whether a row whose key's closest earlier unpublished version (at claim time) is `prev`
    /// may be handed now: that version must be out already, or not exist.
    pub fn admits(&self, prev: Option<i64>) -> bool {
        match prev {
            None => true,
            Some(prev) => self.covers(prev),
        }
    }

    /// Whether `version` is out (handed in this run, not left behind since).
    pub fn covers(&self, version: i64) -> bool {
        self.out_to.is_some_and(|out| version <= out)
    }

    /// A row of `version` was handed to the client.
    pub fn handed(&mut self, version: i64) {
        self.out_to = Some(self.out_to.map_or(version, |out| out.max(version)));
    }

    /// The row of `version`, whose closest earlier unpublished version at claim time was
    /// `prev`, did not go out (failed, or given back untried): neither did anything after it.
    pub fn set_back(&mut self, prev: Option<i64>) {
        self.out_to = match (self.out_to, prev) {
            (Some(out), Some(prev)) => Some(out.min(prev)),
            _ => None,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_with_nothing_unpublished_before_it_always_goes() {
        assert!(Frontier::default().admits(None));
        assert!(!Frontier::default().admits(Some(4)));
    }

    #[test]
    fn pipelined_claims_follow_what_is_out() {
        let mut frontier = Frontier::default();
        for (prev, version) in [(None, 1), (Some(1), 2), (Some(2), 3)] {
            assert!(frontier.admits(prev));
            frontier.handed(version);
        }
        assert!(
            frontier.admits(Some(3)),
            "v4 of the next claim, behind v3 in flight"
        );
    }

    #[test]
    fn rows_given_back_hold_later_rows_until_they_are_out_again() {
        // The frozen-broker reorder: v6 failed, v7 and v8 were given back untried, and a
        // claim made meanwhile took the due v6 and v9-v39 (v7, v8 still held by this relay).
        let mut frontier = Frontier::default();
        for (prev, version) in [(None, 6), (Some(6), 7), (Some(7), 8)] {
            assert!(frontier.admits(prev));
            frontier.handed(version);
        }
        frontier.set_back(None); // v6 failed: it had nothing unpublished before it
        assert!(frontier.admits(None), "v6's retry");
        frontier.handed(6);
        assert!(!frontier.admits(Some(8)), "v9 must not overtake v7 and v8");
        assert!(
            frontier.admits(Some(6)),
            "v7, claimed again after its release"
        );
        frontier.handed(7);
        frontier.handed(8);
        assert!(frontier.admits(Some(8)));
    }

    #[test]
    fn a_setback_never_moves_the_frontier_forward() {
        let mut frontier = Frontier::default();
        frontier.handed(3);
        frontier.set_back(Some(5));
        assert!(!frontier.covers(4));
        assert!(frontier.covers(3));
    }
}
