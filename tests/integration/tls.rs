//! TLS as libpq's `sslmode` means it, against a throwaway cluster of the
//! test's own with `ssl = on` and a self-signed certificate for `localhost`
//! (the kit's [`Throwaway::started_with_tls`]): every mode, a `pg_hba.conf`
//! that takes only TLS (allow's second attempt) or only plain (prefer's),
//! and the server with TLS off (prefer falls back on the same connection).
//!
//! What each session got is the server's answer: `check` reads
//! `pg_stat_ssl` and says it in its `tls` finding, so each case runs the
//! real binary's `check --format json` and reads that finding.

use gap_healer_testkit::bin::cli;
use gap_healer_testkit::pg::Throwaway;

/// What `check --format json` said of TLS, or the whole output when it did
/// not run to its findings (exit 3 and the refusal).
struct Checked {
    code: i32,
    tls: Option<String>,
    all: String,
}

fn check(cs: &str) -> Checked {
    let out = cli(
        &[
            "check",
            "--engine",
            "postgres",
            "--schema",
            "store",
            "--connect-timeout",
            "3s",
            "--format",
            "json",
            "--connection-string",
            cs,
        ],
        &[],
    );
    let tls = out
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["findings"].as_array().cloned())
        .flatten()
        .find(|f| f["check"] == "tls" && f["detail"].is_string())
        .and_then(|f| f["detail"].as_str().map(str::to_string));
    Checked {
        code: out.code,
        tls,
        all: out.all(),
    }
}

/// Runs each `(what the string adds, what the tls finding must begin with)`
/// against `host` and says every case that did not hold.
fn expect_each(pg: &Throwaway, host: &str, cases: &[(&str, &str)], wrong: &mut Vec<String>) {
    for (extra, want) in cases {
        let cs = format!(
            "host={host} port={} user=postgres dbname=postgres {extra}",
            pg.port
        );
        let got = check(&cs);
        let ok = got.code == 0 && got.tls.as_deref().is_some_and(|t| t.starts_with(want));
        if !ok {
            wrong.push(format!(
                "{cs}\n  want tls: {want}\n  got exit {} and tls {:?}\n{}",
                got.code, got.tls, got.all
            ));
        }
    }
}

/// Each `(what the string adds, what the refusal must say)` must end in
/// exit 3, saying it.
fn refused_each(pg: &Throwaway, host: &str, cases: &[(&str, &str)], wrong: &mut Vec<String>) {
    for (extra, said) in cases {
        let cs = format!(
            "host={host} port={} user=postgres dbname=postgres {extra}",
            pg.port
        );
        let got = check(&cs);
        if got.code != 3 || !got.all.contains(said) {
            wrong.push(format!(
                "{cs}\n  want exit 3 saying {said:?}\n  got exit {}: {}",
                got.code, got.all
            ));
        }
    }
}

const PLAIN_ALLOW: &str =
    "off: not encrypted (sslmode=allow: plain is tried first, and the server took it)";
const TLS_PREFER: &str =
    "on, server certificate NOT verified (sslmode=prefer: TLS is tried first, and the server took it)";
const PLAIN_PREFER: &str =
    "off: not encrypted (sslmode=prefer: the server refused TLS, so the session is plain";
const TLS_ALLOW: &str = "on, server certificate NOT verified (sslmode=allow: the server refused a plain session, so TLS was tried next)";
const TLS_REQUIRE: &str = "on, server certificate NOT verified (sslmode=require)";

/// Issue 27: `sslmode=prefer` (libpq's and Npgsql's default) meant no TLS,
/// so a healer given the application's string talked in clear to a server
/// the application talks to over TLS. Each mode now does what libpq's does,
/// and `check` says which one the session got.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sslmode_does_what_libpqs_does_and_check_says_what_the_session_got() {
    let pg = Throwaway::started_with_tls("tls_modes");
    let _store = pg.store("postgres").await;
    let ca = pg.certificate();
    let ca = ca.to_str().unwrap();
    let mut wrong = Vec::new();

    // The server takes both: each mode's first choice.
    pg.set_hba(&["host all all 127.0.0.1/32 trust"]).await;
    let verify_ca = format!("sslmode=verify-ca sslrootcert={ca}");
    let verify_full = format!("sslmode=verify-full sslrootcert={ca}");
    let require_with_root = format!("sslmode=require sslrootcert={ca}");
    let verified_ca = format!(
        "on, server certificate verified against 1 certificate(s) from {ca}, the host name not \
         checked (sslmode=verify-ca)"
    );
    let verified_full =
        format!("on, server certificate verified against 1 certificate(s) from {ca}");
    expect_each(
        &pg,
        "127.0.0.1",
        &[
            (
                "sslmode=disable",
                "off: not encrypted (sslmode=require or verify-full",
            ),
            ("sslmode=allow", PLAIN_ALLOW),
            ("sslmode=prefer", TLS_PREFER),
            ("", TLS_PREFER),
            ("sslmode=require", TLS_REQUIRE),
            // The certificate names localhost, not 127.0.0.1: verify-ca
            // does not look at the name, as libpq's does not.
            (verify_ca.as_str(), verified_ca.as_str()),
            (require_with_root.as_str(), verified_ca.as_str()),
        ],
        &mut wrong,
    );
    expect_each(
        &pg,
        "localhost",
        &[
            (verify_full.as_str(), verified_full.as_str()),
            ("", TLS_PREFER),
        ],
        &mut wrong,
    );
    refused_each(
        &pg,
        "127.0.0.1",
        &[(verify_full.as_str(), "certificate not valid for name")],
        &mut wrong,
    );
    // The same modes from a URL and from Npgsql.
    for (cs, want) in [
        (
            format!(
                "postgres://postgres@127.0.0.1:{}/postgres?sslmode=allow",
                pg.port
            ),
            PLAIN_ALLOW,
        ),
        (
            format!("postgresql://postgres@127.0.0.1:{}/postgres", pg.port),
            TLS_PREFER,
        ),
        (
            format!(
                "Host=127.0.0.1;Port={};Username=postgres;Database=postgres;SSL Mode=Prefer",
                pg.port
            ),
            TLS_PREFER,
        ),
    ] {
        let got = check(&cs);
        if got.code != 0 || !got.tls.as_deref().is_some_and(|t| t.starts_with(want)) {
            wrong.push(format!("{cs}: want {want}, got {:?}\n{}", got.tls, got.all));
        }
    }

    // Only TLS is taken (hostssl): allow's plain attempt is refused, and
    // its second attempt, with TLS, gets the session.
    pg.set_hba(&["hostssl all all 127.0.0.1/32 trust"]).await;
    expect_each(
        &pg,
        "127.0.0.1",
        &[
            ("sslmode=allow", TLS_ALLOW),
            ("sslmode=prefer", TLS_PREFER),
            ("sslmode=require", TLS_REQUIRE),
        ],
        &mut wrong,
    );
    refused_each(
        &pg,
        "127.0.0.1",
        &[("sslmode=disable", "no pg_hba.conf entry")],
        &mut wrong,
    );

    // Only plain is taken (hostnossl): prefer's TLS session is refused, and
    // its second attempt, plain, gets the session.
    pg.set_hba(&["hostnossl all all 127.0.0.1/32 trust"]).await;
    expect_each(
        &pg,
        "127.0.0.1",
        &[
            ("sslmode=prefer", PLAIN_PREFER),
            ("", PLAIN_PREFER),
            ("sslmode=allow", PLAIN_ALLOW),
        ],
        &mut wrong,
    );
    refused_each(
        &pg,
        "127.0.0.1",
        &[("sslmode=require", "no pg_hba.conf entry")],
        &mut wrong,
    );

    // No TLS at all: the server answers the SSL request with N, and prefer
    // goes on without TLS on the same connection.
    pg.set_hba(&["host all all 127.0.0.1/32 trust"]).await;
    pg.set_ssl(false).await;
    expect_each(
        &pg,
        "127.0.0.1",
        &[
            ("sslmode=prefer", PLAIN_PREFER),
            ("sslmode=allow", PLAIN_ALLOW),
        ],
        &mut wrong,
    );
    refused_each(
        &pg,
        "127.0.0.1",
        &[("sslmode=require", "server does not support TLS")],
        &mut wrong,
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}
