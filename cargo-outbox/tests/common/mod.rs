//! What every `cargo outbox` integration test needs: the workspace, the
//! command under test and its output as text.
#![allow(dead_code)] // each test crate uses a part

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The workspace's root directory.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate is in the workspace")
        .to_owned()
}

/// `cargo outbox ARGS` run in `dir`, without an inherited `OUTBOX_LOCK`.
pub fn cargo_outbox(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cargo-outbox"))
        .arg("outbox")
        .args(args)
        .current_dir(dir)
        .env_remove("OUTBOX_LOCK")
        .output()
        .expect("cargo-outbox runs")
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}
