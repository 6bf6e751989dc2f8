//! Why an operator action was refused before it changed anything: the CLI prints it as any
//! error; the console answers it with a status of its own (400, 404, 409), not a 500.

use std::fmt;

#[derive(Debug)]
pub(crate) enum Refusal {
    /// The request names something wrong or misses something required (a reason).
    BadInput(String),
    /// What it names is not there (not a dead row, not a parked key).
    NotFound(String),
    /// What it names changed since the operator looked (a bulk action's count).
    Conflict(String),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::BadInput(why) | Refusal::NotFound(why) | Refusal::Conflict(why) => {
                f.write_str(why)
            }
        }
    }
}

impl std::error::Error for Refusal {}

/// Refuses with `BadInput` unless `reason` says something: an audited action needs a why.
pub(crate) fn require_reason(reason: &str, what: &str) -> Result<(), Refusal> {
    if reason.trim().is_empty() {
        return Err(Refusal::BadInput(format!(
            "a reason (--reason) must say why {what}"
        )));
    }
    Ok(())
}
