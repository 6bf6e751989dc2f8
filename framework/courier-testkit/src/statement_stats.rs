//! Pages a test database's statements read, from `pg_stat_statements` (scripts/stack.sh loads
//! it; [`TestDb::enable_statement_stats`] makes its view readable), safe against eviction.
//!
//! The server keeps `pg_stat_statements.max` entries over every database and, past that,
//! evicts the least used. A test run creates hundreds of databases, each with statements of its
//! own, so a test's rarely run statements can be evicted between two readings: their counts
//! start again from zero and a difference of sums goes back (CI saw -19,782 pages). A reading
//! therefore carries the server's eviction passes, and a difference over a pass is void.

use crate::TestDb;
use anyhow::Context as _;

/// Pages read, from cache or disk, by this database's statements whose text matches a
/// regular expression, with the eviction passes the server had made when it was read.
#[derive(Clone, Copy, Debug)]
struct StatementPages {
    pages: i64,
    evictions: i64,
    /// Every entry of this database came with its text. An entry whose text the server could
    /// not load (its query-text file being rewritten) reads as NULL and drops out of a sum
    /// that filters on the text: CI once saw -14,008 pages without an eviction pass.
    texts_whole: bool,
}

impl StatementPages {
    /// The pages read since `before`, or `None` when the server evicted entries in between
    /// (an evicted statement counts from zero when it next runs, so the difference would not
    /// be what was read).
    fn since(self, before: StatementPages) -> Option<i64> {
        (self.evictions == before.evictions && self.texts_whole && before.texts_whole)
            .then_some(self.pages - before.pages)
    }
}

/// The reading; the statement leaves itself out of the sum (`pg_stat_statements` counts a
/// statement as it ends, so only earlier runs of it would be counted).
const READ: &str = "
    SELECT coalesce(sum(shared_blks_hit + shared_blks_read)
                        FILTER (WHERE query ~ $1 AND query NOT LIKE '%pg_stat_statements%'),
                    0)::bigint,
           (SELECT dealloc FROM public.pg_stat_statements_info),
           coalesce(bool_and(query IS NOT NULL), true)
    FROM public.pg_stat_statements
    WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())";

/// Runs of the measured work [`TestDb::fewest_pages`] allows per sample asked for, voided
/// ones included.
const TRIES_PER_SAMPLE: usize = 10;

impl TestDb {
    /// What this database's statements whose text matches the regular expression `pattern`
    /// (`""` for all) have read so far; take two and subtract them with
    /// [`StatementPages::since`].
    async fn statement_pages(&self, pattern: &str) -> anyhow::Result<StatementPages> {
        let row = self
            .pooled()
            .await?
            .query_one(READ, &[&pattern])
            .await
            .context("read pg_stat_statements")?;
        Ok(StatementPages {
            pages: row.try_get(0)?,
            evictions: row.try_get(1)?,
            texts_whole: row.try_get(2)?,
        })
    }

    /// The fewest pages the statements matching `pattern` read in `samples` runs of `work`
    /// that no eviction pass crossed. A run a pass crossed is void and `work` runs again, up
    /// to ten times a sample in all.
    pub async fn fewest_pages(
        &self,
        pattern: &str,
        samples: usize,
        mut work: impl AsyncFnMut() -> anyhow::Result<()>,
    ) -> anyhow::Result<i64> {
        let mut fewest: Option<i64> = None;
        let mut counted = 0;
        for _ in 0..samples * TRIES_PER_SAMPLE {
            let before = self.statement_pages(pattern).await?;
            work().await?;
            let Some(pages) = self.statement_pages(pattern).await?.since(before) else {
                eprintln!(
                    "pg_stat_statements evicted entries or lost their texts during a measured \
                     run: run again"
                );
                continue;
            };
            fewest = Some(fewest.map_or(pages, |f| f.min(pages)));
            counted += 1;
            if counted == samples {
                break;
            }
        }
        anyhow::ensure!(
            counted == samples,
            "pg_stat_statements evicted entries during all but {counted} of {} runs",
            samples * TRIES_PER_SAMPLE
        );
        fewest.context("no sample asked for")
    }
}
