//! gap-healer fills holes in the identity-assigned global position of an event
//! store (Eventuous on SQL Server or PostgreSQL) with tombstone rows, so
//! all-stream subscriptions that stop at every hole can move on.
//!
//! # Layout
//! - [`config`]: flags, file and environment layered into one validated [`config::Settings`].
//! - [`secret`]: the connection string type that never prints its password.
//! - [`gaps`]: holes as ranges, and the tracker that ages them.
//! - [`plan`]: which ranges one fill cycle tries, and in which pieces.
//! - [`engine`]: the database seam, with [`engine::postgres`] and [`engine::mssql`].
//! - [`healer`]: the loop: scan, track, fill what is due, report.
//! - [`leader`]: whether this process may fill now.
//! - [`telemetry`]: logs, metrics, and the `/metrics`, `/healthz`, `/readyz` server.
//! - [`shutdown`]: SIGTERM and SIGINT into a cancellation token.
//! - [`backoff`]: capped, jittered exponential backoff.
//! - [`cli`]: the subcommands, each a function `main` calls.
#![forbid(unsafe_code)]

pub mod backoff;
pub mod cli;
pub mod config;
pub mod engine;
pub mod gaps;
pub mod healer;
pub mod leader;
pub mod plan;
pub mod secret;
pub mod shutdown;
pub mod telemetry;
