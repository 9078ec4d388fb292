//! `gap-healer completions` and `gap-healer man`: shell completion scripts
//! and man pages, made from the documented command line ([`Documented`]).

use clap::CommandFactory;

use super::{print_out, Documented, Failure, MAN_PAGES};

/// The binary's name, as a shell completes it.
const BIN: &str = "gap-healer";

/// The name bash's script is generated under (see [`completion_script`]).
const BASH_NAME: &str = "gap_healer";

/// The documented command line as completions and man pages show it: the
/// keys whose values are a closed set list them, so `--engine <TAB>`
/// offers `mssql postgres`. (Parsing leaves those values to the
/// configuration, which names every problem at once.)
fn documented() -> clap::Command {
    const CLOSED: [(&str, [&str; 2]); 2] = [
        ("engine", ["mssql", "postgres"]),
        ("log_format", ["text", "json"]),
    ];
    let mut cmd = Documented::command();
    for name in MAN_PAGES {
        cmd = cmd.mut_subcommand(name, |mut sub| {
            for (key, values) in CLOSED {
                if sub.get_arguments().any(|a| a.get_id() == key) {
                    sub = sub.mut_arg(key, |a| a.value_parser(values));
                }
            }
            sub
        });
    }
    cmd
}

/// Prints `shell`'s completion script.
pub(super) fn completions(shell: clap_complete::Shell) -> Result<u8, Failure> {
    print_out(&completion_script(shell))
}

/// `gap-healer completions SHELL`: the script, made from the documented
/// command line. clap_complete 4.6 gets bash wrong for a hyphenated name: its
/// loop sets `cmd="gap__healer__subcmd__run"` while its case arms are named
/// `gap__subcmd__healer__subcmd__run)`, so no flag of any subcommand
/// completes. Generated under a name without a hyphen both agree; the
/// script is then registered (`complete -F _gap_healer ...`) for the real
/// name, the one word of it that names the command the shell completes.
fn completion_script(shell: clap_complete::Shell) -> Vec<u8> {
    let mut cmd = documented();
    let mut out = Vec::new();
    if shell != clap_complete::Shell::Bash {
        clap_complete::generate(shell, &mut cmd, BIN, &mut out);
        return out;
    }
    clap_complete::generate(shell, &mut cmd, BASH_NAME, &mut out);
    let mut script = String::new();
    for line in String::from_utf8_lossy(&out).lines() {
        match line.strip_suffix(&format!(" {BASH_NAME}")) {
            Some(head) if head.trim_start().starts_with("complete ") => {
                script.push_str(&format!("{head} {BIN}\n"));
            }
            _ => {
                script.push_str(line);
                script.push('\n');
            }
        }
    }
    script.into_bytes()
}

/// `gap-healer man [COMMAND]`: the page, from the same definitions as the flags.
pub(super) fn man(command: Option<&str>) -> Result<u8, Failure> {
    let mut cmd = documented();
    cmd.build();
    let page = match command {
        None => cmd,
        Some(name) => cmd
            .find_subcommand(name)
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no command {name}"))?,
    };
    let mut roff = Vec::new();
    clap_mangen::Man::new(page)
        .date(env!("GAP_HEALER_BUILD_DATE"))
        .source(format!("gap-healer {}", env!("CARGO_PKG_VERSION")))
        .manual("gap-healer")
        .render(&mut roff)
        .map_err(|e| anyhow::anyhow!("making the man page: {e}"))?;
    print_out(&roff)
}
