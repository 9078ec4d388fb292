//! SQL Server error numbers, classified in one place.
//!
//! Every failure the engine sees ends up here: a server error number reported
//! by the fill batch (with the stage it happened in), a server error token that
//! reached tiberius, an I/O or protocol failure, or a pool timeout. The answer
//! is either a normal fill outcome (the database decided: committed, held,
//! busy) or a [`DbError`] that says whether retrying can help.

use crate::engine::{DbError, DbErrorKind, FillOutcome};
use crate::secret::ConnectionString;

/// Where an error happened. The fill batch reports its stage as
/// `error_stage`; everything outside a fill is [`Stage::Read`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// A read (scan, head, probe, checkpoints, preflight) or a connection.
    Read,
    /// The fill's own argument and session checks.
    Check,
    /// Creating or locking the tombstone stream's Streams row.
    Stream,
    /// The leader fence: the leader's lock session must still hold its lock.
    Leader,
    /// The fill's intent-exclusive lock on Messages (a table lock waits it).
    Table,
    /// The fill's check of the highest committed position.
    Head,
    /// The tombstone insert into Messages.
    Messages,
    /// The update of the tombstone stream's Version.
    Version,
    /// COMMIT.
    Commit,
}

impl Stage {
    /// The `error_stage` values of `sql/mssql/fill.sql`. Unknown text is
    /// treated like a check failure (never as a normal outcome).
    pub(crate) fn from_fill(stage: &str) -> Stage {
        match stage {
            "stream" => Stage::Stream,
            "leader" => Stage::Leader,
            "table" => Stage::Table,
            "head" => Stage::Head,
            "messages" => Stage::Messages,
            "version" => Stage::Version,
            "commit" => Stage::Commit,
            _ => Stage::Check,
        }
    }

    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Stage::Read => "read",
            Stage::Check => "check",
            Stage::Stream => "stream",
            Stage::Leader => "leader",
            Stage::Table => "table",
            Stage::Head => "head",
            Stage::Messages => "messages",
            Stage::Version => "version",
            Stage::Commit => "commit",
        }
    }
}

/// What an error means for the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// Not an error: the database decided the fill's outcome.
    Outcome(FillOutcome),
    /// Retry with backoff.
    Transient,
    /// Retrying will not help until someone changes the database.
    Permanent,
}

/// Server errors after which a retry can succeed: deadlock victim, snapshot
/// update conflict, a full data or log file (an operator frees space or
/// backs up the log: the healer waits with backoff, as for PostgreSQL's
/// 53100), and the errors Azure
/// SQL and SQL Server report while a database moves, fails over, is
/// throttled or drops the connection. Client socket codes (64, 233, 10053,
/// 10054, 10060 in SqlClient) never arrive as server errors: tiberius reports
/// a broken connection as an I/O error, which is transient by itself.
pub(crate) const TRANSIENT_SERVER_ERRORS: &[u32] = &[
    601,   // NOLOCK scan aborted by data movement (fills themselves can cause it)
    701,   // not enough memory to run the query
    976,   // availability group database not accessible (a secondary now)
    983,   // availability group replica role not resolved (failover)
    1101,  // no new page: filegroup full, disk full
    1105,  // no space for an object: filegroup full
    1204,  // cannot obtain a lock: the lock table is out of memory
    1205,  // deadlock victim
    3948,  // snapshot transaction aborted: a secondary replica's state changed
    3960,  // snapshot isolation update conflict
    4060,  // cannot open database (Azure: database moving or restarting)
    4221,  // login to a read secondary failed while the replica catches up
    8645,  // timeout waiting for memory to run the query
    9002,  // transaction log full
    10928, // Azure: resource limit reached
    10929, // Azure: resource limit, minimum guarantee not available
    40143, // Azure: the service has encountered an error processing your request
    40197, // Azure: error processing the request (failover, upgrade)
    40501, // Azure: the service is currently busy
    40540, // Azure: the service has encountered an error processing your request
    40613, // Azure: database not currently available
    42108, // Azure: cannot connect to the SQL pool
    42109, // Azure: the SQL pool is warming up
    49918, // Azure: not enough resources to process the request
    49919, // Azure: too many create or update operations in progress
    49920, // Azure: too many operations in progress
];

/// The database is read-only: a readable secondary replica, or a database
/// set READ_ONLY. Permanent: every fill would fail the same way until the
/// healer is pointed at the primary (what [`server_error`] says).
pub(crate) const READ_ONLY_DATABASE: u32 = 3906;

/// Lock request time out period exceeded.
pub(crate) const LOCK_TIMEOUT: u32 = 1222;
/// Login failed: a wrong user or password, or a login not allowed in.
pub(crate) const LOGIN_FAILED: u32 = 18456;
/// Babelfish's generic error number: what it means is in the message.
pub(crate) const BABELFISH_GENERIC: u32 = 33_557_097;

/// PostgreSQL's words, under Babelfish's generic number, for a server that
/// is stopping, starting or recovering: a restart, retried like SQL
/// Server's failover errors.
const BABELFISH_TRANSIENT_TEXTS: [&str; 5] = [
    "the database system is shutting down",
    "the database system is starting up",
    "the database system is in recovery mode",
    "terminating connection due to administrator command",
    "the database system is not yet accepting connections",
];

/// The SQL Server error number an error stands for. Babelfish reports a
/// lock timeout as its generic 33557097 with PostgreSQL's text ("canceling
/// statement due to lock timeout"): that is 1222, as on SQL Server.
pub(crate) fn normalize(code: u32, message: &str) -> u32 {
    if code == BABELFISH_GENERIC && message.contains("lock timeout") {
        LOCK_TIMEOUT
    } else {
        code
    }
}
/// Violation of a PRIMARY KEY or UNIQUE constraint.
pub(crate) const DUPLICATE_KEY_CONSTRAINT: u32 = 2627;
/// Duplicate key row in a unique index.
pub(crate) const DUPLICATE_KEY_INDEX: u32 = 2601;
/// gap-healer's own: the leader's lock session has ended (the leader fence of
/// `fill.sql`).
pub(crate) const LEADER_FENCE: u32 = 50006;
/// gap-healer's own: another healer of a described table holds its
/// tombstone lock (`fill_table.sql`'s `sp_getapplock` timed out).
pub(crate) const TOMBSTONE_LOCK_BUSY: u32 = 50008;

/// The one classification of SQL Server error numbers.
///
/// - 2627/2601 on the tombstone insert: a position of the range is committed.
/// - 1222 on the tombstone insert: a position is held by an open append.
/// - 1222 on the tombstone stream's row: another healer is filling.
/// - 1222 on the fill's intent lock on Messages: a table lock (an offline
///   index build, a TABLOCK writer): the store backs off.
/// - 50006 at the leader fence: this process no longer leads (its lock
///   session has ended), so another healer may be filling: busy.
/// - 50008 at the tombstone stream: another healer of a described table
///   holds its tombstone lock: busy.
/// - 1222 anywhere else (a read waiting on a page or table lock): transient.
/// - deadlocks and the documented transient errors: transient.
/// - everything else (missing objects, missing rights, gap-healer's own
///   other checks 50001..50005): permanent.
pub(crate) fn classify(code: u32, stage: Stage) -> Class {
    match (code, stage) {
        (DUPLICATE_KEY_CONSTRAINT | DUPLICATE_KEY_INDEX, Stage::Messages) => {
            Class::Outcome(FillOutcome::Committed)
        }
        (LOCK_TIMEOUT, Stage::Messages) => Class::Outcome(FillOutcome::Held),
        (LOCK_TIMEOUT, Stage::Stream) => Class::Outcome(FillOutcome::Busy),
        (LOCK_TIMEOUT, Stage::Table) => Class::Outcome(FillOutcome::TableLocked),
        (LEADER_FENCE, Stage::Leader) => Class::Outcome(FillOutcome::Busy),
        (TOMBSTONE_LOCK_BUSY, Stage::Stream) => Class::Outcome(FillOutcome::Busy),
        (LOCK_TIMEOUT, _) => Class::Transient,
        (c, _) if TRANSIENT_SERVER_ERRORS.contains(&c) => Class::Transient,
        _ => Class::Permanent,
    }
}

/// A server error number and message as a [`DbError`] (never an outcome:
/// callers that can get an outcome ask [`classify`] first).
pub(crate) fn server_error(
    code: u32,
    stage: Stage,
    message: &str,
    secret: &ConnectionString,
) -> DbError {
    let restarting = code == BABELFISH_GENERIC
        && BABELFISH_TRANSIENT_TEXTS
            .iter()
            .any(|text| message.contains(text));
    let kind = match classify(code, stage) {
        Class::Transient => DbErrorKind::Transient,
        _ if restarting => DbErrorKind::Transient,
        Class::Permanent | Class::Outcome(_) => DbErrorKind::Permanent,
    };
    let hint = if code == READ_ONLY_DATABASE {
        " (the database is read-only: gap-healer is connected to a readable secondary replica, for \
         example through a listener with ApplicationIntent=ReadOnly, or the database is set READ_ONLY. \
         Tombstones can only be written on the primary: point the connection string at it, or make \
         the database READ_WRITE; `gap-healer check` shows the database's updateability)"
    } else {
        ""
    };
    let text = format!(
        "SQL Server error {code}: {}{hint}",
        secret.scrub(message.trim())
    );
    let message = if code == LOGIN_FAILED {
        format!("login refused: check the user and password ({text})")
    } else {
        text
    };
    DbError {
        kind,
        code: Some(code.to_string()),
        message,
        during: None,
    }
}

/// What `sp_getapplock`'s return code means for the leader lock: `Ok(true)`
/// taken (0 at once, 1 after a wait, which `@LockTimeout = 0` rules out),
/// `Ok(false)` another session holds it (-1, timed out at once), an error
/// otherwise: -2 (cancelled) and -3 (deadlock victim) can pass on a retry,
/// -999 (a parameter or call error) and anything undocumented cannot.
pub(crate) fn applock_result(code: i32) -> Result<bool, DbError> {
    let (kind, what) = match code {
        c if c >= 0 => return Ok(true),
        -1 => return Ok(false),
        -2 => (DbErrorKind::Transient, "the lock request was cancelled"),
        -3 => (
            DbErrorKind::Transient,
            "the lock request was chosen as a deadlock victim",
        ),
        -999 => (
            DbErrorKind::Permanent,
            "a parameter validation or other call error",
        ),
        _ => (DbErrorKind::Permanent, "an undocumented return code"),
    };
    Err(DbError {
        kind,
        code: Some(format!("sp_getapplock {code}")),
        message: format!("sp_getapplock returned {code}: {what}"),
        during: None,
    })
}

/// A tiberius error as a [`DbError`] (tiberius is handed parsed values,
/// never the string; [`ConnectionString::scrub`] is the backstop).
pub(crate) fn driver_error(err: &tiberius::error::Error, secret: &ConnectionString) -> DbError {
    use tiberius::error::Error as E;
    match err {
        E::Server(token) => server_error(
            normalize(token.code(), token.message()),
            Stage::Read,
            token.message(),
            secret,
        ),
        E::Io { .. } | E::Protocol(_) | E::Routing { .. } => {
            DbError::transient(format!("SQL Server connection failed: {}", secret.scrub(&err.to_string())))
        }
        E::Tls(_) => DbError::permanent(format!(
            "TLS with SQL Server failed: {} (check Encrypt, TrustServerCertificate and the server's certificate)",
            secret.scrub(&err.to_string())
        )),
        _ => DbError::permanent(format!("SQL Server driver error: {}", secret.scrub(&err.to_string()))),
    }
}

/// A failed login to the server at `addr` (`host:port`; never the
/// password) as a [`DbError`]: the server's own refusal, or an answer that
/// is not TDS. tiberius reads the answer to its PRELOGIN as TDS packets, so
/// something else listening there (an HTTP server, PostgreSQL, a
/// port-forwarder with nothing behind it) shows as a protocol error ("invalid
/// packet type") or as the stream ending early ("failed to fill whole
/// buffer"); a connection reset or broken is only lost.
pub(crate) fn login_error(
    err: &tiberius::error::Error,
    addr: &str,
    secret: &ConnectionString,
) -> DbError {
    use std::io::ErrorKind as K;
    use tiberius::error::Error as E;
    let not_tds = match err {
        E::Protocol(_) => true,
        E::Io { kind, .. } => matches!(kind, K::UnexpectedEof | K::InvalidData | K::InvalidInput),
        _ => false,
    };
    let lost = matches!(err, E::Io { .. }) && !not_tds;
    let said = secret.scrub(&err.to_string());
    let message = if not_tds {
        format!(
            "the server at {addr} does not speak TDS, SQL Server's protocol (it answered the \
             login with: {said}): check the server name and port"
        )
    } else if lost {
        format!("lost the connection to SQL Server at {addr}: {said}")
    } else {
        let e = driver_error(err, secret);
        return DbError {
            message: format!("SQL Server at {addr}: {}", e.message),
            ..e
        };
    };
    DbError {
        kind: DbErrorKind::Transient,
        code: None,
        message,
        during: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL_STAGES: [Stage; 9] = [
        Stage::Read,
        Stage::Check,
        Stage::Stream,
        Stage::Leader,
        Stage::Table,
        Stage::Head,
        Stage::Messages,
        Stage::Version,
        Stage::Commit,
    ];

    #[test]
    fn classification_table() {
        use Class::*;
        use FillOutcome::*;
        let table: &[(u32, Stage, Class)] = &[
            // The database decided: normal outcomes of a fill.
            (2627, Stage::Messages, Outcome(Committed)),
            (2601, Stage::Messages, Outcome(Committed)),
            (1222, Stage::Messages, Outcome(Held)),
            (50008, Stage::Stream, Outcome(Busy)),
            (1222, Stage::Stream, Outcome(Busy)),
            (1222, Stage::Table, Outcome(TableLocked)),
            (50006, Stage::Leader, Outcome(Busy)),
            // The fence's number anywhere else is no outcome.
            (50006, Stage::Stream, Permanent),
            (50006, Stage::Check, Permanent),
            // A lock timeout at the fence: retry.
            (1222, Stage::Leader, Transient),
            // A lock timeout anywhere else: a page or table lock, retry.
            (1222, Stage::Read, Transient),
            (1222, Stage::Head, Transient),
            (1222, Stage::Version, Transient),
            // A duplicate key outside the insert is not "committed".
            (2627, Stage::Stream, Permanent),
            (2627, Stage::Table, Permanent),
            (2601, Stage::Read, Permanent),
            (2627, Stage::Version, Permanent),
            // Deadlock and documented transient errors, at any stage.
            (1205, Stage::Messages, Transient),
            (1205, Stage::Stream, Transient),
            (1205, Stage::Read, Transient),
            (40613, Stage::Read, Transient),
            (40197, Stage::Commit, Transient),
            (40501, Stage::Read, Transient),
            (49918, Stage::Read, Transient),
            (49919, Stage::Read, Transient),
            (49920, Stage::Read, Transient),
            (4060, Stage::Read, Transient),
            (4221, Stage::Read, Transient),
            (10928, Stage::Read, Transient),
            (10929, Stage::Read, Transient),
            // Everything else is permanent.
            (208, Stage::Read, Permanent),      // invalid object name
            (229, Stage::Read, Permanent),      // permission denied
            (1088, Stage::Messages, Permanent), // IDENTITY_INSERT without ALTER
            (18456, Stage::Read, Permanent),    // login failed
            (547, Stage::Messages, Permanent),  // constraint (FK/CHECK) conflict
            (50001, Stage::Check, Permanent),   // gap-healer: open transaction
            (50002, Stage::Check, Permanent),   // gap-healer: range too wide
            (50004, Stage::Stream, Permanent),  // gap-healer: stream drifted
            (50005, Stage::Head, Permanent),    // gap-healer: at or above head
        ];
        for &(code, stage, want) in table {
            assert_eq!(classify(code, stage), want, "error {code} at {stage:?}");
        }
    }

    /// Review finding F6: resource and data-movement errors pass on a retry;
    /// client socket codes are not server errors and are not listed.
    #[test]
    fn resource_errors_are_retried_and_client_socket_codes_are_not_listed() {
        for code in [601, 701, 1204, 8645, 3948] {
            for stage in ALL_STAGES {
                assert_eq!(classify(code, stage), Class::Transient, "{code}");
            }
        }
        for code in [64, 233, 10053, 10054, 10060] {
            assert!(!TRANSIENT_SERVER_ERRORS.contains(&code), "{code}");
        }
    }

    /// A Babelfish (PostgreSQL) server restarting is retried; its other
    /// generic errors stay permanent.
    #[test]
    fn babelfish_restarts_are_transient() {
        let secret = ConnectionString::new("Server=db;User Id=app;Password=x");
        for text in BABELFISH_TRANSIENT_TEXTS {
            let e = server_error(BABELFISH_GENERIC, Stage::Read, text, &secret);
            assert_eq!(e.kind, DbErrorKind::Transient, "{text}");
        }
        let e = server_error(
            BABELFISH_GENERIC,
            Stage::Read,
            "relation does not exist",
            &secret,
        );
        assert_eq!(e.kind, DbErrorKind::Permanent);
    }

    /// Babelfish's lock timeout is 1222 by another number.
    #[test]
    fn babelfish_lock_timeouts_are_lock_timeouts() {
        let text = "canceling statement due to lock timeout";
        assert_eq!(normalize(BABELFISH_GENERIC, text), LOCK_TIMEOUT);
        assert_eq!(
            classify(normalize(BABELFISH_GENERIC, text), Stage::Messages),
            Class::Outcome(FillOutcome::Held)
        );
        assert_eq!(
            classify(normalize(BABELFISH_GENERIC, text), Stage::Stream),
            Class::Outcome(FillOutcome::Busy)
        );
        // Any other generic error stays what it is.
        assert_eq!(
            normalize(BABELFISH_GENERIC, "syntax error"),
            BABELFISH_GENERIC
        );
        assert_eq!(normalize(1222, "whatever"), 1222);
    }

    #[test]
    fn full_disks_and_failovers_are_retried() {
        // Issue 5: reported, retried with backoff, never a crash loop.
        for code in [1101, 1105, 9002, 976, 983] {
            for stage in ALL_STAGES {
                assert_eq!(classify(code, stage), Class::Transient, "{code}");
            }
        }
    }

    /// Review finding F6: a readable secondary answers every fill with 3906;
    /// retrying it as transient went on for ever without saying why.
    #[test]
    fn a_read_only_database_is_permanent_and_says_where_to_connect() {
        for stage in ALL_STAGES {
            assert_eq!(classify(3906, stage), Class::Permanent);
        }
        let secret = ConnectionString::new("Server=db;User Id=app;Password=Hunter2");
        let err = server_error(
            3906,
            Stage::Messages,
            "Failed to update database \"orders\" because the database is read-only.",
            &secret,
        );
        assert_eq!(err.kind, DbErrorKind::Permanent);
        assert_eq!(err.code.as_deref(), Some("3906"));
        for part in [
            "readable secondary",
            "primary",
            "READ_WRITE",
            "updateability",
        ] {
            assert!(err.message.contains(part), "{part}: {}", err.message);
        }
        let other = server_error(1205, Stage::Messages, "deadlock", &secret);
        assert!(!other.message.contains("read-only"), "{}", other.message);
    }

    #[test]
    fn transient_errors_are_transient_at_every_stage() {
        for &code in TRANSIENT_SERVER_ERRORS {
            for stage in ALL_STAGES {
                assert_eq!(
                    classify(code, stage),
                    Class::Transient,
                    "{code} at {stage:?}"
                );
            }
        }
    }

    #[test]
    fn outcomes_only_come_from_the_insert_the_table_and_the_stream_lock() {
        for code in [0, 1, 208, 1205, 1222, 2601, 2627, 3960, 40613, 50005, 50006] {
            for stage in ALL_STAGES {
                if let Class::Outcome(o) = classify(code, stage) {
                    assert!(
                        matches!(
                            (stage, o),
                            (Stage::Messages, FillOutcome::Committed | FillOutcome::Held)
                                | (Stage::Stream | Stage::Leader, FillOutcome::Busy)
                                | (Stage::Table, FillOutcome::TableLocked)
                        ),
                        "{code} at {stage:?} -> {o:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn stages_round_trip() {
        for stage in ALL_STAGES.into_iter().filter(|s| *s != Stage::Read) {
            assert_eq!(Stage::from_fill(stage.as_str()), stage);
        }
        assert_eq!(Stage::from_fill("surprise"), Stage::Check);
    }

    #[test]
    fn applock_return_codes() {
        assert_eq!(applock_result(0), Ok(true));
        assert_eq!(applock_result(1), Ok(true));
        assert_eq!(applock_result(-1), Ok(false));
        for (code, kind) in [
            (-2, DbErrorKind::Transient),
            (-3, DbErrorKind::Transient),
            (-999, DbErrorKind::Permanent),
            (-4, DbErrorKind::Permanent),
            (i32::MIN, DbErrorKind::Permanent),
        ] {
            let err = applock_result(code).unwrap_err();
            assert_eq!(err.kind, kind, "{code}");
            assert_eq!(err.code, Some(format!("sp_getapplock {code}")));
            assert!(err.message.contains(&code.to_string()), "{}", err.message);
        }
    }

    /// A driver's message that repeats the whole connection string is
    /// withheld; any other is shown as it is, never with pieces masked.
    #[test]
    fn driver_errors_are_classified_and_scrubbed() {
        let secret = ConnectionString::new("Server=db;User Id=sa;Password=hunter2;");
        let io = tiberius::error::Error::Io {
            kind: std::io::ErrorKind::ConnectionReset,
            message: "reset while sending Server=db;User Id=sa;Password=hunter2;".into(),
        };
        let e = driver_error(&io, &secret);
        assert!(e.is_transient());
        assert!(!e.message.contains("hunter2"), "{}", e.message);

        let tls = tiberius::error::Error::Tls("bad certificate".into());
        assert_eq!(driver_error(&tls, &secret).kind, DbErrorKind::Permanent);
        let conv = tiberius::error::Error::Conversion("nope".into());
        assert_eq!(driver_error(&conv, &secret).kind, DbErrorKind::Permanent);
        let protocol = tiberius::error::Error::Protocol("garbled".into());
        assert!(driver_error(&protocol, &secret).is_transient());

        let e = server_error(18456, Stage::Read, "Login failed for user 'sa'.", &secret);
        assert_eq!(e.kind, DbErrorKind::Permanent);
        assert_eq!(e.code.as_deref(), Some("18456"));
        assert!(!e.message.contains("hunter2"), "{}", e.message);
        assert!(
            e.message
                .starts_with("login refused: check the user and password (SQL Server error 18456: Login failed for user 'sa'"),
            "{}",
            e.message
        );

        let io = tiberius::error::Error::Io {
            kind: std::io::ErrorKind::ConnectionRefused,
            message: "refused".into(),
        };
        assert!(driver_error(&io, &secret).is_transient());
    }

    /// A failed login names the server once: not TDS, lost, or refused.
    #[test]
    fn login_errors_name_the_server() {
        let secret = ConnectionString::new("Server=db;User Id=sa;Password=hunter2;");
        let protocol = tiberius::error::Error::Protocol("header: invalid packet type: 72".into());
        let e = login_error(&protocol, "db:1433", &secret);
        assert!(e.is_transient());
        assert!(
            e.message.starts_with(
                "the server at db:1433 does not speak TDS, SQL Server's protocol (it answered the login with: Protocol error: header: invalid packet type: 72)"
            ),
            "{}",
            e.message
        );
        let eof = tiberius::error::Error::Io {
            kind: std::io::ErrorKind::UnexpectedEof,
            message: "failed to fill whole buffer".into(),
        };
        assert!(login_error(&eof, "db:1433", &secret)
            .message
            .contains("does not speak TDS"));
        let reset = tiberius::error::Error::Io {
            kind: std::io::ErrorKind::ConnectionReset,
            message: "reset while sending Server=db;User Id=sa;Password=hunter2;".into(),
        };
        let e = login_error(&reset, "db:1433", &secret);
        assert!(e.is_transient());
        assert!(
            e.message
                .starts_with("lost the connection to SQL Server at db:1433: "),
            "{}",
            e.message
        );
        assert!(!e.message.contains("hunter2"), "{}", e.message);
        // Anything else is the driver's error, prefixed with where.
        let tls = tiberius::error::Error::Tls("bad certificate".into());
        let e = login_error(&tls, "db:1433", &secret);
        assert_eq!(e.kind, DbErrorKind::Permanent);
        assert!(
            e.message
                .starts_with("SQL Server at db:1433: TLS with SQL Server failed"),
            "{}",
            e.message
        );
    }
}
