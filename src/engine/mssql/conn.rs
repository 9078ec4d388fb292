//! Connections: the ADO.NET connection string, and a bb8 pool that never hands
//! out a session in an unknown state.
//!
//! # The connection string
//! Eventuous users have ADO.NET strings (`Server=tcp:host,1433;Database=..;
//! User Id=..;Password=..;Encrypt=true`). tiberius parses them with
//! `Config::from_ado_string`, but its parser (the `connection-string` 0.2
//! crate) keeps a doubled quote inside a quoted value doubled (`'a''b'` gives
//! `a''b`, not `a'b`), rejects every non-ASCII character, and names the
//! offending character in its error. So this module splits the string by the
//! ADO.NET rules itself, hands tiberius everything except the credentials, and
//! sets the credentials on the resulting `Config` directly. The password never
//! passes through a parser that could echo it, and passwords with `;`, `'`,
//! `"`, `=` or any Unicode work when quoted the way SqlClient expects.
//!
//! # Sessions in the pool
//! A session is marked unclean when it is checked out and clean again only when
//! the work on it finished in a known state. bb8 asks [`Manager::has_broken`]
//! when a connection comes back; an unclean one is closed instead of pooled.
//! So a query future dropped half way (timeout, shutdown) or a fill that ended
//! without its result row closes its connection, and the server rolls back
//! whatever that session had open.
//!
//! # Dedicated sessions
//! The leader lock lives on a session of its own, never a pooled one
//! ([`connect`], as the pool's are): it is opened with TCP keepalive on,
//! follows an Azure SQL gateway redirect, and is closed by dropping it.

use tiberius::{AuthMethod, Config, EncryptionLevel};
use tokio::net::{TcpSocket, TcpStream};
use tokio_util::compat::{Compat, TokioAsyncWriteCompatExt};

use super::errors::{driver_error, login_error};
use crate::engine::ado_connection_string::{last, split_ado, AdoError};
use crate::engine::DbError;
use crate::secret::{shown_host, ConnectionString};

/// A tiberius client on a tokio TCP stream.
pub(crate) type Client = tiberius::Client<Compat<TcpStream>>;

/// One pooled SQL Server session.
pub(crate) struct Session {
    pub(crate) client: Client,
    /// False while work is in progress or after it ended in an unknown state:
    /// the pool then closes the connection instead of reusing it.
    pub(crate) clean: bool,
}

/// bb8's view of SQL Server: sessions from [`connect`], the clean flag, and
/// error classification.
pub(crate) struct Manager {
    config: Config,
    secret: ConnectionString,
}

impl Manager {
    pub(crate) fn new(config: Config, secret: ConnectionString) -> Self {
        Manager { config, secret }
    }
}

impl bb8::ManageConnection for Manager {
    type Connection = Session;
    type Error = DbError;

    async fn connect(&self) -> Result<Session, DbError> {
        let client = connect(&self.config, &self.secret).await?;
        Ok(Session {
            client,
            clean: true,
        })
    }

    async fn is_valid(&self, session: &mut Session) -> Result<(), DbError> {
        // Unclean until the round trip completes: if bb8 drops this check half
        // way (its checkout timed out), the connection must not be reused.
        session.clean = false;
        let result = async {
            session
                .client
                .simple_query("SELECT 1")
                .await?
                .into_row()
                .await
        }
        .await;
        match result {
            Ok(_) => {
                session.clean = true;
                Ok(())
            }
            Err(e) => Err(driver_error(&e, &self.secret)),
        }
    }

    fn has_broken(&self, session: &mut Session) -> bool {
        !session.clean
    }
}

/// Opens one session, pooled or dedicated: TCP with `SO_KEEPALIVE` and
/// `TCP_NODELAY`, then the TDS login; one redirect (Azure SQL's "redirect"
/// connection policy) is followed.
///
/// `Encrypt=false` behaves as SqlClient's: the login is encrypted when the
/// server offers TLS, and a server that offers none (Babelfish without
/// PostgreSQL's ssl) gets a plaintext session. `Encrypt=true` (or strict)
/// never falls back: such a server is refused.
///
/// Keepalive uses the operating system's timers (on Linux the first probe
/// after 2 hours idle, unless `net.ipv4.tcp_keepalive_time` says otherwise):
/// tokio sets only the flag, and the idle time needs socket2, which is not a
/// dependency. The leader's heartbeat query every second, bounded by the
/// caller, is what notices a dead server quickly; keepalive only keeps a
/// quiet connection from being dropped silently by a middlebox.
pub(crate) async fn connect(config: &Config, secret: &ConnectionString) -> Result<Client, DbError> {
    let addr = config.get_addr();
    if !wants_login_encryption_only(config) {
        return login(config.clone(), secret)
            .await
            .map_err(|e| e.into_db(&addr));
    }
    let mut plain = config.clone();
    plain.encryption(EncryptionLevel::NotSupported);
    if offers_no_tls(&addr) {
        return login(plain, secret).await.map_err(|e| e.into_db(&addr));
    }
    // A server without TLS answers the TLS handshake with EOF, or (seen on
    // Babelfish) not at all: a login that hangs past LOGIN_WAIT is taken
    // for the same answer.
    match tokio::time::timeout(LOGIN_WAIT, login(config.clone(), secret)).await {
        Ok(Err(Refused::NoTls)) | Err(_) => {
            remember_no_tls(&addr);
            tracing::info!(
                server = %addr,
                "the server offers no TLS and the connection string says Encrypt=false: connecting unencrypted"
            );
            login(plain, secret).await.map_err(|e| e.into_db(&addr))
        }
        Ok(other) => other.map_err(|e| e.into_db(&addr)),
    }
}

/// How long an `Encrypt=false` login may take before the server is taken
/// for one without TLS.
const LOGIN_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Servers (host:port) that answered an `Encrypt=false` login without TLS:
/// later sessions go there unencrypted at once.
fn no_tls_servers() -> &'static std::sync::Mutex<std::collections::HashSet<String>> {
    static SERVERS: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<String>>> =
        std::sync::OnceLock::new();
    SERVERS.get_or_init(Default::default)
}

fn offers_no_tls(addr: &str) -> bool {
    no_tls_servers().lock().is_ok_and(|s| s.contains(addr))
}

fn remember_no_tls(addr: &str) {
    if let Ok(mut servers) = no_tls_servers().lock() {
        servers.insert(addr.to_string());
    }
}

/// A connection string's `Encrypt=false` (tiberius: encrypt the login only).
/// tiberius has no getter for the level; its `Debug` output names it (the
/// unit test below pins that).
pub(super) fn wants_login_encryption_only(config: &Config) -> bool {
    format!("{config:?}").contains("encryption: Off")
}

/// Why a login failed.
enum Refused {
    /// The server offers no TLS where the login asked for it.
    NoTls,
    Other(DbError),
}

impl Refused {
    /// `addr`: the server the login went to.
    fn into_db(self, addr: &str) -> DbError {
        match self {
            Refused::NoTls => DbError::permanent(format!(
                "SQL Server at {} offers no TLS and the connection string asks for encryption \
                 (Encrypt=true or strict): not connecting unencrypted",
                shown_addr(addr)
            )),
            Refused::Other(e) => e,
        }
    }
}

/// One login attempt. tiberius panics when the server offers no TLS and
/// the login requires it; the attempt runs as its own task so that panic is
/// an error here, not a crash.
async fn login(config: Config, secret: &ConnectionString) -> Result<Client, Refused> {
    let addr = config.get_addr();
    let task_secret = secret.clone();
    let attempt = tokio::spawn(async move { login_once(config, &task_secret).await });
    match attempt.await {
        Ok(result) => result,
        Err(join) if join.is_panic() => Err(Refused::NoTls),
        Err(join) => Err(Refused::Other(DbError::transient(format!(
            "the login to SQL Server at {} did not finish: {join}",
            shown_addr(&addr)
        )))),
    }
}

async fn login_once(config: Config, secret: &ConnectionString) -> Result<Client, Refused> {
    let failed = |e: tiberius::error::Error, addr: &str| {
        let no_tls = matches!(&e, tiberius::error::Error::Tls(_))
            || matches!(&e, tiberius::error::Error::Io { message, .. } if message.contains("tls handshake eof"));
        if no_tls {
            Refused::NoTls
        } else {
            Refused::Other(login_error(&e, &shown_addr(addr), secret))
        }
    };
    let addr = config.get_addr();
    let tcp = open_tcp(&addr, secret).await.map_err(Refused::Other)?;
    match tiberius::Client::connect(config.clone(), tcp.compat_write()).await {
        Ok(client) => Ok(client),
        Err(tiberius::error::Error::Routing { host, port }) => {
            let mut routed = config;
            routed.host(&host);
            routed.port(port);
            let addr = routed.get_addr();
            let tcp = open_tcp(&addr, secret).await.map_err(Refused::Other)?;
            tiberius::Client::connect(routed, tcp.compat_write())
                .await
                .map_err(|e| failed(e, &addr))
        }
        Err(e) => Err(failed(e, &addr)),
    }
}

/// `host:port` as messages show it: a server name that is no host name (a
/// string mangled by a missing quote may carry part of a password into it)
/// is not shown.
pub(crate) fn shown_addr(addr: &str) -> String {
    shown_host(addr).map_or_else(
        || "a server that is no host name (not shown)".to_string(),
        str::to_string,
    )
}

/// A TCP connection to `addr` (`host:port`) with keepalive and nodelay, trying
/// each resolved address in turn.
async fn open_tcp(addr: &str, secret: &ConnectionString) -> Result<TcpStream, DbError> {
    let unreachable = |e: std::io::Error| {
        DbError::transient(secret.scrub(&format!(
            "cannot connect to SQL Server at {}: {e}",
            shown_addr(addr)
        )))
    };
    let mut last = None;
    for resolved in tokio::net::lookup_host(addr).await.map_err(unreachable)? {
        let attempt = async {
            let socket = if resolved.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            socket.set_keepalive(true)?;
            socket.set_nodelay(true)?;
            socket.connect(resolved).await
        };
        match attempt.await {
            Ok(stream) => return Ok(stream),
            Err(e) => last = Some(e),
        }
    }
    Err(unreachable(last.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "the server name resolved to no address",
        )
    })))
}

const USER_KEYS: [&str; 5] = ["user id", "uid", "user", "username", "user name"];
const PASSWORD_KEYS: [&str; 2] = ["password", "pwd"];
const INTEGRATED_KEYS: [&str; 3] = [
    "integrated security",
    "integratedsecurity",
    "trusted_connection",
];
const DATABASE_KEYS: [&str; 3] = ["database", "initial catalog", "databasename"];
const APPLICATION_KEYS: [&str; 2] = ["application name", "applicationname"];
/// Keys handed to tiberius's own parser (server and TLS settings), each
/// with its name and what it takes, for the message when tiberius refuses
/// its value (its own errors name no key: "Not a valid boolean").
const TIBERIUS_KEYS: [(&str, &str, &str); 6] = [
    (
        "server",
        "Server",
        "tcp:host,port or host,port (host alone: port 1433; named instances need their port)",
    ),
    (
        "data source",
        "Data Source",
        "tcp:host,port or host,port (host alone: port 1433; named instances need their port)",
    ),
    (
        "trustservercertificate",
        "TrustServerCertificate",
        "true or false",
    ),
    (
        "trustservercertificateca",
        "TrustServerCertificateCA",
        "a certificate file (.pem, .crt or .der)",
    ),
    (
        "encrypt",
        "Encrypt",
        "true, false, yes, no, mandatory or optional",
    ),
    ("applicationintent", "ApplicationIntent", "ReadWrite"),
];
/// SqlClient's spellings with spaces, as tiberius spells them.
const KEY_ALIASES: [(&str, &str); 3] = [
    ("trust server certificate", "trustservercertificate"),
    ("application intent", "applicationintent"),
    ("address", "server"),
];

fn is_true(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "true" | "yes" | "sspi"
    )
}

/// A value as tiberius's lexer reads it back unchanged, or `None`.
fn quote_for_tiberius(v: &str) -> Option<String> {
    if !v.is_ascii() {
        return None;
    }
    let special = |c: char| matches!(c, ';' | '=' | '\'' | '"' | '{' | '}') || c.is_whitespace();
    if !v.contains(special) {
        Some(v.to_string())
    } else if !v.contains('"') && !v.contains("  ") {
        Some(format!("\"{v}\""))
    } else if !v.contains('\'') && !v.contains("  ") {
        Some(format!("'{v}'"))
    } else if !v.contains('}') {
        Some(format!("{{{v}}}"))
    } else {
        None
    }
}

/// The tiberius configuration for an ADO.NET connection string, with SQL
/// Server authentication from its `User Id` and `Password`. What it refuses
/// is refused in this order: another way of signing in, a read-only intent,
/// a missing `User Id`, contradicting certificate trusts, then a server or
/// TLS value tiberius cannot take.
pub(crate) fn config_from_ado(raw: &str) -> Result<Config, AdoError> {
    let pairs = with_tiberius_spellings(split_ado(raw)?);
    refuse_other_authentication(&pairs)?;
    refuse_read_only_intent(&pairs)?;
    let (user, password) = sql_login(&pairs)?;
    refuse_both_trusts(&pairs)?;
    let mut config = server_and_tls(&pairs)?;
    if let Some(db) = last(&pairs, &DATABASE_KEYS).filter(|d| !d.is_empty()) {
        config.database(db);
    }
    config.application_name(
        last(&pairs, &APPLICATION_KEYS)
            .filter(|a| !a.is_empty())
            .unwrap_or("gap-healer"),
    );
    config.authentication(AuthMethod::sql_server(user, password));
    Ok(config)
}

/// The pairs with SqlClient's spaced key spellings ([`KEY_ALIASES`])
/// renamed to tiberius's.
/// The instance a store connects to, as a key of the stores that may share
/// one head reading (server, login and every option but the database), and
/// the database the string names; `None` when it names none (the login's
/// default database, which three-part names cannot name).
pub(crate) fn instance_and_database(raw: &str) -> Option<(String, String)> {
    let pairs = with_tiberius_spellings(split_ado(raw).ok()?);
    let database = last(&pairs, &DATABASE_KEYS)
        .filter(|d| !d.is_empty())?
        .to_string();
    Some((instance_of(pairs), database))
}

/// The instance a store connects to, as [`instance_and_database`] keys it,
/// whether or not the string names a database: the key of the stores that
/// may share one leader lock session. `None` when the string does not parse.
pub(crate) fn instance(raw: &str) -> Option<String> {
    Some(instance_of(with_tiberius_spellings(split_ado(raw).ok()?)))
}

fn instance_of(pairs: Vec<(String, String)>) -> String {
    let mut rest: Vec<String> = pairs
        .into_iter()
        .filter(|(k, _)| !DATABASE_KEYS.contains(&k.as_str()))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    rest.sort();
    rest.join("\n")
}

fn with_tiberius_spellings(pairs: Vec<(String, String)>) -> Vec<(String, String)> {
    pairs
        .into_iter()
        .map(|(k, v)| {
            let k = KEY_ALIASES
                .iter()
                .find(|(from, _)| *from == k)
                .map_or(k, |(_, to)| to.to_string());
            (k, v)
        })
        .collect()
}

/// Refuses every way of signing in but SQL Server authentication:
/// Integrated Security (Windows) and any `Authentication` other than
/// SqlPassword (Microsoft Entra).
fn refuse_other_authentication(pairs: &[(String, String)]) -> Result<(), AdoError> {
    if let Some(v) = last(pairs, &INTEGRATED_KEYS) {
        if is_true(v) {
            return Err(AdoError(
                "Integrated Security is not supported: use SQL Server authentication (User Id and Password)".into(),
            ));
        }
    }
    if let Some(v) = last(pairs, &["authentication"]) {
        let normal: String = v
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .collect::<String>()
            .to_lowercase();
        if normal != "sqlpassword" {
            return Err(AdoError(
                "only Authentication=SqlPassword is supported (User Id and Password); Microsoft Entra authentication is not".into(),
            ));
        }
    }
    Ok(())
}

/// Refuses `ApplicationIntent=ReadOnly`: a replica takes no tombstones.
fn refuse_read_only_intent(pairs: &[(String, String)]) -> Result<(), AdoError> {
    if last(pairs, &["applicationintent"])
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("readonly"))
    {
        return Err(AdoError(
            "ApplicationIntent=ReadOnly routes to a read-only replica: gap-healer writes tombstones and needs the primary"
                .into(),
        ));
    }
    Ok(())
}

/// The SQL Server login: `User Id` (required) and `Password` (may be
/// empty). The password is only ever returned, never put in an error.
fn sql_login(pairs: &[(String, String)]) -> Result<(&str, &str), AdoError> {
    let user = last(pairs, &USER_KEYS).unwrap_or_default();
    let password = last(pairs, &PASSWORD_KEYS).unwrap_or_default();
    if user.is_empty() {
        return Err(AdoError(
            "no User Id: gap-healer signs in with SQL Server authentication".into(),
        ));
    }
    Ok((user, password))
}

/// Refuses `TrustServerCertificate=true` together with
/// `TrustServerCertificateCA` (tiberius panics on both).
fn refuse_both_trusts(pairs: &[(String, String)]) -> Result<(), AdoError> {
    if last(pairs, &["trustservercertificate"]).is_some_and(is_true)
        && last(pairs, &["trustservercertificateca"]).is_some()
    {
        return Err(AdoError(
            "TrustServerCertificate=true and TrustServerCertificateCA exclude each other: use one"
                .into(),
        ));
    }
    Ok(())
}

/// The server and TLS keys ([`TIBERIUS_KEYS`]) handed to tiberius's own
/// parser, each quoted so its lexer reads it back unchanged. tiberius's
/// errors name no key, and its parser's may name a character of the
/// string: the error says which key it refused instead.
fn server_and_tls(pairs: &[(String, String)]) -> Result<Config, AdoError> {
    let mut handed = String::new();
    let mut refused = None;
    for (key, name, takes) in TIBERIUS_KEYS {
        let Some(value) = tiberius_value(pairs, key)? else {
            continue;
        };
        let quoted = quote_for_tiberius(&value).ok_or_else(|| {
            AdoError(format!(
                "the value of `{name}` has characters the SQL Server driver cannot take"
            ))
        })?;
        let pair = format!("{key}={quoted};");
        if refused.is_none() && Config::from_ado_string(&pair).is_err() {
            refused = Some(format!(
                "the value of `{name}` is not valid: expected {takes}"
            ));
        }
        handed.push_str(&pair);
    }
    Config::from_ado_string(&handed).map_err(|_| {
        AdoError(refused.unwrap_or_else(|| {
            "the SQL Server driver refused the server and TLS settings together (Server, \
             Encrypt, TrustServerCertificate, TrustServerCertificateCA, ApplicationIntent)"
                .into()
        }))
    })
}

/// The value handed to tiberius for `key`, or `None` when the string has
/// none. `Encrypt` is always handed, in tiberius's words: like
/// Microsoft.Data.SqlClient 4 and later, encrypted unless the string says
/// otherwise (tiberius alone would default to login-only).
fn tiberius_value(pairs: &[(String, String)], key: &str) -> Result<Option<String>, AdoError> {
    let value = match last(pairs, &[key]) {
        Some(value) => value,
        None if key == "encrypt" => "true",
        None => return Ok(None),
    };
    if key != "encrypt" {
        return Ok(Some(value.to_string()));
    }
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "mandatory" => Ok(Some("true".to_string())),
        "false" | "no" | "optional" => Ok(Some("false".to_string())),
        "strict" => Err(AdoError(
            "Encrypt=Strict (TDS 8.0) is not supported by the driver: use Encrypt=true".into(),
        )),
        _ => Ok(Some(value.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_encrypt_false_may_fall_back_to_plaintext() {
        let config = |cs: &str| config_from_ado(cs).unwrap();
        assert!(wants_login_encryption_only(&config(
            "Server=db;User Id=app;Password=x;Encrypt=false"
        )));
        for strict in [
            "Server=db;User Id=app;Password=x;Encrypt=true",
            "Server=db;User Id=app;Password=x",
            "Server=db;User Id=app;Password=x;Encrypt=strict",
        ] {
            if let Ok(c) = config_from_ado(strict) {
                assert!(!wants_login_encryption_only(&c), "{strict}");
            }
        }
    }

    fn password_of(raw: &str) -> String {
        let pairs = split_ado(raw).expect(raw);
        last(&pairs, &PASSWORD_KEYS)
            .expect("a password")
            .to_string()
    }

    #[test]
    fn passwords_with_separators_quotes_and_unicode() {
        let cases = [
            (
                "Server=db;User Id=app;Password='a;b=c''d';Database=es",
                "a;b=c'd",
            ),
            (
                "Server=db;User Id=app;Password=\"x;y'z\"\"w\";Database=es",
                "x;y'z\"w",
            ),
            (
                "Server=db;User Id=app;Password={p;w=d}}x};Database=es",
                "p;w=d}x",
            ),
            (
                "Server=db;User Id=app;Password=pässwörd☃;Database=es",
                "pässwörd☃",
            ),
            (
                "Server=db;User Id=app;Password='пароль; 密码';Database=es",
                "пароль; 密码",
            ),
            ("Server=db;User Id=app;Pwd = a=b ;Database=es", "a=b"),
            ("Server=db;User Id=app;Password=it's;Database=es", "it's"),
            (
                "Server=db;User Id=app;Password=first;Database=es;Password=second",
                "second",
            ),
        ];
        for (raw, want) in cases {
            assert_eq!(password_of(raw), want, "{raw}");
            let config = config_from_ado(raw).unwrap_or_else(|e| panic!("{raw}: {e:?}"));
            let shown = format!("{config:?}");
            assert!(
                !shown.contains(want),
                "Debug of the config shows the password: {shown}"
            );
            assert!(
                shown.contains("\"es\""),
                "database lost after the password: {shown}"
            );
            assert!(shown.contains("\"app\""), "user lost: {shown}");
            assert_eq!(config.get_addr(), "db:1433");
        }
    }

    #[test]
    fn keeps_server_tls_and_database() {
        let config = config_from_ado(
            "Data Source=tcp:sql.example.net,14330;Initial Catalog=Événements;User ID=app;Password=p;\
             Encrypt=Mandatory;TrustServerCertificate=false;Application Name=orders-healer",
        )
        .unwrap();
        assert_eq!(config.get_addr(), "sql.example.net:14330");
        let shown = format!("{config:?}");
        assert!(shown.contains("Événements"), "{shown}");
        assert!(shown.contains("orders-healer"), "{shown}");
        assert!(
            shown.contains("Required"),
            "Encrypt=Mandatory means TLS required: {shown}"
        );

        // No Encrypt: encrypted and validated, as Microsoft.Data.SqlClient 4+ does.
        let shown = format!(
            "{:?}",
            config_from_ado("Server=db;User Id=app;Password=p").unwrap()
        );
        assert!(shown.contains("gap-healer"), "{shown}");
        assert!(
            shown.contains("encryption: Required") && shown.contains("trust: Default"),
            "{shown}"
        );
        let shown = format!(
            "{:?}",
            config_from_ado("Server=db;User Id=app;Password=p;Encrypt=false").unwrap()
        );
        assert!(shown.contains("encryption: Off"), "{shown}");
        let shown = format!(
            "{:?}",
            config_from_ado(
                "Server=db;User Id=app;Password=p;Encrypt=true;Trust Server Certificate=True"
            )
            .unwrap()
        );
        assert!(shown.contains("trust: TrustAll"), "{shown}");
        // tiberius panics when both are set; refuse it here instead.
        assert!(config_from_ado(
            "Server=db;User Id=app;Password=p;TrustServerCertificate=true;TrustServerCertificateCA=/ca.pem"
        )
        .is_err());
    }

    #[test]
    fn errors_never_carry_values() {
        let secret = "s3cr3t-Valü";
        let bad = [
            format!("Server=db;User Id=app;Password='{secret};Database=es"),
            format!("Server=db;User Id=app;Password='{secret}'x;Database=es"),
            format!("Server=db;User Id=app;Password={secret};{secret}"),
            format!("Server=db;User Id=app;Password={secret};Integrated Security=true"),
            format!(
                "Server=db;User Id=app;Password={secret};Authentication=ActiveDirectoryPassword"
            ),
            format!("Server=db;User Id=app;Password={secret};Encrypt=strict"),
            format!("Server=db;User Id=app;Password={secret};Encrypt=perhaps"),
            format!("Server=db;Password={secret}"),
            format!("Server=dbé{secret};User Id=app;Password={secret}"),
        ];
        for raw in &bad {
            let err = config_from_ado(raw).expect_err(raw);
            assert!(!err.0.contains("s3cr3t"), "{raw} -> {}", err.0);
            assert!(!err.0.contains("Valü"), "{raw} -> {}", err.0);
        }
    }

    /// Issue 20: tiberius's refusals named no key ("Conversion error:
    /// Connection string: Not a valid boolean").
    #[test]
    fn a_value_the_driver_refuses_names_its_key() {
        for (raw, said) in [
            (
                "Server=tcp:db,Zq7Secret;User Id=app;Password=Zq7Secret",
                "the value of `Server` is not valid: expected tcp:host,port or host,port",
            ),
            (
                "Data Source=tcp:db,Zq7Secret;User Id=app;Password=Zq7Secret",
                "the value of `Data Source` is not valid",
            ),
            (
                "Server=db;User Id=app;Password=Zq7Secret;Encrypt=Zq7Secret",
                "the value of `Encrypt` is not valid: expected true, false, yes, no, mandatory or optional",
            ),
            (
                "Server=db;User Id=app;Password=Zq7Secret;TrustServerCertificate=Zq7Secret",
                "the value of `TrustServerCertificate` is not valid: expected true or false",
            ),
        ] {
            let e = config_from_ado(raw).expect_err(raw).0;
            assert_eq!(e, said.to_string() + &e[said.len()..], "{raw}");
            assert!(!e.contains("Zq7Secret"), "{raw}: {e}");
        }
    }

    #[test]
    fn rejects_unsupported_authentication() {
        assert!(config_from_ado("Server=db;Integrated Security=SSPI").is_err());
        assert!(config_from_ado("Server=db;Trusted_Connection=yes").is_err());
        assert!(config_from_ado(
            "Server=db;User Id=a;Password=b;Authentication=Active Directory Default"
        )
        .is_err());
        assert!(
            config_from_ado("Server=db;User Id=a;Password=b;Authentication=Sql Password").is_ok()
        );
        assert!(
            config_from_ado("Server=db;User Id=a;Password=b;Integrated Security=false").is_ok()
        );
        assert!(
            config_from_ado("Server=db;User Id=a;Password=b;Application Intent=ReadOnly").is_err()
        );
        assert!(
            config_from_ado("Server=db;User Id=a;Password=b;ApplicationIntent=ReadWrite").is_ok()
        );
    }

    #[test]
    fn tiberius_quoting_round_trips() {
        for v in [
            "plain",
            "a b",
            "a;b",
            "it's",
            "say \"hi\"",
            "{x}",
            "C:\\certs\\ca.pem",
        ] {
            let quoted = quote_for_tiberius(v).unwrap();
            let config =
                Config::from_ado_string(&format!("server=db;TrustServerCertificateCA={quoted}"));
            assert!(config.is_ok(), "{v} -> {quoted}");
        }
        assert_eq!(quote_for_tiberius("é"), None);
        assert_eq!(quote_for_tiberius("'\"}"), None);
    }
}
