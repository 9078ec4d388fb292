//! The flags, built from [`KEYS`]: `--<key-with-dashes> VALUE` for each
//! key, `--key[=BOOL]` and `--no-key` for the boolean ones, and `--config`.
//! Values stay raw text so that one validator reports every problem, whatever
//! layer it came from.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use clap::{Arg, ArgAction, ArgMatches, Command};

use super::keys::{Flag, Key, KEYS};

/// The flags every subcommand accepts: `--config` and one per key.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ConfigArgs {
    /// TOML configuration file (keys as in config/gap-healer.toml).
    pub config: Option<PathBuf>,
    /// The keys given as flags, by name, as text.
    values: BTreeMap<&'static str, String>,
}

impl ConfigArgs {
    /// Sets key `name` as if given by its flag.
    ///
    /// # Panics
    /// When no key is called `name` (a mistake in the caller's code).
    pub fn set(&mut self, name: &str, value: impl Into<String>) -> &mut Self {
        let key = Key::find(name).unwrap_or_else(|| panic!("no configuration key {name}"));
        self.values.insert(key.name, value.into());
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
    /// The clap arguments of this key: global, so they go before or after the
    /// subcommand, and taking values that start with `-` (so that `-5s` is
    /// reported as negative, not as an unknown flag).
    fn args(&self) -> Vec<Arg> {
        let arg = Arg::new(self.name)
            .long(self.long())
            .global(true)
            .help(self.help_line());
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
                    .global(true)
                    .action(ArgAction::SetTrue)
                    .help(format!("Same as --{}=false", self.long()))
                    .overrides_with(self.name),
            ],
        }
    }
}

impl clap::Args for ConfigArgs {
    fn augment_args(cmd: Command) -> Command {
        cmd.arg(
            Arg::new("config")
                .long("config")
                .global(true)
                .value_name("FILE")
                .action(ArgAction::Set)
                .allow_hyphen_values(true)
                .value_parser(clap::value_parser!(PathBuf))
                .help("TOML configuration file (keys as in config/gap-healer.toml)"),
        )
        .args(KEYS.iter().flat_map(Key::args))
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl clap::FromArgMatches for ConfigArgs {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut args = ConfigArgs {
            config: m.get_one::<PathBuf>("config").cloned(),
            values: BTreeMap::new(),
        };
        for key in KEYS {
            if let Some(v) = m.get_one::<String>(key.name) {
                args.values.insert(key.name, v.clone());
            }
            if key.flag == Flag::Switch && m.get_flag(&negation(key)) {
                // Both can remain when one came before the subcommand and
                // the other after it.
                if args.values.contains_key(key.name) {
                    return Err(clap::Error::raw(
                        clap::error::ErrorKind::ArgumentConflict,
                        format!(
                            "the argument '--no-{0}' cannot be used with '--{0}'",
                            key.long()
                        ),
                    ));
                }
                args.values.insert(key.name, "false".into());
            }
        }
        Ok(args)
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

    fn command() -> Command {
        ConfigArgs::augment_args(Command::new("gap-healer"))
            .subcommand(Command::new("run"))
            .subcommand(Command::new("heal").arg(Arg::new("once").long("once").num_args(0)))
    }

    fn parse(argv: &[&str]) -> Result<ConfigArgs, clap::Error> {
        let m = command()
            .try_get_matches_from(std::iter::once("gap-healer").chain(argv.iter().copied()))?;
        ConfigArgs::from_arg_matches(&m)
    }

    #[test]
    fn every_key_has_a_flag() {
        let cmd = command();
        for key in KEYS {
            let arg = cmd
                .get_arguments()
                .find(|a| a.get_long() == Some(key.long().as_str()))
                .unwrap_or_else(|| panic!("no flag for {}", key.name));
            assert!(arg.is_global_set(), "{}", key.name);
            let value = if key.flag == Flag::Switch {
                "true"
            } else {
                "x"
            };
            let flag = format!("--{}={value}", key.long());
            let got = parse(&["run", &flag]).unwrap();
            assert_eq!(got.get(key.name), Some(value), "{flag}");
        }
        cmd.debug_assert();
    }

    #[test]
    fn values_before_or_after_the_subcommand() {
        let a = parse(&["--gap-timeout", "3s", "run", "--schema", "-x"]).unwrap();
        assert_eq!(a.get("gap_timeout"), Some("3s"));
        assert_eq!(a.get("schema"), Some("-x"));
        assert_eq!(a.get("poll_interval"), None);
        let a = parse(&["run", "--config", "a.toml"]).unwrap();
        assert_eq!(a.config, Some(PathBuf::from("a.toml")));
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
    }

    #[test]
    fn debug_hides_the_password() {
        let a = ConfigArgs::default().with("connection_string", "host=db password=Sekrit99");
        assert!(!format!("{a:?}").contains("Sekrit99"), "{a:?}");
    }
}
