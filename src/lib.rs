//! gap-healer fills holes in the identity-assigned global position of an event
//! store (Eventuous on SQL Server or PostgreSQL) with tombstone rows, so
//! all-stream subscriptions that stop at every hole can move on.
//!
//! # Layout
//! - [`config`]: flags, file and environment layered into one validated [`config::Settings`].
//! - [`secret`]: the connection string type that never prints its password.
//! - [`gaps`]: holes as ranges, and the tracker that ages them.
//! - [`plan`]: which ranges one fill cycle tries, and in which pieces.
//! - [`cycle`]: one fill cycle as a plan: what it fills in which statements, defers, takes as advice.
//! - [`proof`]: the transaction-end proof: a position is filled only once every transaction that may have drawn it has ended.
//! - [`engine`]: the database seam, with [`engine::postgres`] and [`engine::mssql`].
//! - [`healer`]: the loop: scan, track, fill what is due, report.
//! - [`fleet`]: many stores in one daemon, each its own healer.
//! - [`leader`]: whether this process may fill now.
//! - [`replicas`]: how replicas divide the stores (a roll in each database, rendezvous preference).
//! - [`telemetry`]: logs, metrics, and the `/metrics`, `/healthz`, `/readyz`, `/status` server.
//! - [`shutdown`]: SIGTERM and SIGINT into a cancellation token.
//! - [`systemd`]: `READY=1` and `STOPPING=1` for a `Type=notify` unit.
//! - [`backoff`]: capped, jittered exponential backoff.
//! - [`cli`]: the command line: clap's definitions and the dispatch, each command in a file of its own.
#![forbid(unsafe_code)]

pub mod backoff;
pub mod cli;
pub mod config;
pub mod cycle;
pub mod engine;
pub mod fleet;
pub mod gaps;
pub mod healer;
pub mod leader;
pub mod plan;
pub mod proof;
pub mod replicas;
pub mod secret;
pub mod shutdown;
pub mod systemd;
pub mod telemetry;

/// The module graph, read from the sources: which top-level module names
/// which (`crate::x` outside comments).
#[cfg(test)]
mod architecture {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    fn walk(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, files);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }

    fn graph() -> BTreeMap<String, BTreeSet<String>> {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        walk(&src, &mut files);
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for file in files {
            let rel = file.strip_prefix(&src).unwrap();
            let first = rel.components().next().unwrap().as_os_str();
            let module = first.to_string_lossy().trim_end_matches(".rs").to_string();
            let text = std::fs::read_to_string(&file).unwrap();
            let edges = graph.entry(module.clone()).or_default();
            for line in text.lines() {
                let code = line.split("//").next().unwrap_or_default();
                for (i, _) in code.match_indices("crate::") {
                    let name: String = code[i + 7..]
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                        .collect();
                    if !name.is_empty() && name != module {
                        edges.insert(name);
                    }
                }
            }
        }
        graph
    }

    /// Architecture invariant: no two modules import each other, directly
    /// or through others.
    #[test]
    fn the_module_graph_has_no_cycle() {
        let graph = graph();
        fn visit(
            node: &str,
            graph: &BTreeMap<String, BTreeSet<String>>,
            path: &mut Vec<String>,
            done: &mut BTreeSet<String>,
        ) {
            if done.contains(node) {
                return;
            }
            if let Some(at) = path.iter().position(|n| n == node) {
                panic!("import cycle: {} -> {node}", path[at..].join(" -> "));
            }
            path.push(node.to_string());
            for next in graph.get(node).into_iter().flatten() {
                visit(next, graph, path, done);
            }
            path.pop();
            done.insert(node.to_string());
        }
        let mut done = BTreeSet::new();
        for node in graph.keys() {
            visit(node, &graph, &mut Vec::new(), &mut done);
        }
    }

    /// Architecture invariant: the engines know ranges, connection
    /// strings and the roll of replicas (pure values), not the
    /// configuration, the loop or the telemetry.
    #[test]
    fn engines_import_only_the_engine_neutral_core() {
        let graph = graph();
        let engine: Vec<&String> = graph["engine"].iter().collect();
        assert_eq!(engine, ["gaps", "replicas", "secret"], "{graph:?}");
        assert!(graph["replicas"].is_empty(), "{graph:?}");
    }
}
