//! Runs the `outbox-relay` binary as a child process, as an operator would.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running relay whose output is collected.
pub struct RelayProcess {
    child: Child,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl RelayProcess {
    /// Starts `binary` with `args` and extra environment variables.
    pub fn spawn(binary: &Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut command = Command::new(binary);
        command
            .args(args)
            .env_remove("DATABASE_URL")
            .env_remove("KAFKA_BROKERS")
            .env("RUST_LOG", "info,sqlx=warn")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command.spawn().expect("start outbox-relay");
        let stdout = collect_lines(child.stdout.take().expect("stdout"));
        let stderr = collect_lines(child.stderr.take().expect("stderr"));
        Self {
            child,
            stdout,
            stderr,
        }
    }

    /// Lines written to standard output so far.
    pub fn stdout(&self) -> Vec<String> {
        self.stdout.lock().unwrap().clone()
    }

    /// Lines written to standard error so far.
    pub fn stderr(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The process's peak resident memory so far (`VmHWM` of
    /// `/proc/<pid>/status`), in KiB; panics once it exited.
    pub fn peak_rss_kib(&self) -> u64 {
        let path = format!("/proc/{}/status", self.child.id());
        let status = std::fs::read_to_string(&path)
            .unwrap_or_else(|error| panic!("cannot read {path}: {error}"));
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no VmHWM in {path}"))
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// Sends SIGKILL: no chance to settle or flush.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends a signal by name (`TERM`, `INT`, `STOP`, `CONT`).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{name} failed");
    }

    /// Sends SIGTERM, expects a clean exit within 30 seconds, and returns
    /// everything written to standard error.
    pub fn terminate(&mut self) -> String {
        self.signal("TERM");
        let code = self.wait(Duration::from_secs(30));
        let stderr = self.stderr().join("\n");
        assert_eq!(code, Some(0), "exit after SIGTERM; stderr:\n{stderr}");
        stderr
    }

    /// Waits for the process to exit; returns its exit code.
    pub fn wait(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                // Let the reader threads drain the pipes.
                std::thread::sleep(Duration::from_millis(50));
                return status.code();
            }
            if Instant::now() > deadline {
                panic!(
                    "outbox-relay did not exit within {timeout:?}; stderr:\n{}",
                    self.stderr().join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn collect_lines(stream: impl std::io::Read + Send + 'static) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });
    lines
}

/// Runs the binary to completion; returns exit code, stdout and stderr.
pub fn run_to_end(binary: &Path, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut command = Command::new(binary);
    command
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("KAFKA_BROKERS")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null());
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().expect("run outbox-relay");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Runs the binary to completion and expects it to refuse: exit code
/// `code`, one line on standard error besides INFO and WARN logs, starting
/// with `start`, and `secret` (a password in the arguments) written
/// nowhere. Returns that line.
pub fn assert_refused(
    binary: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    code: i32,
    start: &str,
    secret: &str,
) -> String {
    let (exit, stdout, stderr) = run_to_end(binary, args, env);
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|line| !line.contains(" INFO ") && !line.contains(" WARN "))
        .collect();
    assert_eq!(exit, code, "{args:?}: {stderr}");
    assert_eq!(lines.len(), 1, "{args:?}: one line: {stderr}");
    assert!(lines[0].starts_with(start), "{args:?}: {}", lines[0]);
    assert!(
        !stderr.contains(secret) && !stdout.contains(secret),
        "{args:?}: the password is never shown: {stderr}"
    );
    lines[0].to_owned()
}
