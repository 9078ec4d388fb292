//! The real `gap-healer` binary: where it is, a command line with a clean
//! environment, a run to completion ([`cli`]), a process in the background
//! whose output is read line by line ([`Process`]), and a daemon with its
//! HTTP endpoints ([`Daemon`]).

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use nix::sys::signal::Signal;

use crate::pg::Store;

/// The binary cargo built with the running test or bench. Cargo (and
/// nextest) name it in `CARGO_BIN_EXE_gap-healer` when they run a test; an
/// executable started by hand (`.ci/bench-smoke` runs the harness so) finds
/// it where cargo puts it, beside its own `deps` directory.
pub fn path() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let path = std::env::var_os("CARGO_BIN_EXE_gap-healer")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                let exe = std::env::current_exe().expect("the running executable's path");
                let mut dir = exe.parent().expect("its directory").to_path_buf();
                if dir.ends_with("deps") {
                    dir.pop();
                }
                dir.join(format!("gap-healer{}", std::env::consts::EXE_SUFFIX))
            });
        assert!(
            path.is_file(),
            "the gap-healer binary is not at {} (cargo builds it for integration tests and benches)",
            path.display()
        );
        path
    })
}

/// `gap-healer ARGS` with the variables `env` and none of this process's
/// GAP_HEALER_*, RUST_LOG, NO_COLOR or NOTIFY_SOCKET (a test run under
/// systemd must not have its healers notify the test's own unit), with no
/// stdin.
pub fn command<A, K, V>(
    args: impl IntoIterator<Item = A>,
    env: impl IntoIterator<Item = (K, V)>,
) -> Command
where
    A: AsRef<OsStr>,
    K: AsRef<OsStr>,
    V: AsRef<OsStr>,
{
    let mut cmd = Command::new(path());
    cmd.args(args);
    for (k, _) in std::env::vars_os() {
        if k.to_str()
            .is_some_and(|k| k.starts_with("GAP_HEALER_") || k == "RUST_LOG" || k == "NO_COLOR")
        {
            cmd.env_remove(k);
        }
    }
    cmd.env_remove("NOTIFY_SOCKET");
    cmd.envs(env).stdin(Stdio::null());
    cmd
}

/// Healer flags that fill holes `gap_timeout` after they appear, polling
/// every `poll_interval`, from the first position; `more` flags after them.
pub fn timing<'a>(gap_timeout: &'a str, poll_interval: &'a str, more: &[&'a str]) -> Vec<&'a str> {
    let mut flags = vec![
        "--gap-timeout",
        gap_timeout,
        "--poll-interval",
        poll_interval,
        "--start-from",
        "0",
    ];
    flags.extend_from_slice(more);
    flags
}

/// The output of one run of the binary.
#[derive(Debug)]
pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn all(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// Runs `gap-healer ARGS` to completion with only the given GAP_HEALER_* variables.
pub fn cli(args: &[&str], env: &[(&str, &str)]) -> Output {
    let out = command(args, env.iter().copied())
        .output()
        .expect("run gap-healer");
    Output {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    }
}

/// [`cli`] with stderr on a pseudo-terminal, as when someone runs it at a
/// terminal (progress bars are drawn, logs may be coloured), stdout piped.
/// `stderr` is what the terminal received, control sequences and all.
pub fn cli_on_terminal(args: &[&str], env: &[(&str, &str)]) -> Output {
    let size = nix::pty::Winsize {
        ws_row: 24,
        ws_col: 120,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = nix::pty::openpty(&size, None).expect("a pseudo-terminal");
    // The Command, and with it this process's end of the terminal, is gone
    // once spawned: reading the other end ends when the binary exits.
    let child = command(args, env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(pty.slave))
        .spawn()
        .expect("run gap-healer");
    let mut terminal = std::fs::File::from(pty.master);
    let reader = std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        // EIO once no process holds the terminal any more.
        while let Ok(n @ 1..) = terminal.read(&mut buf) {
            seen.extend_from_slice(&buf[..n]);
        }
        seen
    });
    let out = child.wait_with_output().expect("wait for gap-healer");
    let seen = reader.join().expect("the terminal's reader");
    Output {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&seen).into(),
    }
}

/// The lines read so far from one of a process's pipes.
#[derive(Clone, Default)]
struct Lines {
    lines: Arc<Mutex<Vec<String>>>,
    /// The pipe is closed: every line is in.
    done: Arc<AtomicBool>,
}

impl Lines {
    /// Reads `pipe` on a thread of its own; keeps the newest `keep` lines
    /// (dropping the oldest half when there are more); sends the address of
    /// the first "listening on ADDR" line to `listening`.
    fn read(
        pipe: impl Read + Send + 'static,
        keep: usize,
        listening: Option<Sender<String>>,
    ) -> Lines {
        let lines = Lines::default();
        let sink = lines.clone();
        std::thread::spawn(move || {
            let mut listening = listening;
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if let Some(addr) = line.split("listening on ").nth(1) {
                    if let Some(tx) = listening.take() {
                        let addr: String = addr
                            .chars()
                            .take_while(|c| !c.is_whitespace() && *c != '"')
                            .collect();
                        let _ = tx.send(addr);
                    }
                }
                if let Ok(mut l) = sink.lines.lock() {
                    l.push(line);
                    if l.len() > keep {
                        l.drain(..keep / 2);
                    }
                }
            }
            sink.done.store(true, Ordering::Release);
        });
        lines
    }

    fn all(&self) -> Vec<String> {
        self.lines.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

/// A gap-healer process in the background, its stdout and stderr read line
/// by line; killed when dropped.
pub struct Process {
    child: Child,
    status: Option<ExitStatus>,
    stdout: Lines,
    stderr: Lines,
    listening: Mutex<Receiver<String>>,
}

impl Process {
    /// Starts `cmd` with its output read into lines (every line kept).
    pub fn spawn(cmd: Command) -> std::io::Result<Process> {
        Process::spawn_keeping(cmd, usize::MAX)
    }

    /// [`Process::spawn`] that keeps about the newest `keep` lines of each
    /// pipe (a long benchmark run).
    pub fn spawn_keeping(mut cmd: Command, keep: usize) -> std::io::Result<Process> {
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
        let (tx, rx) = std::sync::mpsc::channel();
        let stdout = Lines::read(child.stdout.take().expect("piped stdout"), keep, None);
        let stderr = Lines::read(child.stderr.take().expect("piped stderr"), keep, Some(tx));
        Ok(Process {
            child,
            status: None,
            stdout,
            stderr,
            listening: Mutex::new(rx),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: Signal) -> nix::Result<()> {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid() as i32), signal)
    }

    /// Where it serves HTTP, once it says so (within `limit`).
    pub fn listening(&self, limit: Duration) -> Option<SocketAddr> {
        let rx = self.listening.lock().ok()?;
        rx.recv_timeout(limit).ok()?.parse().ok()
    }

    /// Its exit status, if it has ended (then with all its output read).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        let running = self.status.is_none();
        let status = self.poll_exit();
        if running && status.is_some() {
            self.settle();
        }
        status
    }

    fn poll_exit(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.status = Some(status);
            }
        }
        self.status
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        self.try_wait().is_none()
    }

    /// The exit code, if it has ended (-1 for a signal).
    pub fn exited(&mut self) -> Option<i32> {
        self.try_wait().map(|s| s.code().unwrap_or(-1))
    }

    /// Waits for the exit code, at most `limit`; panics with the output after.
    pub async fn wait(&mut self, limit: Duration) -> i32 {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(code) = self.exited() {
                return code;
            }
            assert!(
                Instant::now() < deadline,
                "gap-healer did not finish within {limit:?}\n{}",
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGTERM, then waits (10 s at most, then SIGKILL): the exit status and
    /// how long it took to end.
    pub fn terminate(&mut self) -> (ExitStatus, Duration) {
        let started = Instant::now();
        if let Some(status) = self.try_wait() {
            return (status, Duration::ZERO);
        }
        let _ = self.signal(Signal::SIGTERM);
        let status = loop {
            if let Some(s) = self.poll_exit() {
                break s;
            }
            if started.elapsed() > Duration::from_secs(10) {
                break self.kill();
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let took = started.elapsed();
        self.settle();
        (status, took)
    }

    /// SIGKILL, and waits for it to end.
    pub fn kill(&mut self) -> ExitStatus {
        if let Some(status) = self.try_wait() {
            return status;
        }
        let _ = self.child.kill();
        let status = self.child.wait().expect("wait for gap-healer");
        self.status = Some(status);
        self.settle();
        status
    }

    /// Once the process has ended: gives the readers up to a second to take
    /// in its last lines.
    fn settle(&self) {
        let started = Instant::now();
        while !(self.stdout.done.load(Ordering::Acquire)
            && self.stderr.done.load(Ordering::Acquire))
            && started.elapsed() < Duration::from_secs(1)
        {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Its stderr (where it logs) so far, line by line.
    pub fn lines(&self) -> Vec<String> {
        self.stderr.all()
    }

    /// `f` over its stderr lines so far, without copying them.
    pub fn with_lines<R>(&self, f: impl FnOnce(&[String]) -> R) -> R {
        let lines = self.stderr.lines.lock().unwrap();
        f(&lines)
    }

    /// Its stderr so far, each line ended by a newline.
    pub fn log(&self) -> String {
        self.with_lines(|lines| {
            let mut log = String::new();
            for l in lines {
                log.push_str(l);
                log.push('\n');
            }
            log
        })
    }

    /// Everything it printed so far.
    pub fn output(&self) -> String {
        format!(
            "stdout:\n{}\nstderr:\n{}",
            self.stdout.all().join("\n"),
            self.lines().join("\n")
        )
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs `cmd` to completion within `limit` (panics after): its exit code and
/// output.
pub async fn run(cmd: Command, limit: Duration) -> (i32, String) {
    let mut process = Process::spawn(cmd).expect("gap-healer starts");
    let code = process.wait(limit).await;
    (code, process.output())
}

/// The log level the kit's daemons run at unless told otherwise: INFO,
/// and each fill statement's DEBUG line.
pub const FILL_STATEMENTS: &str = "info,gap_healer::healer::fill=debug";

/// `gap-healer run` in the background, serving HTTP on a free port.
pub struct Daemon {
    process: Process,
    pub addr: SocketAddr,
    http: reqwest::Client,
}

impl Daemon {
    /// `gap-healer run` on `store`'s flags, JSON log, `extra` flags last.
    pub fn start(store: &Store, extra: &[&str]) -> Daemon {
        let mut args = vec!["run".to_string()];
        args.extend(store.args());
        args.extend(["--log-format".into(), "json".into()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        Daemon::spawn(&args, &[])
    }

    /// `gap-healer run` on the PostgreSQL `schema` with the connection string
    /// in GAP_HEALER_CONNECTION_STRING (never on the command line), its log
    /// JSON unless `extra` says otherwise.
    pub fn with_connection_string(cs: &str, schema: &str, extra: &[&str]) -> Daemon {
        let mut args: Vec<String> = ["run", "--engine", "postgres", "--schema", schema]
            .iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect();
        if !extra.contains(&"--log-format") {
            args.extend(["--log-format".into(), "json".into()]);
        }
        Daemon::spawn(&args, &[("GAP_HEALER_CONNECTION_STRING", cs)])
    }

    /// `gap-healer ARGS --metrics-addr 127.0.0.1:0` with only the given
    /// GAP_HEALER_* variables; waits for its "listening on" line.
    pub fn spawn(args: &[String], env: &[(&str, &str)]) -> Daemon {
        Daemon::try_spawn(args, env, usize::MAX).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// [`Daemon::spawn`] that keeps about the newest `keep` log lines, and
    /// says why it did not start rather than panicking.
    pub fn try_spawn(args: &[String], env: &[(&str, &str)], keep: usize) -> anyhow::Result<Daemon> {
        let mut cmd = command(args, env.iter().copied());
        if !args.iter().any(|a| a == "--metrics-addr") {
            cmd.args(["--metrics-addr", "127.0.0.1:0"]);
        }
        // Each fill statement's line (range, outcome, ms) is at DEBUG, which
        // the tests read; the rest of the log stays at INFO.
        if !args.iter().any(|a| a == "--log-level") {
            cmd.args(["--log-level", FILL_STATEMENTS]);
        }
        let mut process = Process::spawn_keeping(cmd, keep).context("start gap-healer run")?;
        let Some(addr) = process.listening(Duration::from_secs(20)) else {
            process.kill();
            return Err(anyhow!("gap-healer did not start: {}", process.log()));
        };
        Ok(Daemon {
            process,
            addr,
            http: reqwest::Client::new(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Sends `signal` (SIGSTOP, SIGCONT, ...).
    pub fn signal(&self, signal: Signal) {
        self.process.signal(signal).expect("signal gap-healer");
    }

    /// Its exit status, if it has ended.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.process.try_wait()
    }

    pub fn alive(&mut self) -> bool {
        self.process.running()
    }

    pub async fn try_get(&self, path: &str) -> reqwest::Result<(u16, String)> {
        let resp = self
            .http
            .get(format!("http://{}{path}", self.addr))
            .send()
            .await?;
        Ok((resp.status().as_u16(), resp.text().await?))
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        self.try_get(path).await.expect("http get")
    }

    /// The value of one sample of the scrape, e.g. `gap_healer_open_gaps`.
    pub async fn metric(&self, sample: &str) -> Option<f64> {
        sample_value(&self.get("/metrics").await.1, sample)
    }

    /// [`Daemon::metric`], failing when the scrape fails or lacks it.
    pub async fn try_metric(&self, sample: &str) -> anyhow::Result<f64> {
        let (_, body) = self.try_get("/metrics").await?;
        sample_value(&body, sample).ok_or_else(|| anyhow!("{sample} not in the scrape"))
    }

    /// Waits until `sample` reaches `want` or `limit` passes; the value then.
    pub async fn wait_metric(&self, sample: &str, want: f64, limit: Duration) -> f64 {
        let end = Instant::now() + limit;
        loop {
            let v = self.try_metric(sample).await.unwrap_or(0.0);
            if v >= want || Instant::now() >= end {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Its log so far, each line ended by a newline.
    pub fn log(&self) -> String {
        self.process.log()
    }

    /// The log lines containing `needle`.
    pub fn lines_containing(&self, needle: &str) -> Vec<String> {
        self.process.with_lines(|lines| {
            lines
                .iter()
                .filter(|l| l.contains(needle))
                .cloned()
                .collect()
        })
    }

    /// The JSON log lines whose message starts with `message`.
    pub fn lines_with(&self, message: &str) -> Vec<serde_json::Value> {
        self.process
            .with_lines(|lines| crate::logs::lines_with(lines, message))
    }

    /// SIGTERM, then waits; returns (exit code, time to exit, log).
    pub fn terminate(mut self) -> (Option<i32>, Duration, String) {
        let (status, took) = self.process.terminate();
        (status.code(), took, self.process.log())
    }

    /// SIGKILL; returns the log.
    pub fn kill9(mut self) -> String {
        self.process.kill();
        self.process.log()
    }
}

/// `GET http://ADDR/PATH` of a daemon (any [`Process`] serving HTTP), within
/// 2 s: the status and the body.
pub async fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let resp = reqwest::Client::new()
        .get(format!("http://{addr}{path}"))
        .timeout(Duration::from_secs(2))
        .send()
        .await?;
    Ok((resp.status().as_u16(), resp.text().await?))
}

/// The value of `sample` in a Prometheus scrape (see [`Daemon::metric`]).
pub fn metric_in(scrape: &str, sample: &str) -> Option<f64> {
    sample_value(scrape, sample)
}

/// The value of `sample` in a Prometheus scrape.
fn sample_value(body: &str, sample: &str) -> Option<f64> {
    let (name, want) = split_sample(sample);
    body.lines().find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (n, labels) = split_sample(series);
        // The labels asked for must match; a `store` label the sample does
        // not name is any store's (the first one's in a single-store scrape).
        let matches = n == name
            && want.iter().all(|w| labels.contains(w))
            && labels
                .iter()
                .all(|l| want.contains(l) || l.starts_with("store="));
        matches.then(|| value.trim().parse().ok()).flatten()
    })
}

/// `name{a="1",b="2"}` into the name and its `a="1"` labels.
fn split_sample(sample: &str) -> (&str, Vec<&str>) {
    match sample.split_once('{') {
        Some((name, rest)) => (
            name,
            rest.trim_end_matches('}')
                .split(',')
                .filter(|l| !l.is_empty())
                .collect(),
        ),
        None => (sample, Vec::new()),
    }
}
