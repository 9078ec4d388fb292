//! A PostgreSQL cluster of one test's own, for faults that need a server to
//! stop, start or change database-wide settings: the shared server is never
//! restarted by the integration tests.

use std::path::PathBuf;
use std::process::{Command, Output as ProcOutput, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_postgres::Client;
use uuid::Uuid;

use super::Store;

/// The newest PostgreSQL's bin directory (`/usr/lib/postgresql/<v>/bin`).
fn pg_bin() -> PathBuf {
    let version = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL server binaries under /usr/lib/postgresql")
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .max()
        .expect("a version under /usr/lib/postgresql");
    PathBuf::from(format!("/usr/lib/postgresql/{version}/bin"))
}

pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A PostgreSQL cluster of one test's own, on a free port of 127.0.0.1, with
/// its socket in its directory. initdb refuses root, so as root the tools run
/// as the postgres user. Stopped and deleted on drop (its files kept after
/// [`Throwaway::keep_files`]).
pub struct Throwaway {
    pub dir: PathBuf,
    pub port: u16,
    bin: PathBuf,
    root: bool,
    keep: AtomicBool,
}

impl Throwaway {
    /// initdb (trust for the socket; `auth_host` for TCP); not started.
    pub fn init(tag: &str, auth_host: &str) -> Throwaway {
        let dir = std::env::temp_dir().join(format!(
            "gh-pg-{tag}-{}",
            &Uuid::new_v4().simple().to_string()[..8]
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let t = Throwaway {
            port: free_port(),
            bin: pg_bin(),
            root: is_root(),
            keep: AtomicBool::new(false),
            dir,
        };
        if t.root {
            let ok = Command::new("chown")
                .args(["postgres:postgres", t.dir.to_str().unwrap()])
                .status()
                .unwrap();
            assert!(ok.success(), "chown {} to postgres", t.dir.display());
        }
        let data = t.data();
        t.tool(
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-U",
                "postgres",
                "--auth-local=trust",
                &format!("--auth-host={auth_host}"),
                "--no-sync",
                "--no-instructions",
            ],
        );
        t
    }

    /// [`Throwaway::init`], then [`Throwaway::start`].
    pub fn started(tag: &str, auth_host: &str) -> Throwaway {
        let t = Throwaway::init(tag, auth_host);
        t.start();
        t
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// One of the server's tools, as the postgres user when we are root.
    fn command(&self, name: &str) -> Command {
        let path = self.bin.join(name);
        if self.root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&path);
            c
        } else {
            Command::new(&path)
        }
    }

    fn tool(&self, name: &str, args: &[&str]) -> ProcOutput {
        let out = self
            .command(name)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            out.status.success(),
            "{name} {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    pub fn start(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c shared_buffers=16MB -c max_connections=100 -c fsync=off",
            self.port,
            self.dir.display()
        );
        let data = self.data();
        let log = self.dir.join("server.log");
        self.tool(
            "pg_ctl",
            &[
                "-D",
                data.to_str().unwrap(),
                "-l",
                log.to_str().unwrap(),
                "-o",
                &options,
                "-w",
                "-t",
                "60",
                "start",
            ],
        );
    }

    /// On drop, stop the server but leave its directory (data and
    /// `server.log`) for a post-mortem, and say where it is.
    pub fn keep_files(&self) {
        self.keep.store(true, Ordering::SeqCst);
    }

    /// A fast shutdown: every session ends, as when a server goes down.
    pub fn stop(&self) {
        let data = self.data();
        self.tool(
            "pg_ctl",
            &["-D", data.to_str().unwrap(), "-m", "fast", "-w", "stop"],
        );
    }

    /// Over TCP, as the healer connects.
    pub fn url(&self, db: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={db}",
            self.port
        )
    }

    /// Over the Unix socket as postgres (trusted even when TCP wants a password).
    pub fn admin_url(&self, db: &str) -> String {
        format!(
            "host={} port={} user=postgres dbname={db}",
            self.dir.display(),
            self.port
        )
    }

    /// A session over the Unix socket as postgres.
    pub async fn admin(&self, db: &str) -> Client {
        super::try_connect(&self.admin_url(db))
            .await
            .unwrap_or_else(|e| panic!("throwaway server at {}: {e}", self.dir.display()))
    }

    pub async fn create_database(&self, name: &str) {
        self.admin("postgres")
            .await
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
    }

    /// The Eventuous tables in schema `store` of database `db`, reached over
    /// the Unix socket as postgres.
    pub async fn store(&self, db: &str) -> Store {
        Store::create(self.admin(db).await, &self.admin_url(db), "store")
            .await
            .expect("create schema")
    }

    /// The `store` schema of database `db`, once [`Throwaway::store`] made it.
    pub async fn existing_store(&self, db: &str) -> Store {
        Store::open(self.admin(db).await, &self.admin_url(db), "store")
    }
}

impl Drop for Throwaway {
    fn drop(&mut self) {
        let data = self.data();
        let _ = self
            .command("pg_ctl")
            .args([
                "-D",
                data.to_str().unwrap(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if self.keep.load(Ordering::SeqCst) {
            eprintln!(
                "the throwaway PostgreSQL cluster's files are kept in {}",
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
