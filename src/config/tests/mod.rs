//! `load` from the layers to the settings and `gap-healer config`'s output:
//! the layers and origins (`layers.rs`), a fleet's stores (`fleet.rs`), the
//! table profiles (`profiles.rs`).

use super::*;

mod fleet;
mod layers;
mod profiles;

pub(super) fn args() -> ConfigArgs {
    ConfigArgs::default()
        .with("engine", "postgres")
        .with("connection_string", "host=db user=u password=pw")
}

pub(super) fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub(super) fn temp_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("gh-cfg-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub(super) fn fleet_file(tag: &str, text: &str) -> (std::path::PathBuf, ConfigArgs) {
    let dir = temp_dir(tag);
    let file = dir.join("fleet.toml");
    std::fs::write(&file, text).unwrap();
    let mut a = ConfigArgs::default();
    a.config = Some(file.clone());
    (dir, a)
}

pub(super) const FLEET: &str = r#"
gap_timeout = "5s"
engine = "postgres"
[[stores]]
name = "orders"
connection_string = "host=db1 password=Pw1secret"
schema = "orders"
gap_timeout = "2s"
[[stores]]
name = "billing"
connection_string = "host=db1 password=Pw1secret"
schema = "billing"
dry_run = true
"#;

/// The files of config/ import each other without a cycle, and none
/// imports mod.rs (which only declares them and re-exports): each
/// `super::x` outside comments and tests names a sibling file.
#[test]
fn the_files_import_each_other_without_a_cycle() {
    use std::collections::{BTreeMap, BTreeSet};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/config");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        if path.extension().is_none_or(|e| e != "rs") || name == "mod" {
            continue;
        }
        graph.insert(name, BTreeSet::new());
    }
    let files: Vec<String> = graph.keys().cloned().collect();
    for file in &files {
        let text = std::fs::read_to_string(dir.join(format!("{file}.rs"))).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap();
        for line in code.lines() {
            let line = line.split("//").next().unwrap_or_default();
            for (i, _) in line.match_indices("super::") {
                let name: String = line[i + 7..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                assert!(
                    files.contains(&name),
                    "{file}.rs imports super::{name}, not a file of config/: {line}"
                );
                graph.get_mut(file).unwrap().insert(name);
            }
        }
    }
    // Peel off files that import nothing left; a cycle never peels.
    while !graph.is_empty() {
        let leaves: Vec<String> = graph
            .iter()
            .filter(|(_, deps)| deps.iter().all(|d| !graph.contains_key(d)))
            .map(|(f, _)| f.clone())
            .collect();
        assert!(!leaves.is_empty(), "an import cycle among {graph:?}");
        for leaf in leaves {
            graph.remove(&leaf);
        }
    }
}
