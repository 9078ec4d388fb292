//! What the binary prints for shells and pagers, tried in them: the scripts
//! of `gap-healer completions` loaded into real bash, zsh and fish, asked to
//! complete a subcommand's flag and a flag's value the way a user's TAB
//! does; and `gap-healer man` read by a pipe that closes early.
//!
//! A shell that is not installed here is skipped with the reason printed
//! (`.ci/run` installs zsh and fish, so CI runs all three).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use gap_healer_testkit::bin::{self, cli};

/// The directory of this test process's scripts.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gh-shells-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Where `shell` is, or `None` (and why) when it is not installed.
fn installed(shell: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(shell))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        println!(
            "SKIPPED: {shell} is not installed here (.ci/run installs it: apt-get install {shell})"
        );
    }
    found
}

/// The script `gap-healer completions SHELL` prints, written to `file`.
fn script(shell: &str, file: &Path) {
    let out = cli(&["completions", shell], &[]);
    assert_eq!(out.code, 0, "{shell}: {}", out.all());
    std::fs::write(file, &out.stdout).unwrap();
}

/// Runs `cmd` (a shell), at most 30 s: its stdout, or a panic with its output.
fn answer(mut cmd: Command, what: &str) -> String {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{what}: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `timeout 30 PROGRAM ARGS...`: a shell that waits for ever fails the test.
fn bounded(program: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new("timeout");
    cmd.arg("30").arg(program).args(args);
    cmd
}

/// What bash offers for `line` (the cursor at its end): the script sourced
/// in bash, the function `complete -p gap-healer` names called as
/// readline calls it (COMP_WORDS, COMP_CWORD, COMP_LINE, COMP_POINT set;
/// the command, the word and the word before as arguments), then COMPREPLY.
fn bash_offers(bash: &Path, file: &Path, line: &str) -> Vec<String> {
    const DRIVER: &str = r#"
source "$1"; shift
spec=$(complete -p gap-healer) || { echo "no completion is registered for gap-healer" >&2; exit 3; }
fn=${spec#*-F }; fn=${fn%% *}
COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 ))
COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
COMPREPLY=()
"$fn" gap-healer "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
printf '%s\n' "${COMPREPLY[@]}"
"#;
    let mut words: Vec<&str> = line.split_whitespace().collect();
    if line.ends_with(' ') {
        words.push("");
    }
    let file = file.to_str().unwrap();
    let mut args = vec!["--norc", "--noprofile", "-c", DRIVER, "bash", file];
    args.extend(words);
    lines(&answer(bounded(bash, &args), &format!("bash: {line}")))
}

/// What fish offers for `line`: `complete -C` after sourcing the script
/// (each candidate's description, after a tab, left out).
fn fish_offers(fish: &Path, file: &Path, line: &str) -> Vec<String> {
    let command = format!(
        "source {}; complete -C {}",
        quote(file.to_str().unwrap()),
        quote(line)
    );
    let out = answer(
        bounded(fish, &["--no-config", "-c", &command]),
        &format!("fish: {line}"),
    );
    lines(&out)
        .into_iter()
        .map(|l| l.split('\t').next().unwrap_or_default().to_string())
        .collect()
}

/// What zsh offers for `line`: an interactive `zsh -f` on a pseudo-terminal
/// (zsh/zpty), compinit, the script sourced, then `line` and a TAB typed
/// into it. Each match is written out from inside the completion, where
/// `compadd` adds it (matched against the word being completed, as the
/// user would see it offered), between two markers.
fn zsh_offers(zsh: &Path, file: &Path, line: &str) -> Vec<String> {
    const SETUP: &str = r#"
PROMPT='' RPROMPT=''
autoload -Uz compinit && compinit -u -D
source "$GH_SCRIPT"
bindkey '^I' complete-word
gh_begin() { print -r -- '<<begin>>' }
gh_end() { print -r -- '<<end>>' }
compprefuncs=(gh_begin)
comppostfuncs=(gh_end)
compadd() {
  # The calls that only ask for matches (-O, -A, -D) are the helpers' own.
  if [[ ${@[1,(i)(-|--)]} == *-(O|A|D)\ * ]]; then
    builtin compadd "$@"
    return
  fi
  local -a gh_hits
  builtin compadd -O gh_hits "$@"
  local h
  for h in $gh_hits; do print -r -- "<<hit>>$h"; done
  builtin compadd "$@"
}
print -r -- '<<ready>>'
"#;
    const DRIVER: &str = r#"
zmodload zsh/zpty || exit 3
zpty gh zsh -f -i
zpty -w gh "source ${(q)1}"
zpty -r gh out '*<<ready>>*' || exit 4
zpty -w -n gh "$2"$'\t'
zpty -r gh out '*<<end>>*' || exit 5
zpty -d gh
print -r -- "$out"
"#;
    let dir = file.parent().unwrap();
    let setup = dir.join("setup.zsh");
    std::fs::write(&setup, SETUP).unwrap();
    let mut cmd = bounded(
        zsh,
        &["-f", "-c", DRIVER, "zsh", setup.to_str().unwrap(), line],
    );
    cmd.env("GH_SCRIPT", file);
    let out = answer(cmd, &format!("zsh: {line}"));
    assert!(
        out.contains("<<begin>>"),
        "zsh never completed {line:?}:\n{out}"
    );
    out.lines()
        .filter_map(|l| l.trim_end_matches('\r').strip_prefix("<<hit>>"))
        .map(String::from)
        .collect()
}

fn lines(out: &str) -> Vec<String> {
    out.lines()
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

/// A word for fish's `-c`, single-quoted.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// The same questions for every shell: a subcommand's flag from its
/// prefix, a flag's closed set of values, a flag of another command not
/// offered, and the commands at the top.
fn assert_completes(shell: &str, offers: impl Fn(&str) -> Vec<String>) {
    let asked = |line: &str| {
        let got = offers(line);
        println!("{shell}: {line:?} -> {got:?}");
        got
    };
    assert_eq!(asked("gap-healer run --gap-"), ["--gap-timeout"], "{shell}");
    let mut engines = asked("gap-healer run --engine ");
    engines.sort();
    assert_eq!(engines, ["mssql", "postgres"], "{shell}");
    let mut formats = asked("gap-healer scan --format ");
    formats.sort();
    assert_eq!(formats, ["json", "text"], "{shell}");
    // scan reads no metrics_addr: its flag is run's and config's only.
    assert!(asked("gap-healer scan --metrics-").is_empty(), "{shell}");
    assert_eq!(asked("gap-healer sc"), ["scan"], "{shell}");
}

/// Issue 27: bash completed no flag of any subcommand (clap_complete named
/// the case arms of a hyphenated binary `gap__subcmd__healer__subcmd__run`
/// while its loop set `gap__healer__subcmd__run`).
#[test]
fn bash_completes_a_subcommands_flags_and_their_values() {
    let Some(bash) = installed("bash") else {
        return;
    };
    let file = scratch("bash").join("gap-healer.bash");
    script("bash", &file);
    assert_completes("bash", |line| bash_offers(&bash, &file, line));
}

#[test]
fn zsh_completes_a_subcommands_flags_and_their_values() {
    let Some(zsh) = installed("zsh") else {
        return;
    };
    let file = scratch("zsh").join("_gap-healer");
    script("zsh", &file);
    assert_completes("zsh", |line| zsh_offers(&zsh, &file, line));
}

#[test]
fn fish_completes_a_subcommands_flags_and_their_values() {
    let Some(fish) = installed("fish") else {
        return;
    };
    let file = scratch("fish").join("gap-healer.fish");
    script("fish", &file);
    assert_completes("fish", |line| fish_offers(&fish, &file, line));
}

/// Every shell clap_complete knows gets a script made from the flag
/// definitions (elvish and powershell are not installed here: their
/// scripts are only seen to name a subcommand's own flag).
#[test]
fn every_shell_gets_a_script_of_the_flags() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = cli(&["completions", shell], &[]);
        assert_eq!(out.code, 0, "{shell}: {}", out.all());
        assert!(out.stdout.contains("start-from"), "{shell}");
        assert!(out.stdout.contains("completions"), "{shell}");
    }
}

/// Issue 27: `gap-healer man | head` printed "Broken pipe" (and exited 3).
/// A reader that stops early is no failure: nothing on stderr, exit 0. The
/// reader here has left before the first write (its end of the pipe closed
/// before the binary starts), so every write meets a closed pipe, however
/// large the pipe's buffer and however fast the writer.
#[test]
fn output_into_a_pipe_its_reader_closed_ends_quietly() {
    for args in [
        &["man"][..],
        &["man", "run"],
        &["completions", "bash"],
        &["sql", "--engine", "postgres"],
        &[
            "config",
            "--engine",
            "postgres",
            "--connection-string",
            "host=x",
        ],
    ] {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let out = bin::command(args, [("", ""); 0])
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .expect("run gap-healer");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(stderr.is_empty(), "{args:?} wrote to stderr: {stderr}");
    }
}
