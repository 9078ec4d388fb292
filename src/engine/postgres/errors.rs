//! PostgreSQL errors: which are worth retrying, how they read, and what a
//! fill's error means (held, committed, busy). Never a password in a message.

use tokio_postgres::error::SqlState;
use tokio_postgres::types::FromSql;
use tokio_postgres::Row;

use crate::engine::{DbError, DbErrorKind, DbResult};
use crate::secret::ConnectionString;

/// Where in the fill transaction an error happened: a lock timeout on the
/// tombstone stream's row means another filler, on a message key an append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    Begin,
    Stream,
    /// The healed table's own lock (ROW EXCLUSIVE), taken before the insert.
    Table,
    Insert,
    Commit,
}

/// Transient: worth retrying as is. Everything else needs a person.
pub fn classify_code(code: &SqlState) -> DbErrorKind {
    let c = code.code();
    let transient_class = ["08", "40", "53", "57", "58", "55"];
    if transient_class.iter().any(|p| c.starts_with(p)) || c == "25006" || c == "25P04" {
        // 08 connection, 40 rollback (deadlock, serialization), 53 resources
        // (disk full, out of memory, too many connections), 57 operator
        // intervention (shutdown, query canceled, cannot connect now), 58 I/O,
        // 55 lock not available; 25006 read-only transaction (a failover in
        // progress), 25P04 idle session timeout.
        DbErrorKind::Transient
    } else {
        DbErrorKind::Permanent
    }
}

pub(crate) fn classify(e: &tokio_postgres::Error) -> DbErrorKind {
    match e.code() {
        Some(code) => classify_code(code),
        // No SQLSTATE: the connection broke, or an I/O error.
        None => DbErrorKind::Transient,
    }
}

/// A driver error as one line: SQLSTATE and message, or the I/O cause.
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => {
            let mut text = e.to_string();
            if let Some(source) = std::error::Error::source(e) {
                text = format!("{text}: {source}");
            }
            text
        }
    }
}

/// Classifies a driver error. Its text is the server's (which never repeats
/// a password) or the driver's (which is never handed the string, only
/// parsed values), passed through [`ConnectionString::scrub`] as a backstop.
/// A refused login (28P01, 28000) says so first; a missing right (42501)
/// says where to find which.
pub(crate) fn db_error(cs: &ConnectionString, e: &tokio_postgres::Error, during: &str) -> DbError {
    let text = cs.scrub(&describe(e));
    let message = match e.code().map(SqlState::code) {
        Some("28P01" | "28000") => {
            format!("login refused: check the user and password ({text})")
        }
        Some("42501") => {
            format!("{text} (a right is missing: `gap-healer check` names it and the GRANT to run)")
        }
        _ => text,
    };
    let (message, during) = if during.is_empty() {
        (message, None)
    } else {
        (format!("{during}: {message}"), Some(during.to_string()))
    };
    DbError {
        kind: classify(e),
        code: e.code().map(|c| c.code().to_string()),
        message,
        during,
    }
}

/// A failed connection attempt to `servers` (`host:port`, every host tried
/// when there are several; never the password): nothing there to connect
/// to, something there that is not PostgreSQL, or the server's own refusal.
/// `during`: what the session was for ("leader session"), named first;
/// empty for the pool's sessions.
///
/// tokio-postgres tells its failures apart only in their text: "error
/// connecting to server" is the TCP connection (or the name lookup); after
/// it, a malformed or unexpected answer to the startup message ("error
/// communicating with the server: bytes remaining on stream", "unexpected
/// message from server", "error parsing response from server", or the peer
/// closing without a word) comes from something that does not speak the
/// protocol: an HTTP server, SQL Server, a port-forwarder with nothing
/// behind it. A connection reset or broken is only lost.
pub(crate) fn connect_error(
    cs: &ConnectionString,
    servers: &str,
    e: &tokio_postgres::Error,
    during: &str,
) -> DbError {
    let cause = std::error::Error::source(e);
    let io_kind = cause
        .and_then(|c| c.downcast_ref::<std::io::Error>())
        .map(std::io::Error::kind);
    let lost = matches!(
        io_kind,
        Some(
            std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::TimedOut
        )
    );
    let said = e.to_string();
    let body = if e.as_db_error().is_some() {
        format!("PostgreSQL at {servers}: {}", db_error(cs, e, "").message)
    } else if said == "error connecting to server" {
        let cause = cause.map_or_else(String::new, |c| format!(": {}", cs.scrub(&c.to_string())));
        format!("cannot connect to PostgreSQL at {servers}{cause}")
    } else if lost {
        format!(
            "lost the connection to PostgreSQL at {servers}: {}",
            cs.scrub(&describe(e))
        )
    } else if matches!(
        said.as_str(),
        "error communicating with the server"
            | "unexpected message from server"
            | "error parsing response from server"
            | "connection closed"
    ) {
        format!(
            "the server at {servers} does not speak the PostgreSQL protocol (it answered the \
             startup message with: {}): check the host and port",
            cs.scrub(&describe(e))
        )
    } else {
        format!("PostgreSQL at {servers}: {}", cs.scrub(&describe(e)))
    };
    let message = if during.is_empty() {
        body
    } else {
        format!("{during}: {body}")
    };
    DbError {
        kind: classify(e),
        code: e.code().map(|c| c.code().to_string()),
        message,
        during: None,
    }
}

/// A column of a row, or a permanent error naming the column when the
/// server sent a type the engine did not expect (never a panic).
pub(crate) fn get<'a, T: FromSql<'a>>(row: &'a Row, column: &str) -> DbResult<T> {
    row.try_get(column).map_err(|e| DbError {
        kind: DbErrorKind::Permanent,
        code: None,
        message: format!("unexpected value in column {column}: {e}"),
        during: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        for (code, kind) in [
            (SqlState::T_R_DEADLOCK_DETECTED, DbErrorKind::Transient),
            (SqlState::T_R_SERIALIZATION_FAILURE, DbErrorKind::Transient),
            (SqlState::ADMIN_SHUTDOWN, DbErrorKind::Transient),
            (SqlState::CANNOT_CONNECT_NOW, DbErrorKind::Transient),
            (SqlState::QUERY_CANCELED, DbErrorKind::Transient),
            (SqlState::DISK_FULL, DbErrorKind::Transient),
            (SqlState::TOO_MANY_CONNECTIONS, DbErrorKind::Transient),
            (SqlState::READ_ONLY_SQL_TRANSACTION, DbErrorKind::Transient),
            (SqlState::CONNECTION_FAILURE, DbErrorKind::Transient),
            (SqlState::LOCK_NOT_AVAILABLE, DbErrorKind::Transient),
            (SqlState::INSUFFICIENT_PRIVILEGE, DbErrorKind::Permanent),
            (SqlState::UNDEFINED_TABLE, DbErrorKind::Permanent),
            (SqlState::UNDEFINED_COLUMN, DbErrorKind::Permanent),
            (SqlState::UNIQUE_VIOLATION, DbErrorKind::Permanent),
            (SqlState::SYNTAX_ERROR, DbErrorKind::Permanent),
        ] {
            assert_eq!(classify_code(&code), kind, "{}", code.code());
        }
    }
}
