//! Eventuous 0.17's all-stream subscription: it reads pages in position order
//! from the next position it expects; at a hole (a row above that position)
//! it stops the page and reads again later from the same place; it passes the
//! hole only once the row after it is older than one hour
//! (GapAgeThresholdMs); tombstones have a type no handler knows, so they are
//! logged as ignored and the checkpoint moves past them.
//!
//! [`Follower`] is that rule without any I/O, used by every subscriber of the
//! tests, the chaos run and the bench harness; [`Subscriber`] is the one the
//! integration tests poll, reading its [`Pages`] from either engine
//! ([`PgPages`], `mssql::Pages`).

use std::future::Future;
use std::time::{Duration, Instant};

use tokio_postgres::Client;
use uuid::Uuid;

use crate::eventuous::TOMBSTONE_TYPE;
use crate::pg::{self, Store};

/// One row of a page, as a subscriber reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageRow {
    pub position: i64,
    pub id: Uuid,
    pub stream: String,
    pub message_type: String,
    /// Older than one hour: a hole before it is passed.
    pub old: bool,
}

impl PageRow {
    pub fn is_tombstone(&self) -> bool {
        self.message_type == TOMBSTONE_TYPE
    }
}

/// What a subscriber does with the next row of its page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offered {
    /// Hand the row over; the subscriber now expects the position after it.
    /// `waited`: the hole it stood at until now, and for how long.
    Take { waited: Option<(i64, Duration)> },
    /// A hole before this row: stop the page, read again from the same place.
    Hole,
}

/// Where an all-stream subscription stands, and Eventuous 0.17's gap rule.
#[derive(Clone, Debug)]
pub struct Follower {
    next: i64,
    stalled: Option<(i64, Instant)>,
}

impl Follower {
    /// A subscription that expects `first` next (the identity's first value
    /// for a subscription from the start).
    pub fn new(first: i64) -> Follower {
        Follower {
            next: first,
            stalled: None,
        }
    }

    /// The position it expects next.
    pub fn next(&self) -> i64 {
        self.next
    }

    /// The hole it stands at (its position, since when), while it waits.
    pub fn stalled(&self) -> Option<(i64, Instant)> {
        self.stalled
    }

    /// The rule, for the next row of a page (rows come in position order,
    /// from [`Follower::next`] on).
    pub fn offer(&mut self, position: i64, old: bool) -> Offered {
        if position > self.next && !old {
            if self.stalled.map(|(p, _)| p) != Some(self.next) {
                self.stalled = Some((self.next, Instant::now()));
            }
            return Offered::Hole;
        }
        self.next = position + 1;
        Offered::Take {
            waited: self.stalled.take().map(|(p, since)| (p, since.elapsed())),
        }
    }
}

/// An event a [`Subscriber`] handled.
#[derive(Clone, Debug)]
pub struct Handled {
    pub position: i64,
    pub stream: String,
    pub at: Instant,
}

/// Where a [`Subscriber`] reads: a session of its own on one store, read a
/// page at a time as Eventuous's all-stream subscription reads.
pub trait Pages: Send {
    /// Rows from `next` on, in position order (one page of them).
    fn page(&mut self, next: i64) -> impl Future<Output = Vec<PageRow>> + Send;
}

/// A PostgreSQL store's pages ([`pg::page`]), on a session of their own.
pub struct PgPages {
    client: Client,
    schema: String,
}

impl PgPages {
    pub async fn new(store: &Store) -> PgPages {
        PgPages {
            client: pg::connect_to(&store.url()).await,
            schema: store.schema.clone(),
        }
    }
}

impl Pages for PgPages {
    async fn page(&mut self, next: i64) -> Vec<PageRow> {
        pg::page(&self.client, &self.schema, next).await.unwrap()
    }
}

/// An all-stream subscriber of a store, polled by the test.
pub struct Subscriber<P: Pages> {
    pages: P,
    follower: Follower,
    pub handled: Vec<Handled>,
    /// The positions of the tombstones it ignored (a type no handler
    /// knows: logged as ignored, the checkpoint moved past it).
    pub ignored: Vec<i64>,
}

impl<P: Pages> Subscriber<P> {
    /// A subscription from `first` (the identity's first value) on `pages`.
    pub fn new(pages: P, first: i64) -> Subscriber<P> {
        Subscriber {
            pages,
            follower: Follower::new(first),
            handled: vec![],
            ignored: vec![],
        }
    }

    /// The position it expects next.
    pub fn next(&self) -> i64 {
        self.follower.next()
    }

    /// One poll: handles what it may; returns how many events it handled.
    pub async fn poll(&mut self) -> usize {
        let rows = self.pages.page(self.follower.next()).await;
        let before = self.handled.len();
        for r in rows {
            if self.follower.offer(r.position, r.old) == Offered::Hole {
                break;
            }
            if r.is_tombstone() {
                self.ignored.push(r.position);
            } else {
                self.handled.push(Handled {
                    position: r.position,
                    stream: r.stream,
                    at: Instant::now(),
                });
            }
        }
        self.handled.len() - before
    }

    /// Polls every 50 ms until `pred` holds or `limit` passes; the moment it held.
    pub async fn poll_until(
        &mut self,
        limit: Duration,
        mut pred: impl FnMut(&Subscriber<P>) -> bool,
    ) -> Option<Instant> {
        let end = Instant::now() + limit;
        loop {
            self.poll().await;
            if pred(self) {
                return Some(Instant::now());
            }
            if Instant::now() >= end {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn handled_stream(&self, stream: &str) -> bool {
        self.handled.iter().any(|h| h.stream == stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_at_a_fresh_hole_and_passes_an_old_one() {
        let mut f = Follower::new(1);
        assert_eq!(f.offer(1, false), Offered::Take { waited: None });
        assert_eq!(f.offer(3, false), Offered::Hole);
        assert_eq!(f.stalled().map(|s| s.0), Some(2));
        assert_eq!(f.offer(3, false), Offered::Hole);
        assert_eq!(f.next(), 2);
        let Offered::Take { waited } = f.offer(2, false) else {
            panic!("the hole's row arrived")
        };
        assert_eq!(waited.map(|w| w.0), Some(2));
        assert_eq!(f.offer(5, true), Offered::Take { waited: None });
        assert_eq!(f.next(), 6);
    }
}
