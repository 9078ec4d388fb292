//! Writing a partial run (`--only ... --write PATH`) into the generated part
//! of the docs without losing the other sections' results: the rows of the
//! summary table and the `### N.` blocks of the sections that ran replace
//! theirs, the rest stays, and a line under the header says which sections
//! were re-run alone, when, and on what.

use std::path::Path;

use anyhow::{Context, Result};

use crate::{BEGIN, END};

/// A generated part: header paragraphs, summary rows, detail blocks.
struct Parts {
    header: Vec<String>,
    rows: Vec<String>,
    blocks: Vec<String>,
}

fn parse(text: &str) -> Option<Parts> {
    let lines: Vec<&str> = text.lines().collect();
    let table = lines.iter().position(|l| l.starts_with("| what |"))?;
    let mut header: Vec<String> = Vec::new();
    for paragraph in lines[..table].join("\n").split("\n\n") {
        let p = paragraph.trim();
        if !p.is_empty() {
            header.push(p.to_string());
        }
    }
    let mut i = table + 2; // the heading and its |---| line
    let mut rows = Vec::new();
    while i < lines.len() && lines[i].starts_with('|') {
        rows.push(lines[i].to_string());
        i += 1;
    }
    let mut blocks: Vec<String> = Vec::new();
    for line in &lines[i..] {
        if line.starts_with("### ") {
            blocks.push(String::new());
        }
        if let Some(b) = blocks.last_mut() {
            b.push_str(line);
            b.push('\n');
        }
    }
    let blocks = blocks
        .into_iter()
        .map(|b| b.trim_end().to_string())
        .collect();
    Some(Parts {
        header,
        rows,
        blocks,
    })
}

/// The section number a summary row (`| 5. ...`) or a block (`### 5. ...`) belongs to.
fn number(s: &str) -> Option<&str> {
    let s = s.trim_start_matches(['|', '#', ' ']);
    let (n, _) = s.split_once(". ")?;
    n.chars().all(|c| c.is_ascii_digit()).then_some(n)
}

/// Replaces, in `old`, the parts of the sections `new` reports; `None` when
/// either cannot be read as a generated part.
fn merge(old: &str, new: &str, only: &str) -> Option<String> {
    let (old, new) = (parse(old)?, parse(new)?);
    let ran: Vec<String> = new
        .rows
        .iter()
        .chain(&new.blocks)
        .filter_map(|s| number(s).map(String::from))
        .collect();
    let ours = |s: &String| number(s).is_some_and(|n| ran.iter().any(|r| r == n));
    let note = format!("Re-run alone (`--only {only}`):");
    let mut header: Vec<String> = old
        .header
        .into_iter()
        .filter(|p| !p.starts_with(&note))
        .collect();
    header.push(format!("{note} {}", new.header.join(" ")));
    // New rows and blocks go where the section's old ones were (else at the end).
    let splice = |old: Vec<String>, new: Vec<String>| -> Vec<String> {
        let at = old.iter().position(&ours).unwrap_or(old.len());
        let mut out: Vec<String> = old[..at].iter().filter(|s| !ours(s)).cloned().collect();
        out.extend(new);
        out.extend(old[at..].iter().filter(|s| !ours(s)).cloned());
        out
    };
    let rows = splice(old.rows, new.rows);
    let blocks = splice(old.blocks, new.blocks);
    let mut out = header.join("\n\n");
    out.push_str("\n\n| what | figure | target | |\n|---|---|---|---|\n");
    for r in rows {
        out.push_str(&r);
        out.push('\n');
    }
    for b in blocks {
        out.push('\n');
        out.push_str(&b);
        out.push('\n');
    }
    Some(out)
}

/// Writes a partial run's `text` into `path`'s generated part; the whole
/// part when the file has none to merge into.
pub fn write_partial(path: &Path, text: &str, only: &str) -> Result<()> {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let merged = match (old.find(BEGIN), old.find(END)) {
        (Some(b), Some(e)) if b < e => {
            let region = &old[b + BEGIN.len()..e];
            let inner = merge(region, text, only).with_context(|| {
                format!("cannot merge into the generated part of {}", path.display())
            })?;
            format!(
                "{}{BEGIN}\n{inner}\n{END}{}",
                &old[..b],
                &old[e + END.len()..]
            )
        }
        _ => return crate::write_docs(&path.to_path_buf(), text),
    };
    std::fs::write(path, merged).with_context(|| format!("writing {}", path.display()))
}
