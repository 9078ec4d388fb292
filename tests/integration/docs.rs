//! The documents an operator reads first (issue 27, item 6): LICENSE and
//! CHANGELOG.md are there. Each test reads the files as they are in the
//! repository.

fn read(file: &str) -> String {
    let path = format!("{}/{file}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
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
}
