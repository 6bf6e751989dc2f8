//! Where PostgreSQL's time goes in a run: the top statements of the run's database by total
//! execution time, per committed write, from `pg_stat_statements`. The extension must be in
//! the server's `shared_preload_libraries` (the clusters `chaos` starts load it; for the
//! default server see README, "Load tests"); without it runs go on and say so.
//!
//! It also takes the cumulative counts of every statement at an instant ([`snapshot`]), which
//! `pin` subtracts to compare a statement before and while the xmin horizon is pinned.

use crate::report::measures::StatementCost;

/// Marks the harness's own statements that read the framework's tables and nothing of the
/// harness's (`load`) schema, so the comparison in `pin` can tell them from the framework's
/// (which name the same tables: `{schema}.outbox`). `pg_stat_statements` keeps the comment in
/// the text it stores.
pub const HARNESS_TAG: &str = "/* courier-load */";

/// Statements listed per report.
const TOP: i64 = 10;

/// Creates the extension in the run's database and forgets what the database ran so far (its
/// creation and migrations), so the counts cover the run alone; `false` when the server has
/// not loaded the library (the run then reports no statements).
pub async fn enable(client: &tokio_postgres::Client) -> bool {
    let readable = client
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await
        .is_ok()
        && client
            .query_one("SELECT count(*) FROM pg_stat_statements LIMIT 1", &[])
            .await
            .is_ok();
    // Only this database's entries (userid 0 and queryid 0: all of them). A role without the
    // right to reset keeps the setup's statements in the counts, which touch no table the
    // comparisons judge.
    if readable {
        let _ = client
            .batch_execute(
                "SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database
                                                      WHERE datname = current_database()), 0)",
            )
            .await;
    }
    readable
}

/// One statement's cumulative counts in the run's database at an instant.
#[derive(Debug, Clone, PartialEq)]
pub struct StatementCount {
    pub queryid: i64,
    /// The normalized text as stored (comments kept).
    pub query: String,
    pub calls: i64,
    /// Execution time summed over the calls, milliseconds.
    pub total_ms: f64,
    /// Shared buffers hit or read, summed over the calls: the pages the statement went
    /// through, which a busy CPU does not inflate as it does the time.
    pub pages: i64,
}

/// Every statement of the current database with its counts at an instant, and how often
/// `pg_stat_statements` had evicted entries server-wide by then.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub counts: Vec<StatementCount>,
    /// `pg_stat_statements_info.dealloc`: the passes that evicted the least-used entries because
    /// the server saw more distinct statements than `pg_stat_statements.max` (every test
    /// database's own statements count). An evicted statement starts again from zero. `None`
    /// when not read (before PostgreSQL 14, or the launch's reset).
    pub evictions: Option<i64>,
}

/// Every statement of the current database with its calls and execution time so far; `None`
/// when `pg_stat_statements` cannot be read. Top-level and nested entries of one statement
/// are summed.
pub async fn snapshot(client: &tokio_postgres::Client) -> Option<Snapshot> {
    let rows = client
        .query(
            "SELECT queryid, min(query), sum(calls)::int8, sum(total_exec_time)::float8,
                    sum(shared_blks_hit + shared_blks_read)::int8
             FROM pg_stat_statements
             WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
               AND queryid IS NOT NULL
             GROUP BY queryid",
            &[],
        )
        .await
        .ok()?;
    let evictions = match client
        .query_one("SELECT dealloc FROM pg_stat_statements_info", &[])
        .await
    {
        Ok(row) => row.try_get(0).ok(),
        Err(_) => None,
    };
    Some(Snapshot {
        counts: rows
            .iter()
            .map(|r| StatementCount {
                queryid: r.get(0),
                query: r.get(1),
                calls: r.get(2),
                total_ms: r.get(3),
                pages: r.get(4),
            })
            .collect(),
        evictions,
    })
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
pub fn collapse(query: &str, max: usize) -> String {
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
