//! Running as a fleet: readiness and liveness of one replica, three replicas
//! behind HAProxy with the project's config (tests/fleet/fleet.py), and the
//! deployment files checked offline (Kubernetes schemas, hadolint).
//!
//! The tools (haproxy, kubernetes-validate, hadolint) are installed by
//! scripts/fleet-deps.sh, which scripts/test.sh runs; a missing tool fails.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e} (scripts/fleet-deps.sh installs it)"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn health_is_503_while_the_model_loads_and_live_throughout() {
    // Gemma 3 270M builds a 262k-token vocabulary after the port is bound,
    // which leaves seconds to see the loading answer.
    let path = onebit_testdata::real_model(onebit_testdata::GEMMA3_270M);
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut child = Command::new(common::BIN)
        .args(["serve", "--model"])
        .arg(&path)
        .args(["--port", &port.to_string(), "--threads", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let get = |p: &str| -> Option<(u16, String)> {
        common::request(port, "GET", p, b"", Duration::from_secs(5)).ok()
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen = Vec::new();
    let ready = loop {
        assert!(Instant::now() < deadline, "not ready in 120 s: {seen:?}");
        let Some(live) = get("/health/live") else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        assert_eq!(live.0, 200, "liveness: {live:?}");
        let health = get("/health").expect("bound");
        if health.0 == 200 {
            break health;
        }
        assert_eq!(health.0, 503, "{health:?}");
        assert!(health.1.contains("\"loading\""), "{health:?}");
        // An API route answers 503 too, in OpenAI's error shape.
        let (s, b) = get("/v1/models").expect("bound");
        if s != 200 {
            assert_eq!(s, 503, "{b}");
            assert!(b.contains("\"code\":\"loading\""), "{b}");
        }
        seen.push(health.0);
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        !seen.is_empty(),
        "never saw /health answer 503 while loading (ready at once: {ready:?})"
    );
}

#[test]
fn three_replicas_behind_haproxy() {
    let model = onebit_testdata::real_model(onebit_testdata::SMOLLM2_135M);
    let (ok, text) = run(Command::new("python3")
        .arg(root().join("tests/fleet/fleet.py"))
        .args(["--onebit", common::BIN, "--model"])
        .arg(&model)
        .env("FLEET_LOGS", std::env::temp_dir()));
    println!("{text}");
    assert!(ok, "the fleet test failed:\n{text}");
}

#[test]
fn kubernetes_manifests_validate_against_the_schemas() {
    let dir = root().join("deploy/kubernetes");
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    assert!(files.len() >= 4, "{files:?}");
    let validate = |f: &Path| {
        run(Command::new("kubernetes-validate")
            .args(["--strict", "-k", "1.31.0"])
            .arg(f))
    };
    for f in &files {
        let (ok, text) = validate(f);
        assert!(ok, "{}: {text}", f.display());
    }
    // The validator does refuse: a misspelt field in a copy of the Deployment.
    let bad = std::env::temp_dir().join(format!("onebit-bad-deploy-{}.yaml", std::process::id()));
    let text = std::fs::read_to_string(dir.join("deployment.yaml")).unwrap();
    std::fs::write(&bad, text.replace("readinessProbe:", "readynessProbe:")).unwrap();
    let (ok, out) = validate(&bad);
    let _ = std::fs::remove_file(&bad);
    assert!(!ok, "a misspelt field passed validation: {out}");
}

#[test]
fn dockerfile_passes_hadolint() {
    let (ok, text) = run(Command::new("hadolint").arg(root().join("deploy/Dockerfile")));
    assert!(ok, "{text}");
}
