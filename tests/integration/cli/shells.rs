//! What the binary prints for pagers and pipes: `gap-healer man` read by a
//! pipe that closes early.

use std::process::Stdio;

use gap_healer_testkit::bin;

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
