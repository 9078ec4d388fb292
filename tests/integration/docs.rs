//! The documents an operator reads first (issue 27, item 6): README.md
//! leads with what gap-healer is and a quick start, explains its words
//! before the sections that use them, says what a build needs, which
//! Eventuous versions need what, how to upgrade and uninstall; LICENSE and
//! CHANGELOG.md are there. Each test reads the files as they are in the
//! repository.

fn read(file: &str) -> String {
    let path = format!("{}/{file}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The README's `## ` headings, in order.
fn headings(readme: &str) -> Vec<&str> {
    readme
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .collect()
}

/// The text of the section whose `## ` heading starts with `title` (to
/// the next `## `).
fn section<'a>(readme: &'a str, title: &str) -> &'a str {
    let start = readme
        .find(&format!("\n## {title}"))
        .unwrap_or_else(|| panic!("README.md has no section `## {title}...`"));
    let body = &readme[start + 1..];
    let end = body[3..].find("\n## ").map_or(body.len(), |e| e + 3);
    &body[..end]
}

fn position(list: &[&str], title: &str) -> usize {
    list.iter()
        .position(|h| h.starts_with(title))
        .unwrap_or_else(|| panic!("README.md has no section `## {title}...`: {list:?}"))
}

#[test]
fn the_readme_leads_with_what_it_is_and_a_quick_start_and_keeps_figures_for_later() {
    let readme = read("README.md");
    let list = headings(&readme);
    assert_eq!(list.first(), Some(&"Quick start"), "{list:?}");
    // What it is: at most two lines before the quick start.
    let intro: Vec<&str> = readme
        .split("\n## ")
        .next()
        .unwrap()
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert!(
        intro.len() <= 2,
        "the intro is {} lines: {intro:?}",
        intro.len()
    );
    let quick = section(&readme, "Quick start");
    for part in [
        "### Try it: the demo",
        "### Install",
        "### On PostgreSQL",
        "### On SQL Server",
    ] {
        assert!(quick.contains(part), "the quick start lacks {part}");
    }
    assert!(quick.contains("--engine mssql") && quick.contains("--engine postgres"));
    let order = [
        "Quick start",
        "Commands",
        "Configuration",
        "How it works",
        "Figures",
    ];
    let at: Vec<usize> = order.iter().map(|t| position(&list, t)).collect();
    assert!(
        at.windows(2).all(|w| w[0] < w[1]),
        "sections out of order: {order:?} at {at:?} in {list:?}"
    );
}

/// Each of these words is explained in "Words used here" before any other
/// section uses it ("seed 003" was used unexplained).
#[test]
fn the_readme_explains_its_words_before_using_them() {
    let readme = read("README.md");
    let words = section(&readme, "Words used here");
    let glossary_at = readme.find("\n## Words used here\n").unwrap();
    for word in [
        "seed 003",
        "ledger-core",
        "tombstone",
        "hole",
        "gap_timeout",
        "watermark",
        "dry run",
        "leader",
        "checkpoint",
    ] {
        let lower = readme.to_lowercase();
        assert!(
            words.to_lowercase().contains(&format!("**{word}"))
                || words.to_lowercase().contains(&format!("; {word}"))
                || words.to_lowercase().contains(&format!(", {word}")),
            "`{word}` is not one of the words explained in `## Words used here`"
        );
        // Before the glossary only the quick start may use it, and only
        // the words it explains where it uses them (hole, tombstone,
        // gap_timeout, dry run ...), never seed 003 or ledger-core.
        if word == "seed 003" || word == "ledger-core" {
            let first = lower.find(word).unwrap();
            assert!(
                first > glossary_at,
                "`{word}` is used before `## Words used here` explains it: {:?}",
                &readme[first.saturating_sub(80)..first + 40]
            );
        }
    }
}

#[test]
fn the_readme_says_what_a_build_needs() {
    let readme = read("README.md");
    let install = section(&readme, "Quick start");
    let build = section(&readme, "Building from source");
    for text in [install, build] {
        assert!(text.contains("C compiler"), "no C compiler named");
        assert!(
            text.contains("ring"),
            "the crate that needs it is not named"
        );
        assert!(text.contains("GB"), "no disk figure");
    }
    assert!(
        build.contains("test build") && build.contains("GB"),
        "the test build's disk is not given"
    );
}

#[test]
fn the_readme_has_a_table_of_eventuous_versions_and_their_settings() {
    let readme = read("README.md");
    let versions = section(&readme, "Eventuous versions");
    for needle in [
        "| 0.15",
        "| 0.16",
        "GapSkipTimeoutMs",
        "GapHandlingTimeoutMs",
        "GapAgeThresholdMs",
        "watermark",
        "### The subscriber's settings",
    ] {
        assert!(
            versions.contains(needle),
            "the versions section lacks {needle}"
        );
    }
    // gap_timeout is gap-healer's own: never called Eventuous's setting.
    for line in readme.lines().filter(|l| l.contains("`gap_timeout` |")) {
        assert!(
            !line.contains("(Eventuous' `GapHandlingTimeoutMs`)"),
            "{line}"
        );
    }
}

#[test]
fn the_readme_says_how_to_upgrade_and_uninstall() {
    let readme = read("README.md");
    let upgrade = section(&readme, "Upgrading");
    for needle in [
        "CHANGELOG.md",
        "gap-healer install",
        "gap-healer check",
        "Helm",
    ] {
        assert!(upgrade.contains(needle), "Upgrading lacks {needle}");
    }
    let uninstall = section(&readme, "Uninstalling");
    for needle in [
        "__tombstones__",
        "leave them",
        "watermark",
        "gap_healer_fill",
        "DROP ROLE",
        "DROP USER",
    ] {
        assert!(uninstall.contains(needle), "Uninstalling lacks {needle}");
    }
}

#[test]
fn license_and_changelog_are_there() {
    let license = read("LICENSE");
    assert!(
        license.contains("Apache License\n                           Version 2.0, January 2004")
    );
    assert!(license.contains("END OF TERMS AND CONDITIONS"));
    assert!(license.contains("APPENDIX: How to apply the Apache License to your work."));
    for manifest in ["Cargo.toml", "tests/kit/Cargo.toml"] {
        assert!(
            read(manifest).contains("license = \"Apache-2.0\""),
            "{manifest} names another license than LICENSE holds"
        );
    }
    let changelog = read("CHANGELOG.md");
    let versions: Vec<&str> = changelog
        .lines()
        .filter(|l| l.starts_with("## ["))
        .collect();
    assert_eq!(versions.first(), Some(&"## [Unreleased]"), "{versions:?}");
    let unreleased = changelog
        .split("## [Unreleased]")
        .nth(1)
        .unwrap()
        .split("\n## [")
        .next()
        .unwrap();
    for kind in ["### Added", "### Changed", "### Fixed"] {
        assert!(unreleased.contains(kind), "Unreleased lacks {kind}");
    }
    assert!(
        read("README.md").contains("(LICENSE)"),
        "README links no LICENSE"
    );
}
