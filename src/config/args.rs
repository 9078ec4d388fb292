//! The flags, built from [`KEYS`]: `--<key-with-dashes> VALUE` for each
//! key, `--key[=BOOL]` and `--no-key` for the boolean ones, and `--config`.
//! Each command takes the flags of the keys it reads ([`Key::commands`]),
//! listed under their headings ([`Flags`]); the command line before the
//! command's name accepts every key's flag, unlisted, and the command then
//! refuses any it does not read. Values stay raw text so that one validator
//! reports every problem, whatever layer it came from.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;

use clap::{Arg, ArgAction, ArgMatches, Command};

use super::keys::{commands, Flag, Key, KEYS};

/// The configuration the flags give: `--config` and the keys given.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ConfigArgs {
    /// TOML configuration file (keys as in config/gap-healer.toml).
    pub config: Option<PathBuf>,
    /// The keys given as flags, by name, as text.
    values: BTreeMap<&'static str, String>,
    /// The switches among them given as `--no-<key>`.
    negated: BTreeSet<&'static str>,
}

impl ConfigArgs {
    /// Sets key `name` as if given by its flag.
    ///
    /// # Panics
    /// When no key is called `name` (a mistake in the caller's code).
    pub fn set(&mut self, name: &str, value: impl Into<String>) -> &mut Self {
        let key = Key::find(name).unwrap_or_else(|| panic!("no configuration key {name}"));
        self.values.insert(key.name, value.into());
        self.negated.remove(key.name);
        self
    }

    /// [`ConfigArgs::set`], by value.
    pub fn with(mut self, name: &str, value: impl Into<String>) -> Self {
        self.set(name, value);
        self
    }

    /// The text given for key `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// Every key given, by name.
    pub fn values(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.values.iter().map(|(k, v)| (*k, v.as_str()))
    }

    /// Nothing given.
    pub fn is_empty(&self) -> bool {
        self.config.is_none() && self.values.is_empty()
    }

    /// These flags (given before the command's name) with `later` (given
    /// after it) over them. `--key` on one side and `--no-key` on the other
    /// is a conflict, as it is on one side.
    pub fn then(mut self, later: ConfigArgs) -> Result<ConfigArgs, String> {
        for (key, _) in later.values() {
            if self.values.contains_key(key)
                && self.negated.contains(key) != later.negated.contains(key)
            {
                let long = key.replace('_', "-");
                return Err(format!(
                    "the argument '--no-{long}' cannot be used with '--{long}'"
                ));
            }
            self.negated.remove(key);
        }
        self.values.extend(later.values);
        self.negated.extend(later.negated);
        self.config = later.config.or(self.config);
        Ok(self)
    }
}

/// Never prints the connection string: flags are the one place it may arrive
/// as clear text.
impl fmt::Debug for ConfigArgs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let values: BTreeMap<_, _> = self
            .values
            .iter()
            .map(|(k, v)| {
                let shown = if *k == "connection_string" {
                    crate::secret::redact(v)
                } else {
                    v.clone()
                };
                (*k, shown)
            })
            .collect();
        f.debug_struct("ConfigArgs")
            .field("config", &self.config)
            .field("values", &values)
            .finish()
    }
}

/// The id of `--no-<key>`.
fn negation(key: &Key) -> String {
    format!("no_{}", key.name)
}

impl Key {
    /// The clap arguments of this key, taking values that start with `-`
    /// (so that `-5s` is reported as negative, not as an unknown flag);
    /// `hidden`: accepted, not listed.
    fn args(&self, hidden: bool) -> Vec<Arg> {
        let arg = Arg::new(self.name)
            .long(self.long())
            .help(self.help_line())
            .help_heading(self.heading.title())
            .hide(hidden);
        match self.flag {
            Flag::Value(placeholder) => vec![arg
                .value_name(placeholder)
                .action(ArgAction::Set)
                .allow_hyphen_values(true)],
            Flag::Switch => vec![
                // `=` is required: `--dry-run heal` must not read `heal` as the value.
                arg.value_name("BOOL")
                    .action(ArgAction::Set)
                    .num_args(0..=1)
                    .require_equals(true)
                    .default_missing_value("true")
                    .overrides_with(negation(self)),
                Arg::new(negation(self))
                    .long(format!("no-{}", self.long()))
                    .action(ArgAction::SetTrue)
                    .help(format!("Same as --{}=false", self.long()))
                    .help_heading(self.heading.title())
                    .hide(hidden)
                    .overrides_with(self.name),
            ],
        }
    }
}

/// The configuration flags of one command, `C` (bits of [`commands`]):
/// `--config`, `--store` and the flag of every key `C` reads, each listed
/// under its heading. With `HIDDEN`, every key's flag (`C` is
/// [`commands::ALL`]), accepted but not listed: the flags given before the
/// command's name, which the command then checks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Flags<const C: u16, const HIDDEN: bool = false> {
    pub config: ConfigArgs,
    /// The `--store` names: only these stores (empty: every store).
    pub stores: Vec<String>,
}

impl<const C: u16, const HIDDEN: bool> Flags<C, HIDDEN> {
    /// The command's bit.
    pub const COMMAND: u16 = C;

    /// Nothing given.
    pub fn is_empty(&self) -> bool {
        self.config.is_empty() && self.stores.is_empty()
    }

    /// `before` (the flags given before the command's name) under these:
    /// each key given there must be one the command reads; `name` is the
    /// command's, for the message.
    pub fn after<const B: u16, const H: bool>(
        self,
        before: Flags<B, H>,
        name: &str,
    ) -> Result<Self, String> {
        if let Some(key) = before
            .config
            .values()
            .filter_map(|(k, _)| Key::find(k))
            .find(|k| !k.taken_by(C))
        {
            let flag = if before.config.negated.contains(key.name) {
                format!("--no-{}", key.long())
            } else {
                format!("--{}", key.long())
            };
            return Err(not_read(&flag, key, name));
        }
        Ok(Flags {
            config: before.config.then(self.config)?,
            stores: [before.stores, self.stores].concat(),
        })
    }
}

/// Why `flag`, of `key`, is refused by command `name`, and where it belongs.
pub fn not_read(flag: &str, key: &Key, name: &str) -> String {
    let mut readers = commands::names(key.commands);
    readers.push("config");
    let readers = readers.join(", ");
    if commands::NAMES.iter().all(|(_, n)| *n != name) {
        return format!(
            "`gap-healer {name}` takes no configuration flags ({flag} is a flag of {readers})"
        );
    }
    format!(
        "{flag} is not a flag of `gap-healer {name}`: {name} does not read {}; it is a flag of \
         {readers} (`gap-healer {name} --help` lists {name}'s flags)",
        key.name
    )
}

/// The arguments of `command` (bits of [`commands`]): `hidden`, accepted
/// but not listed.
fn augment(cmd: Command, command: u16, hidden: bool) -> Command {
    let mut keys: Vec<&Key> = KEYS.iter().filter(|k| k.taken_by(command)).collect();
    // By heading, each in the table's order.
    keys.sort_by_key(|k| k.heading);
    cmd.arg(
        Arg::new("config")
            .long("config")
            .value_name("FILE")
            .action(ArgAction::Set)
            .allow_hyphen_values(true)
            .value_parser(clap::value_parser!(PathBuf))
            .help("TOML configuration file (keys as in config/gap-healer.toml)")
            .hide(hidden),
    )
    .arg(
        Arg::new("store")
            .long("store")
            .value_name("NAME")
            .action(ArgAction::Append)
            .help("Only this store of the file's [[stores]] or [[store_sets]] (repeatable; default: every store)")
            .hide(hidden),
    )
    .args(keys.into_iter().flat_map(|k| k.args(hidden)))
}

/// The flags of `command` read from its matches.
fn read(m: &ArgMatches, command: u16) -> Result<(ConfigArgs, Vec<String>), clap::Error> {
    let mut args = ConfigArgs {
        config: m.get_one::<PathBuf>("config").cloned(),
        ..ConfigArgs::default()
    };
    for key in KEYS.iter().filter(|k| k.taken_by(command)) {
        if let Some(v) = m.get_one::<String>(key.name) {
            args.values.insert(key.name, v.clone());
        }
        // `overrides_with` leaves at most one of `--key` and `--no-key`.
        if key.flag == Flag::Switch && m.get_flag(&negation(key)) {
            args.values.insert(key.name, "false".into());
            args.negated.insert(key.name);
        }
    }
    let stores = m
        .get_many::<String>("store")
        .map(|names| names.cloned().collect())
        .unwrap_or_default();
    Ok((args, stores))
}

impl<const C: u16, const HIDDEN: bool> clap::Args for Flags<C, HIDDEN> {
    fn augment_args(cmd: Command) -> Command {
        augment(cmd, C, HIDDEN)
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl<const C: u16, const HIDDEN: bool> clap::FromArgMatches for Flags<C, HIDDEN> {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let (config, stores) = read(m, C)?;
        Ok(Flags { config, stores })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Args, FromArgMatches};
    use commands::{ALL, HEAL, RUN, SCAN};

    type Early = Flags<ALL, true>;

    fn command() -> Command {
        Early::augment_args(Command::new("gap-healer"))
            .subcommand(Flags::<RUN>::augment_args(Command::new("run")))
            .subcommand(Flags::<SCAN>::augment_args(Command::new("scan")))
            .subcommand(
                Flags::<HEAL>::augment_args(Command::new("heal"))
                    .arg(Arg::new("once").long("once").num_args(0)),
            )
    }

    fn parse(argv: &[&str]) -> Result<ConfigArgs, String> {
        let m = command()
            .try_get_matches_from(std::iter::once("gap-healer").chain(argv.iter().copied()))
            .map_err(|e| e.to_string())?;
        let early = Early::from_arg_matches(&m).map_err(|e| e.to_string())?;
        let (name, sub) = m.subcommand().expect("a subcommand");
        let flags =
            match name {
                "run" => Flags::<RUN>::from_arg_matches(sub)
                    .map(|f| f.after(early, name).map(|f| f.config)),
                "scan" => Flags::<SCAN>::from_arg_matches(sub)
                    .map(|f| f.after(early, name).map(|f| f.config)),
                _ => Flags::<HEAL>::from_arg_matches(sub)
                    .map(|f| f.after(early, name).map(|f| f.config)),
            };
        flags.map_err(|e| e.to_string())?
    }

    #[test]
    fn every_key_has_a_flag_where_it_is_read_and_before_every_command() {
        let cmd = command();
        let run = cmd.find_subcommand("run").unwrap();
        for key in KEYS {
            // Before the command: every key, unlisted.
            let early = cmd
                .get_arguments()
                .find(|a| a.get_long() == Some(key.long().as_str()))
                .unwrap_or_else(|| panic!("no early flag for {}", key.name));
            assert!(
                early.is_hide_set() && !early.is_global_set(),
                "{}",
                key.name
            );
            // `run` reads every key.
            let arg = run
                .get_arguments()
                .find(|a| a.get_long() == Some(key.long().as_str()))
                .unwrap_or_else(|| panic!("no run flag for {}", key.name));
            assert!(!arg.is_hide_set(), "{}", key.name);
            assert_eq!(arg.get_help_heading(), Some(key.heading.title()));
            let value = if key.flag == Flag::Switch {
                "true"
            } else {
                "x"
            };
            let flag = format!("--{}={value}", key.long());
            assert_eq!(
                parse(&["run", &flag]).unwrap().get(key.name),
                Some(value),
                "{flag}"
            );
            assert_eq!(
                parse(&[&flag, "run"]).unwrap().get(key.name),
                Some(value),
                "{flag}"
            );
        }
        cmd.clone().debug_assert();
    }

    #[test]
    fn a_command_refuses_the_flags_of_keys_it_does_not_read() {
        // After the command: clap's own refusal.
        let err = parse(&["scan", "--metrics-addr", "127.0.0.1:1"]).unwrap_err();
        assert!(
            err.contains("unexpected argument '--metrics-addr'"),
            "{err}"
        );
        // Before it: the command's.
        let err = parse(&["--metrics-addr", "127.0.0.1:1", "scan"]).unwrap_err();
        assert!(
            err.contains("--metrics-addr is not a flag of `gap-healer scan`: scan does not read metrics_addr; it is a flag of run, config"),
            "{err}"
        );
        let err = parse(&["--dry-run", "scan"]).unwrap_err();
        assert!(err.contains("it is a flag of run, heal, config"), "{err}");
        assert_eq!(
            parse(&["--dry-run", "heal", "--once"])
                .unwrap()
                .get("dry_run"),
            Some("true")
        );
        assert_eq!(
            parse(&["scan", "--start-from", "0"])
                .unwrap()
                .get("start_from"),
            Some("0")
        );
    }

    #[test]
    fn values_before_or_after_the_subcommand() {
        let a = parse(&["--gap-timeout", "3s", "run", "--schema", "-x"]).unwrap();
        assert_eq!(a.get("gap_timeout"), Some("3s"));
        assert_eq!(a.get("schema"), Some("-x"));
        assert_eq!(a.get("poll_interval"), None);
        let a = parse(&["run", "--config", "a.toml"]).unwrap();
        assert_eq!(a.config, Some(PathBuf::from("a.toml")));
        let a = parse(&["--config", "a.toml", "run", "--gap-timeout", "1s"]).unwrap();
        assert_eq!(a.config, Some(PathBuf::from("a.toml")));
        // Given on both sides, the later one counts.
        let a = parse(&[
            "--gap-timeout",
            "3s",
            "--config",
            "a.toml",
            "run",
            "--gap-timeout",
            "1s",
            "--config",
            "b.toml",
        ])
        .unwrap();
        assert_eq!(a.get("gap_timeout"), Some("1s"));
        assert_eq!(a.config, Some(PathBuf::from("b.toml")));
    }

    #[test]
    fn booleans_can_be_set_either_way() {
        let get = |argv: &[&str]| parse(argv).unwrap().get("dry_run").map(String::from);
        assert_eq!(get(&["run"]), None);
        assert_eq!(get(&["run", "--dry-run"]), Some("true".into()));
        assert_eq!(get(&["--dry-run", "heal", "--once"]), Some("true".into()));
        assert_eq!(get(&["run", "--dry-run=false"]), Some("false".into()));
        assert_eq!(get(&["run", "--dry-run=maybe"]), Some("maybe".into()));
        assert_eq!(get(&["run", "--no-dry-run"]), Some("false".into()));
        assert_eq!(
            get(&["run", "--no-dry-run", "--dry-run"]),
            Some("true".into())
        );
        assert_eq!(
            get(&["run", "--dry-run", "--no-dry-run"]),
            Some("false".into())
        );
        let a = parse(&["run", "--no-leader-election"]).unwrap();
        assert_eq!(a.get("leader_election"), Some("false"));
        let a = parse(&["run", "--leader-election=off"]).unwrap();
        assert_eq!(a.get("leader_election"), Some("off"));
        assert!(parse(&["--no-dry-run", "run", "--dry-run"]).is_err());
        assert!(parse(&["--dry-run", "run", "--no-dry-run"]).is_err());
        assert_eq!(
            get(&["--no-dry-run", "run", "--no-dry-run"]),
            Some("false".into())
        );
    }

    #[test]
    fn stores_before_and_after_the_subcommand() {
        let m = command()
            .try_get_matches_from(["gap-healer", "--store", "a", "run", "--store", "b"])
            .unwrap();
        let early = Early::from_arg_matches(&m).unwrap();
        let run = Flags::<RUN>::from_arg_matches(m.subcommand_matches("run").unwrap()).unwrap();
        assert_eq!(run.after(early, "run").unwrap().stores, ["a", "b"]);
    }

    #[test]
    fn debug_hides_the_password() {
        let a = ConfigArgs::default().with("connection_string", "host=db password=Sekrit99");
        assert!(!format!("{a:?}").contains("Sekrit99"), "{a:?}");
    }
}
