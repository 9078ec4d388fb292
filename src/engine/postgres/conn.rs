//! Sessions: the pool's manager and the leader lock's dedicated session, both
//! from one parsed connection string.
//!
//! Every session runs without JIT (the probe's cost estimate grows with the
//! table times the tracked ranges; past `jit_above_cost` every probe was
//! JIT-compiled, 13.6 ms instead of under 2 at 10M rows) and with
//! `idle_in_transaction_session_timeout`: a fill transaction is never idle
//! between its statements for longer than a round trip, so one idle for
//! seconds belongs to a process that stopped (paused, cut off) while holding
//! the tombstone stream's row, and the server ends it.

use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::Config;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::errors::db_error;
use super::tls;
use crate::engine::{DbError, DbResult};
use crate::secret::ConnectionString;

/// A lock session idle this long (`idle_session_timeout`), or a pooled
/// session idle this long inside a transaction
/// (`idle_in_transaction_session_timeout`), is ended by the server: the bound
/// on how long a paused or cut-off leader keeps the leader lock or the
/// tombstone stream's row.
pub const STALLED_SESSION_TIMEOUT: Duration = Duration::from_secs(5);

/// How long any statement of the healer's sessions waits for a lock unless
/// it sets its own (fills do, per transaction): a scan or probe of a table
/// that DDL holds (`ALTER TABLE`, `VACUUM FULL`, `TRUNCATE`) fails after
/// this long instead of freezing its store's loop.
pub const READ_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// How to reach the server: the parsed configuration and its TLS.
#[derive(Clone)]
pub(crate) struct Target {
    pub config: Config,
    pub tls: MakeRustlsConnect,
    pub mode: tls::TlsMode,
    pub cs: ConnectionString,
}

impl Target {
    /// Parses the connection string and adds the healer's session settings.
    pub(crate) fn new(cs: &ConnectionString, connect_timeout: Duration) -> DbResult<Self> {
        let tls::Target {
            mut config,
            tls,
            mode,
        } = tls::parse(cs.expose()).map_err(|e| DbError::permanent(cs.scrub(&e)))?;
        if config.get_application_name().is_none() {
            config.application_name("gap-healer");
        }
        let ours = format!(
            "-c jit=off -c idle_in_transaction_session_timeout={} -c lock_timeout={}",
            STALLED_SESSION_TIMEOUT.as_millis(),
            READ_LOCK_TIMEOUT.as_millis()
        );
        let options = match config.get_options() {
            Some(given) if !given.trim().is_empty() => format!("{given} {ours}"),
            _ => ours,
        };
        config.options(&options);
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(connect_timeout);
        }
        Ok(Target {
            config,
            tls,
            mode,
            cs: cs.clone(),
        })
    }

    /// The first server the sessions go to that is not this machine
    /// ([`crate::engine::check::is_local_host`]): each `hostaddr` when given
    /// (where libpq connects), else each `host`; `None` when all are local.
    pub(crate) fn remote_host(&self) -> Option<String> {
        remote_host(&self.config)
    }

    /// A session outside the pool, with its connection driven by a task
    /// that ends when the returned handle is aborted or the session closes.
    pub(crate) async fn connect(
        &self,
        config: &Config,
        during: &str,
    ) -> DbResult<(tokio_postgres::Client, tokio::task::JoinHandle<()>)> {
        let (client, connection) = config
            .connect(self.tls.clone())
            .await
            .map_err(|e| db_error(&self.cs, &e, during))?;
        let task = tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok((client, task))
    }

    /// A session of its own for the leader lock, outside the pool, with TCP
    /// keepalive so a dead peer is noticed within about 20 s without traffic,
    /// and ended by the server once idle for [`STALLED_SESSION_TIMEOUT`].
    pub(crate) async fn connect_dedicated(
        &self,
    ) -> DbResult<(tokio_postgres::Client, tokio::task::JoinHandle<()>)> {
        let mut config = self.config.clone();
        config
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(10));
        let (client, task) = self.connect(&config, "leader session").await?;
        // The server, not only this process, must end the session when this
        // process stops answering: paused (a VM pause, CPU throttled to
        // nothing) or cut off with its socket still open, it would otherwise
        // keep the lock for as long as the server's TCP keepalive takes
        // (two hours by default) and no follower could lead. The leader
        // checks, and a follower tries, every second, so a session idle for
        // STALLED_SESSION_TIMEOUT belongs to a process that stopped; the
        // server ends it and frees the lock. idle_session_timeout is
        // PostgreSQL 14+; on 13 the server-side keepalive below is the only
        // bound (it sees a cut network, not a paused process).
        let setup = async {
            client
                .batch_execute(&format!(
                    "SET tcp_keepalives_idle = {0}; SET tcp_keepalives_interval = 1; SET tcp_keepalives_count = {0}",
                    STALLED_SESSION_TIMEOUT.as_secs()
                ))
                .await
                .map_err(|e| db_error(&self.cs, &e, "leader session"))?;
            if let Err(e) = client
                .batch_execute(&format!(
                    "SET idle_session_timeout = '{}ms'",
                    STALLED_SESSION_TIMEOUT.as_millis()
                ))
                .await
            {
                if e.code() != Some(&SqlState::UNDEFINED_OBJECT) {
                    return Err(db_error(&self.cs, &e, "leader session"));
                }
            }
            Ok(())
        };
        match setup.await {
            Ok(()) => Ok((client, task)),
            Err(e) => {
                task.abort();
                Err(e)
            }
        }
    }
}

/// A pooled session. One that met 25006 (read-only) is retired: a session
/// opened while the database was read-only keeps that default after the
/// database is made writable.
pub(crate) struct PgConn {
    pub client: tokio_postgres::Client,
    pub retire: bool,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for PgConn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl std::ops::Deref for PgConn {
    type Target = tokio_postgres::Client;
    fn deref(&self) -> &Self::Target {
        &self.client
    }
}

/// The pool's manager: sessions from a [`Target`], errors already classified.
pub(crate) struct Manager(pub Target);

impl bb8::ManageConnection for Manager {
    type Connection = PgConn;
    type Error = DbError;

    async fn connect(&self) -> Result<PgConn, DbError> {
        let (client, task) = self.0.connect(&self.0.config, "connect").await?;
        Ok(PgConn {
            client,
            retire: false,
            task,
        })
    }

    async fn is_valid(&self, conn: &mut PgConn) -> Result<(), DbError> {
        conn.client
            .simple_query("")
            .await
            .map(|_| ())
            .map_err(|e| db_error(&self.0.cs, &e, "connection check"))
    }

    fn has_broken(&self, conn: &mut PgConn) -> bool {
        conn.retire || conn.client.is_closed()
    }
}

/// [`Target::remote_host`] of a parsed configuration.
fn remote_host(config: &Config) -> Option<String> {
    use crate::engine::check::is_local_host;
    let addrs = config.get_hostaddrs();
    if !addrs.is_empty() {
        return addrs
            .iter()
            .find(|a| !a.is_loopback())
            .map(|a| a.to_string());
    }
    config.get_hosts().iter().find_map(|h| match h {
        tokio_postgres::config::Host::Tcp(name) if !is_local_host(name) => Some(name.clone()),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    #[test]
    fn the_remote_host_is_where_libpq_connects() {
        let remote = |cs: &str| remote_host(&Config::from_str(cs).unwrap());
        assert_eq!(remote("host=localhost"), None);
        assert_eq!(remote("host=/var/run/postgresql"), None);
        assert_eq!(remote("host=127.0.0.1,localhost"), None);
        assert_eq!(remote("host=db.example.com"), Some("db.example.com".into()));
        assert_eq!(remote("host=localhost,db2"), Some("db2".into()));
        assert_eq!(
            remote("postgres://u@10.1.2.3:5432/x"),
            Some("10.1.2.3".into())
        );
        // hostaddr is where the session goes; host only names it.
        assert_eq!(remote("host=db.example.com hostaddr=127.0.0.1"), None);
        assert_eq!(
            remote("host=localhost hostaddr=192.0.2.7"),
            Some("192.0.2.7".into())
        );
    }
}
