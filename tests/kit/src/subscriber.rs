//! Eventuous 0.17's all-stream subscription: it reads pages in position order
//! from the next position it expects; at a hole (a row above that position)
//! it stops the page and reads again later from the same place; it passes the
//! hole only once the row after it is older than one hour
//! (GapAgeThresholdMs); tombstones have a type no handler knows, so they are
//! logged as ignored and the checkpoint moves past them.
//!
//! [`Follower`] is that rule without any I/O, used by every subscriber of the
//! tests, the chaos run and the bench harness; [`Subscriber`] is the
//! PostgreSQL one the integration tests poll.

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

/// An all-stream subscriber of a PostgreSQL store, polled by the test.
pub struct Subscriber {
    schema: String,
    client: Client,
    follower: Follower,
    pub handled: Vec<Handled>,
    /// Tombstones it ignored.
    pub ignored: u64,
}

impl Subscriber {
    /// A subscription from the first position, on a session of its own.
    pub async fn new(store: &Store) -> Subscriber {
        Subscriber {
            schema: store.schema.clone(),
            client: pg::connect_to(&store.url()).await,
            follower: Follower::new(1),
            handled: vec![],
            ignored: 0,
        }
    }

    /// The position it expects next.
    pub fn next(&self) -> i64 {
        self.follower.next()
    }

    /// One poll: handles what it may; returns how many events it handled.
    pub async fn poll(&mut self) -> usize {
        let rows = pg::page(&self.client, &self.schema, self.follower.next())
            .await
            .unwrap();
        let before = self.handled.len();
        for r in rows {
            if self.follower.offer(r.position, r.old) == Offered::Hole {
                break;
            }
            if r.is_tombstone() {
                self.ignored += 1;
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
        mut pred: impl FnMut(&Subscriber) -> bool,
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
