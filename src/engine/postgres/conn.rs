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

use tokio_postgres::config::SslMode;
use tokio_postgres::error::SqlState;
use tokio_postgres::Config;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::errors::{connect_error, db_error, describe};
use super::tls;
use crate::engine::{DbError, DbResult};
use crate::secret::{shown_host, ConnectionString};

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

/// The bound of a dedicated session's opening when the configuration
/// gives none (it always does: [`Target::new`] sets the connect timeout).
const DEDICATED_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

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
        } = tls::parse(cs.expose()).map_err(|e| DbError::permanent(tls::refusal(&e)))?;
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

    /// Where it connects, for messages ([`servers`]).
    pub(crate) fn servers(&self) -> String {
        servers(&self.config)
    }

    /// The first server the sessions go to that is not this machine
    /// ([`crate::engine::check::is_local_host`]): each `hostaddr` when given
    /// (where libpq connects), else each `host`; `None` when all are local.
    pub(crate) fn remote_host(&self) -> Option<String> {
        remote_host(&self.config)
    }

    /// A session outside the pool, with its connection driven by a task
    /// that ends when the returned handle is aborted or the session closes.
    ///
    /// `allow` and `prefer` make a second attempt the other way when the
    /// first fails as libpq's would retry it ([`Target::second_attempt`]);
    /// each attempt is bounded by the connect timeout, as each of libpq's is.
    pub(crate) async fn connect(
        &self,
        config: &Config,
        during: &str,
    ) -> DbResult<(tokio_postgres::Client, tokio::task::JoinHandle<()>)> {
        let first = config.connect(self.tls.clone()).await;
        let (client, connection) = match first {
            Ok(session) => session,
            Err(first) => {
                let Some((mode, what)) = self.second_attempt(&first) else {
                    return Err(connect_error(&self.cs, &servers(config), &first, during));
                };
                let mut again = config.clone();
                again.ssl_mode(mode);
                again.connect(self.tls.clone()).await.map_err(|e| {
                    let mut error = connect_error(&self.cs, &servers(config), &e, during);
                    error.message = format!(
                        "{} ({what}: {})",
                        error.message,
                        self.cs.scrub(&describe(&first))
                    );
                    error
                })?
            }
        };
        let task = tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok((client, task))
    }

    /// libpq's second attempt after `first` failed, and what the first was:
    /// for `prefer`, a plain one when the TLS handshake failed, the server
    /// refused the session (a `hostnossl` entry in `pg_hba.conf`, or any
    /// refusal of the login) or dropped the connection after the SSL
    /// request (something that is not PostgreSQL answers it with neither
    /// `S` nor `N`, which the driver takes for `N`, and may reset the
    /// connection before its answer is read: a plain attempt reads it and
    /// says what answered); for `allow`, one with TLS when the server
    /// refused the plain session (a `hostssl` entry). A connection that
    /// never reached the server is not tried again.
    fn second_attempt(&self, first: &tokio_postgres::Error) -> Option<(SslMode, &'static str)> {
        use std::io::ErrorKind as K;
        let refused = first.as_db_error().is_some();
        let said = first.to_string();
        let handshake = said.starts_with("error performing TLS handshake");
        let dropped = said == "connection closed"
            || std::error::Error::source(first)
                .and_then(|c| c.downcast_ref::<std::io::Error>())
                .is_some_and(|io| {
                    matches!(
                        io.kind(),
                        K::ConnectionReset
                            | K::ConnectionAborted
                            | K::UnexpectedEof
                            | K::BrokenPipe
                    )
                });
        match self.mode {
            tls::TlsMode::Prefer if refused || handshake || dropped => Some((
                SslMode::Disable,
                "sslmode=prefer: this was the attempt without TLS; the one with TLS before it failed with",
            )),
            tls::TlsMode::Allow if refused => Some((
                SslMode::Require,
                "sslmode=allow: this was the attempt with TLS; the one without before it failed with",
            )),
            _ => None,
        }
    }

    /// A session of its own for the leader lock, outside the pool, with TCP
    /// keepalive so a dead peer is noticed within about 20 s without traffic,
    /// and ended by the server once idle for [`STALLED_SESSION_TIMEOUT`].
    ///
    /// Bounded as a whole by the connect timeout: tokio-postgres bounds only
    /// the TCP connect, so a server that accepts and never answers the
    /// startup (or the settings below) would hold the election, and with it
    /// the store's loop, for ever.
    pub(crate) async fn connect_dedicated(
        &self,
    ) -> DbResult<(tokio_postgres::Client, tokio::task::JoinHandle<()>)> {
        let limit = self
            .config
            .get_connect_timeout()
            .copied()
            .unwrap_or(DEDICATED_CONNECT_TIMEOUT);
        match tokio::time::timeout(limit, self.connect_dedicated_unbounded()).await {
            Ok(session) => session,
            Err(_) => Err(DbError::transient(format!(
                "no leader session with PostgreSQL at {} within {}",
                self.servers(),
                humantime::format_duration(limit)
            ))),
        }
    }

    async fn connect_dedicated_unbounded(
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

/// Where a configuration connects, for messages: `host:port` for each host
/// as tokio-postgres pairs them (one port for all, or one each; 5432 by
/// default), the address of `hostaddr` where given (that is where the
/// connection goes), a socket directory as its socket file.
fn servers(config: &Config) -> String {
    use tokio_postgres::config::Host;
    let (hosts, addrs, ports) = (
        config.get_hosts(),
        config.get_hostaddrs(),
        config.get_ports(),
    );
    let all: Vec<String> = (0..hosts.len().max(addrs.len()))
        .map(|i| {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            match (addrs.get(i), hosts.get(i)) {
                (Some(std::net::IpAddr::V6(ip)), _) => format!("[{ip}]:{port}"),
                (Some(ip), _) => format!("{ip}:{port}"),
                (None, Some(Host::Tcp(name))) => match shown_host(name) {
                    Some(name) if name.contains(':') => format!("[{name}]:{port}"),
                    Some(name) => format!("{name}:{port}"),
                    None => format!("a host that is no host name (not shown):{port}"),
                },
                #[cfg(unix)]
                (None, Some(Host::Unix(dir))) => {
                    let file = dir.join(format!(".s.PGSQL.{port}"));
                    match file.to_str().and_then(shown_host) {
                        Some(file) => file.to_string(),
                        None => {
                            format!("a socket directory that is no path (not shown), port {port}")
                        }
                    }
                }
                (None, None) => format!("?:{port}"),
            }
        })
        .collect();
    match all.as_slice() {
        [] => "no host".to_string(),
        [one] => one.clone(),
        many => format!("any of {}", many.join(", ")),
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
        let (client, task) = self.0.connect(&self.0.config, "").await?;
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
    use std::str::FromStr;

    use super::*;

    #[test]
    fn servers_are_named_as_host_and_port() {
        let named = |raw: &str| servers(&Config::from_str(raw).unwrap());
        assert_eq!(named("host=db"), "db:5432");
        assert_eq!(named("host=db port=6432"), "db:6432");
        assert_eq!(named("host=a,b port=1,2"), "any of a:1, b:2");
        assert_eq!(named("host=a,b port=7"), "any of a:7, b:7");
        assert_eq!(named("host=db hostaddr=10.0.0.1"), "10.0.0.1:5432");
        assert_eq!(named("hostaddr=::1 port=5"), "[::1]:5");
        assert_eq!(named("postgres://app@[::1]:5433/es"), "[::1]:5433");
        assert_eq!(
            named("host=/run/postgresql"),
            "/run/postgresql/.s.PGSQL.5432"
        );
        assert_eq!(named("user=app"), "no host");
        // A string that lost a quote: the "host" holds the rest of it.
        let mangled = named("host='db password=Zq7 Secret9x=y'");
        assert_eq!(mangled, "a host that is no host name (not shown):5432");
    }

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
