//! The `gap-healer` binary: everything is in the library; see `gap_healer::cli`.

fn main() -> std::process::ExitCode {
    gap_healer::cli::main()
}
