//! Where PostgreSQL's time goes in a run: the top statements of the run's database by total
//! execution time, per committed write, from `pg_stat_statements`. The extension must be in
//! the server's `shared_preload_libraries` (the clusters `chaos` starts load it; for the
//! default server see README, "Load tests"); without it runs go on and say so.

use crate::report::StatementCost;

/// Statements listed per report.
const TOP: i64 = 10;

/// Creates the extension in the run's database; `false` when the server has not loaded the
/// library (the run then reports no statements).
pub async fn enable(client: &tokio_postgres::Client) -> bool {
    client
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await
        .is_ok()
        && client
            .query_one("SELECT count(*) FROM pg_stat_statements LIMIT 1", &[])
            .await
            .is_ok()
}

/// The top statements of the current database, per `events` committed writes; `None` when
/// `pg_stat_statements` cannot be read. A server restart (a `restart-postgres` fault) resets
/// the counts, so they then cover the time since the last restart.
pub async fn top(client: &tokio_postgres::Client, events: u64) -> Option<Vec<StatementCost>> {
    let rows = client
        .query(
            "SELECT query, calls, total_exec_time, mean_exec_time FROM pg_stat_statements
             WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
               AND query NOT LIKE 'CREATE EXTENSION%'
             ORDER BY total_exec_time DESC LIMIT $1",
            &[&TOP],
        )
        .await
        .ok()?;
    let events = events.max(1) as f64;
    Some(
        rows.iter()
            .map(|r| {
                let query: String = r.get(0);
                let calls: i64 = r.get(1);
                let total_ms: f64 = r.get(2);
                StatementCost {
                    query: collapse(&query, 160),
                    calls_per_event: calls as f64 / events,
                    mean_ms: r.get(3),
                    micros_per_event: total_ms * 1_000.0 / events,
                }
            })
            .collect(),
    )
}

/// Whitespace runs as one space, cut to `max` characters.
fn collapse(query: &str, max: usize) -> String {
    query
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(max)
        .collect()
}

/// The note a report carries when the statements could not be read.
pub const NOT_LOADED: &str = "pg_stat_statements is not loaded on this server: no statement \
    costs (see README, \"Load tests\", to enable it)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_collapsed_and_cut() {
        assert_eq!(
            collapse("SELECT  a,\n\t b FROM t", 100),
            "SELECT a, b FROM t"
        );
        assert_eq!(collapse("SELECT 1", 3), "SEL");
    }
}
