//! The plan PostgreSQL keeps for a prepared statement.

use anyhow::Context as _;
use tokio_postgres::Client;

/// The generic plan of `sql` prepared with parameter `types` on `client`, as `EXPLAIN EXECUTE`
/// with `args` (SQL literals) prints it: the plan a statement prepared once per connection
/// runs after its first few executions, whatever its arguments.
pub async fn generic_plan(
    client: &Client,
    sql: &str,
    types: &str,
    args: &str,
) -> anyhow::Result<String> {
    client
        .batch_execute(&format!(
            "SET plan_cache_mode = force_generic_plan; PREPARE plan_probe({types}) AS {sql}"
        ))
        .await
        .context("prepare the statement")?;
    let rows = client
        .query(&format!("EXPLAIN EXECUTE plan_probe({args})"), &[])
        .await
        .context("explain the statement");
    client
        .batch_execute("DEALLOCATE plan_probe; RESET plan_cache_mode")
        .await?;
    let plan: Vec<String> = rows?.iter().map(|row| row.get(0)).collect();
    Ok(plan.join("\n"))
}
