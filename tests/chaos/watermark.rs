//! The published watermark (`watermark_table`) as the chaos runs check it:
//! its table created from what `gap-healer sql` prints, and samples of it
//! taken every 100 ms, each together with the rows at or below it in one
//! statement (one snapshot). Every position from 1 up to it must be a
//! committed event or a tombstone at that moment, it must never decrease,
//! and at the end it must reach the head. The fleet run checks one of its
//! stores this way, the ledger-core run its one table.

pub use gap_healer_testkit::pg::create_watermark_table;
use tokio_postgres::Client;

use crate::postgres::try_connect;

/// One store's watermark, sampled.
pub struct Watermark {
    url: String,
    /// The sample: the watermark, the rows in 1..=it and the rows below 1,
    /// in one statement.
    sql: String,
    /// The store's name in the table.
    store: String,
    client: Option<Client>,
    pub samples: u64,
    /// Samples that found no row yet (nothing published).
    pub unpublished: u64,
    pub failed_reads: u64,
    pub last: Option<i64>,
    pub violations: Vec<String>,
}

impl Watermark {
    /// The watermark of `store` in `table`, over the rows of `rows`
    /// (schema.table) whose position column is `position`, on the server
    /// `url`.
    pub fn new(url: &str, rows: &str, position: &str, table: &str, store: &str) -> Watermark {
        Watermark {
            url: url.into(),
            sql: format!(
                "SELECT w.position, (SELECT COUNT(*) FROM {rows} m WHERE m.{position} BETWEEN 1 AND w.position),
                        (SELECT COUNT(*) FROM {rows} m WHERE m.{position} <= w.position AND m.{position} < 1)
                 FROM {table} w WHERE w.store = $1"
            ),
            store: store.into(),
            client: None,
            samples: 0,
            unpublished: 0,
            failed_reads: 0,
            last: None,
            violations: Vec::new(),
        }
    }

    /// One sample (a failed read, while the server restarts, is counted).
    pub async fn sample(&mut self) {
        if self.client.is_none() {
            match try_connect(&self.url).await {
                Ok(c) => self.client = Some(c),
                Err(_) => {
                    self.failed_reads += 1;
                    return;
                }
            }
        }
        let c = self.client.as_ref().unwrap();
        let row = match c.query_opt(&self.sql, &[&self.store]).await {
            Ok(row) => row,
            Err(_) => {
                self.client = None;
                self.failed_reads += 1;
                return;
            }
        };
        self.samples += 1;
        let Some(row) = row else {
            self.unpublished += 1;
            return;
        };
        let (w, rows, below): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
        if rows != w || below != 0 {
            self.violations.push(format!(
                "watermark {w}: only {rows} of the positions 1..={w} are committed events or tombstones at the moment of sampling"
            ));
        }
        if let Some(last) = self.last {
            if w < last {
                self.violations
                    .push(format!("the watermark decreased from {last} to {w}"));
            }
        }
        self.last = Some(w);
    }

    /// The samples that found a watermark.
    pub fn checked(&self) -> u64 {
        self.samples - self.unpublished
    }

    /// What went wrong, with `head` the store's head at the end.
    pub fn failures(&self, head: i64) -> Vec<String> {
        let mut failures: Vec<String> = self.violations.iter().take(10).cloned().collect();
        if self.violations.len() > 10 {
            failures.push(format!(
                "... {} watermark violations in all",
                self.violations.len()
            ));
        }
        if self.checked() == 0 {
            failures.push("the watermark was never published: nothing was checked".into());
        }
        if self.last != Some(head) {
            failures.push(format!(
                "the watermark ended at {:?}, not at the head {head}",
                self.last
            ));
        }
        failures
    }

    /// The figures line.
    pub fn figures(&self, head: i64) -> String {
        format!(
            "watermark samples      {} checked ({} before the first publication, {} reads failed), last {:?}, head {head}; {} violations\n",
            self.checked(),
            self.unpublished,
            self.failed_reads,
            self.last,
            self.violations.len()
        )
    }
}
