//! A pooled connection's transaction against real PostgreSQL: its BEGIN goes out with its
//! first statement rather than a round trip ahead of it, so these check that the statements
//! still run inside it: rolled back, dropped or failing, nothing of it stays, and the
//! connection is back outside any transaction for its next user.

use courier_testkit::TestDb;
use tokio_postgres::Client;

const CREATE: &str = "CREATE TABLE notes (id int PRIMARY KEY)";
const INSERT: &str = "INSERT INTO notes (id) VALUES ($1) RETURNING id";

async fn notes(conn: &Client) -> anyhow::Result<i64> {
    Ok(conn
        .query_one("SELECT count(*) FROM notes", &[])
        .await?
        .get(0))
}

/// The transaction id the connection's current transaction holds: none between transactions
/// (each statement then runs in one of its own, which takes no id to read).
async fn open_transaction(conn: &Client) -> anyhow::Result<Option<i64>> {
    Ok(conn
        .query_one("SELECT txid_current_if_assigned()", &[])
        .await?
        .get(0))
}

#[tokio::test]
async fn the_first_statement_runs_inside_the_transaction() -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let mut conn = db.pool.get().await?;
    conn.batch_execute(CREATE).await?;

    let tx = conn.transaction().await?;
    tx.execute(INSERT, &[&1]).await?;
    tx.rollback().await?;
    assert_eq!(
        notes(&conn).await?,
        0,
        "a rolled-back first statement stays"
    );

    let tx = conn.transaction().await?;
    let insert = tx.prepared(INSERT).await?;
    tx.execute(&insert, &[&2]).await?;
    drop(tx);
    assert_eq!(
        notes(&conn).await?,
        0,
        "a dropped transaction's first statement stays"
    );
    assert_eq!(open_transaction(&conn).await?, None);

    let tx = conn.transaction().await?;
    tx.execute(INSERT, &[&3]).await?;
    tx.commit().await?;
    assert_eq!(notes(&conn).await?, 1);
    assert_eq!(open_transaction(&conn).await?, None);
    Ok(())
}

#[tokio::test]
async fn a_transaction_of_one_statement_commits_or_leaves_nothing() -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let mut conn = db.pool.get().await?;
    conn.batch_execute(CREATE).await?;
    let insert = conn.prepared(INSERT).await?;

    // BEGIN, the statement and COMMIT go out together.
    let tx = conn.transaction().await?;
    assert_eq!(tx.query_and_commit(&insert, &[&1]).await?.len(), 1);
    assert_eq!(notes(&conn).await?, 1);

    // A failing only statement: the COMMIT behind it rolls back.
    let tx = conn.transaction().await?;
    assert!(tx.query_and_commit(&insert, &[&1]).await.is_err());
    assert_eq!(notes(&conn).await?, 1);
    assert_eq!(open_transaction(&conn).await?, None);
    Ok(())
}

#[tokio::test]
async fn a_connection_returns_to_its_pool_outside_the_dropped_transaction() -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    db.pool.get().await?.batch_execute(CREATE).await?;
    let held = {
        let mut conn = db.pool.get().await?;
        let tx = conn.transaction().await?;
        tx.execute(INSERT, &[&1]).await?;
        open_transaction(&tx).await?
    };
    assert!(
        held.is_some(),
        "the insert ran in a transaction that took an id"
    );
    // Whichever pooled connection comes next, none is still inside that transaction.
    for _ in 0..3 {
        let conn = db.pool.get().await?;
        assert_eq!(open_transaction(&conn).await?, None);
        assert_eq!(notes(&conn).await?, 0);
    }
    Ok(())
}
