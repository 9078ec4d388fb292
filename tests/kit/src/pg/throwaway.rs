//! A PostgreSQL cluster of one test's own, for faults that need a server to
//! stop, start or change database-wide settings: the shared server is never
//! restarted by the integration tests.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Output as ProcOutput, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_postgres::Client;
use uuid::Uuid;

use super::Store;

/// The server binaries' directory: the newest `/usr/lib/postgresql/<v>/bin`
/// (Debian, Ubuntu), else the directory of `initdb` on PATH (Fedora,
/// Homebrew, a source build).
fn pg_bin() -> PathBuf {
    let newest = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .max();
    if let Some(version) = newest {
        return PathBuf::from(format!("/usr/lib/postgresql/{version}/bin"));
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .find(|dir| dir.join("initdb").is_file())
        .expect(
            "PostgreSQL's server binaries (initdb, pg_ctl, postgres) under \
             /usr/lib/postgresql/<version>/bin or on PATH",
        )
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
    /// The write end of the pipe that [`Throwaway::remove_when_process_ends`]'s
    /// watcher reads: closed when this process ends, however it ends.
    watcher: Option<ChildStdin>,
}

impl Throwaway {
    /// initdb (trust for the socket; `auth_host` for TCP); not started.
    pub fn init(tag: &str, auth_host: &str) -> Throwaway {
        let dir = std::env::temp_dir().join(format!(
            "gh-pg-{tag}-{}",
            &Uuid::new_v4().simple().to_string()[..8]
        ));
        Throwaway::init_in(dir, auth_host, |_| {})
    }

    /// [`Throwaway::init`] in `dir`; `before_initdb` runs once the directory
    /// exists.
    fn init_in(
        dir: PathBuf,
        auth_host: &str,
        before_initdb: impl FnOnce(&mut Throwaway),
    ) -> Throwaway {
        std::fs::create_dir_all(&dir).unwrap();
        let mut t = Throwaway {
            port: free_port(),
            bin: pg_bin(),
            root: is_root(),
            keep: AtomicBool::new(false),
            watcher: None,
            dir,
        };
        before_initdb(&mut t);
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
        if let Err(e) = self.try_start("") {
            panic!("{e}");
        }
    }

    /// [`Throwaway::init`], then started with `extra` server options
    /// (`-c name=value ...`).
    pub fn started_with(tag: &str, auth_host: &str, extra: &str) -> Throwaway {
        let t = Throwaway::init(tag, auth_host);
        if let Err(e) = t.try_start(extra) {
            panic!("{e}");
        }
        t
    }

    /// Starts the server with `extra` server options (`-c name=value ...`);
    /// says why when it did not start.
    fn try_start(&self, extra: &str) -> Result<(), String> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c shared_buffers=16MB -c max_connections=100 -c fsync=off {extra}",
            self.port,
            self.dir.display()
        );
        let data = self.data();
        let log = self.dir.join("server.log");
        let args = [
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
        ];
        let out = self
            .command("pg_ctl")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("pg_ctl: {e}"))?;
        if out.status.success() {
            return Ok(());
        }
        Err(format!(
            "pg_ctl {args:?} failed: {}{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        ))
    }

    /// [`Throwaway::init`] with trust over TCP, then started with `ssl = on`
    /// and a self-signed certificate for the name `localhost` alone
    /// ([`Throwaway::certificate`], its own root), made with `openssl req
    /// -x509` (the openssl command is a test dependency, as PostgreSQL's
    /// server tools are; `.ci/run` installs it). TLS is set in
    /// `postgresql.conf`, not on the command line, so that
    /// [`Throwaway::set_ssl`] can turn it off.
    pub fn started_with_tls(tag: &str) -> Throwaway {
        let t = Throwaway::init(tag, "trust");
        let (cert, key, cnf) = (
            t.certificate(),
            t.dir.join("server.key"),
            t.dir.join("openssl.cnf"),
        );
        std::fs::write(
            &cnf,
            "[req]\ndistinguished_name = dn\nx509_extensions = ext\nprompt = no\n\
             [dn]\nCN = localhost\n\
             [ext]\nbasicConstraints = critical,CA:FALSE\nsubjectAltName = DNS:localhost\n",
        )
        .unwrap();
        let out = Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
            .arg("-config")
            .arg(&cnf)
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| {
                panic!("openssl (the TLS tests make their certificate with it): {e}")
            });
        assert!(
            out.status.success(),
            "openssl req -x509 failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        if t.root {
            let ok = Command::new("chown")
                .arg("postgres:postgres")
                .arg(&key)
                .arg(&cert)
                .status()
                .unwrap();
            assert!(ok.success(), "chown the server's key to postgres");
        }
        let conf = t.data().join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).unwrap();
        text.push_str(&format!(
            "\nssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\n",
            cert.display(),
            key.display()
        ));
        std::fs::write(&conf, text).unwrap();
        t.start();
        t
    }

    /// The certificate of [`Throwaway::started_with_tls`]'s server: its own
    /// root, for `sslrootcert`.
    pub fn certificate(&self) -> PathBuf {
        self.dir.join("server.crt")
    }

    /// Replaces `pg_hba.conf` with trust over the socket (for
    /// [`Throwaway::admin`]) and `tcp` for connections over TCP (lines such
    /// as `hostssl all all 127.0.0.1/32 trust`), and has the server read it.
    pub async fn set_hba(&self, tcp: &[&str]) {
        let mut text = String::from("local all all trust\n");
        for line in tcp {
            text.push_str(line);
            text.push('\n');
        }
        std::fs::write(self.data().join("pg_hba.conf"), text).unwrap();
        self.reload().await;
    }

    /// Turns the server's TLS on or off (`ALTER SYSTEM SET ssl`).
    pub async fn set_ssl(&self, on: bool) {
        let admin = self.admin("postgres").await;
        admin
            .batch_execute(&format!("ALTER SYSTEM SET ssl = {on}"))
            .await
            .unwrap();
        self.reload().await;
        let want = if on { "on" } else { "off" };
        for _ in 0..100 {
            let now: String = self
                .admin("postgres")
                .await
                .query_one("SHOW ssl", &[])
                .await
                .unwrap()
                .get(0);
            if now == want {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!("the throwaway server's ssl did not become {want}");
    }

    /// `pg_reload_conf()`, and a moment for the postmaster to act on it
    /// (the signal is handled after the call returns).
    async fn reload(&self) {
        self.admin("postgres")
            .await
            .batch_execute("SELECT pg_reload_conf()")
            .await
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
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
            .kept()
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

/// The prefix of [`Throwaway::for_this_process`]'s directories, followed by
/// the test process's pid.
const PROCESS_PREFIX: &str = "gh-pg-process-";

/// Debian's self-signed certificate (CN localhost), which the machine's
/// server serves by default: the process's own cluster serves it too when it
/// can, so the TLS tests run the same on either.
const SNAKEOIL: (&str, &str) = (
    "/etc/ssl/certs/ssl-cert-snakeoil.pem",
    "/etc/ssl/private/ssl-cert-snakeoil.key",
);

impl Throwaway {
    /// The test process's own server, for [`super::pg_url`] when none is
    /// given and nothing answers at the default address: started once, with
    /// database `test` (trust over TCP, as Debian's default cluster is set up
    /// for the tests), and stopped and removed when the process ends.
    ///
    /// A test process's statics are never dropped, so the removal cannot be
    /// a `Drop`. It is a watcher instead: a `sh` in a process group of its
    /// own that ignores SIGINT/SIGHUP/SIGTERM and blocks reading a pipe
    /// whose only write end this process holds (close-on-exec, so no child
    /// inherits it). When the process ends in any way (exit, panic, abort,
    /// SIGKILL, Ctrl-C) the kernel closes that end, the read returns, and the
    /// watcher stops the server (`pg_ctl -m immediate`) and deletes its
    /// directory. As a backstop for a watcher that was itself killed, the
    /// directory is named by the pid, and this removes any such directory
    /// whose process is gone.
    pub(super) fn for_this_process() -> Throwaway {
        let tmp = std::env::temp_dir();
        remove_dead_process_clusters(&tmp);
        let dir = tmp.join(format!("{PROCESS_PREFIX}{}", std::process::id()));
        // A directory of this pid now is a dead process's whose pid was reused.
        Throwaway::stop_and_remove(&dir, &pg_bin(), is_root());
        let t = Throwaway::init_in(dir, "trust", |t| t.remove_when_process_ends());
        let tls = format!(
            "-c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
            SNAKEOIL.0, SNAKEOIL.1
        );
        let snakeoil = Path::new(SNAKEOIL.0).is_file() && Path::new(SNAKEOIL.1).exists();
        if !snakeoil || t.try_start(&tls).is_err() {
            t.start();
        }
        // Sessions run on a runtime of their own: the caller may be inside
        // one (a #[tokio::test]), where blocking on another would panic.
        std::thread::scope(|s| {
            s.spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(t.create_database("test"))
            })
            .join()
        })
        .unwrap_or_else(|_| panic!("CREATE DATABASE test in {}", t.dir.display()));
        t
    }

    /// Starts the watcher described at [`Throwaway::for_this_process`].
    // Never waited for, on purpose: it must outlive this process, and it
    // ends only once this process has (or once this Throwaway is dropped).
    #[allow(clippy::zombie_processes)]
    fn remove_when_process_ends(&mut self) {
        let stop = self.command("pg_ctl");
        let mut argv: Vec<OsString> = std::iter::once(stop.get_program())
            .chain(stop.get_args())
            .map(|a| a.to_owned())
            .collect();
        argv.extend(
            [
                "-D".as_ref(),
                self.data().as_os_str(),
                "-m".as_ref(),
                "immediate".as_ref(),
                "-w".as_ref(),
                "stop".as_ref(),
            ]
            .map(OsString::from),
        );
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(
                r#"trap '' INT HUP TERM QUIT; dir=$1; shift
                   read -r _ || true
                   "$@" >/dev/null 2>&1; rm -rf "$dir""#,
            )
            .arg("gh-pg-watcher")
            .arg(&self.dir)
            .args(argv)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("sh (the throwaway cluster's watcher): {e}"));
        self.watcher = child.stdin.take();
    }

    /// Stops the server of directory `dir` if one runs there, and deletes it.
    fn stop_and_remove(dir: &Path, bin: &Path, root: bool) {
        let data = dir.join("data");
        if data.join("postmaster.pid").exists() {
            let pg_ctl = bin.join("pg_ctl");
            let mut c = if root {
                let mut c = Command::new("runuser");
                c.args(["-u", "postgres", "--"]).arg(pg_ctl);
                c
            } else {
                Command::new(pg_ctl)
            };
            let _ = c
                .arg("-D")
                .arg(&data)
                .args(["-m", "immediate", "-w", "stop"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Stops and deletes the clusters of test processes that are gone (their
/// watcher was killed too), found by the pid in their directory's name.
fn remove_dead_process_clusters(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PROCESS_PREFIX))
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let gone = matches!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
            Err(nix::errno::Errno::ESRCH)
        );
        if gone {
            Throwaway::stop_and_remove(&entry.path(), &pg_bin(), is_root());
        }
    }
}
