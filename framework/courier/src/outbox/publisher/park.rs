//! The park policy: which of a key's rows may go to the client after one of them failed.
//!
//! The first failure of a key *parks* it: rows of later versions that were claimed before the
//! failure was recorded in the database are given back untried, because they would otherwise
//! overtake the failed row. Rows claimed after the record are safe — the claim's head-of-line
//! check kept them back until the failed row was due again — and the failed row's own retry
//! lifts the park.

use std::time::{Duration, Instant};

/// A key whose row of `version` failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parked {
    pub version: i64,
    pub failed_at: Instant,
    /// When the failure was known to be committed to the database.
    pub recorded_at: Option<Instant>,
    /// The failed row's retry was handed over. The park still stands for rows claimed before
    /// the failure was recorded: rows between the failed one and them were given back untried
    /// and come back only with a later claim, so those older-claim rows would overtake them.
    pub retried: bool,
}

/// Whether a row of `version`, claimed at `claimed_at`, may be handed to the client while the
/// key is `parked`. Rows up to the failed version always may (they are its retry, or come
/// before it); later ones only if their claim started after the failure was recorded (or
/// after the park expired), since that claim's head-of-line check already ordered them.
pub fn admits(
    parked: Option<&Parked>,
    version: i64,
    claimed_at: Instant,
    expiry: Duration,
) -> bool {
    match parked {
        None => true,
        Some(p) if version <= p.version => true,
        Some(p) => {
            p.recorded_at.is_some_and(|at| claimed_at > at) || claimed_at > p.failed_at + expiry
        }
    }
}

/// Records that a row of `version` went to the client. The failed row's retry lets the key
/// flow again — but only for rows claimed since the failure was recorded (see `admits`), so
/// the park stays, marked retried.
pub fn note_handed(parked: &mut Option<Parked>, version: i64) {
    if let Some(parked) = parked.as_mut().filter(|p| version <= p.version) {
        parked.retried = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPIRY: Duration = Duration::from_secs(30);

    #[test]
    fn an_unparked_key_admits_everything() {
        assert!(admits(None, 7, Instant::now(), EXPIRY));
    }

    #[test]
    fn a_parked_key_admits_its_failed_row_and_earlier_ones() {
        let parked = Parked {
            version: 3,
            failed_at: Instant::now(),
            recorded_at: None,
            retried: false,
        };
        let claimed = parked.failed_at - Duration::from_millis(5);
        assert!(admits(Some(&parked), 3, claimed, EXPIRY));
        assert!(admits(Some(&parked), 2, claimed, EXPIRY));
    }

    #[test]
    fn later_rows_claimed_before_the_record_are_refused() {
        let t0 = Instant::now();
        let mut parked = Parked {
            version: 3,
            failed_at: t0,
            recorded_at: None,
            retried: false,
        };
        // Claimed while the failure was not yet in the database: it could overtake v3.
        assert!(!admits(
            Some(&parked),
            4,
            t0 + Duration::from_millis(1),
            EXPIRY
        ));
        parked.recorded_at = Some(t0 + Duration::from_millis(10));
        assert!(!admits(
            Some(&parked),
            4,
            t0 + Duration::from_millis(5),
            EXPIRY
        ));
        // Claimed after the record: the claim itself kept it behind v3.
        assert!(admits(
            Some(&parked),
            4,
            t0 + Duration::from_millis(11),
            EXPIRY
        ));
    }

    #[test]
    fn after_the_retry_rows_claimed_before_the_record_are_still_refused() {
        // v3 failed; v4-v7 were given back untried; v8 sat in an older claim. Once v3's retry
        // went out, v8 must still wait: v4-v7 come back only with a later claim.
        let t0 = Instant::now();
        let mut parked = Some(Parked {
            version: 3,
            failed_at: t0,
            recorded_at: Some(t0 + Duration::from_millis(10)),
            retried: false,
        });
        note_handed(&mut parked, 3);
        assert!(!admits(
            parked.as_ref(),
            8,
            t0 + Duration::from_millis(5),
            EXPIRY
        ));
        assert!(admits(
            parked.as_ref(),
            4,
            t0 + Duration::from_millis(11),
            EXPIRY
        ));
    }

    #[test]
    fn an_unrecorded_park_expires_after_the_lease() {
        let t0 = Instant::now();
        let parked = Parked {
            version: 1,
            failed_at: t0,
            recorded_at: None,
            retried: false,
        };
        assert!(!admits(Some(&parked), 2, t0 + EXPIRY, EXPIRY));
        assert!(admits(
            Some(&parked),
            2,
            t0 + EXPIRY + Duration::from_millis(1),
            EXPIRY
        ));
    }
}
