//! kpc's metrics as an embedder's exporter sees them: this process installs the real
//! `metrics-exporter-prometheus` recorder, runs kernels through the counting fake backend (a builder
//! publishing signed entries to an fs:// remote, a serving node served by it, one forged entry
//! refused), renders the exposition its `/metrics` endpoint serves and checks each series' value.
//! The recorder is process-wide, so the test runs in a child process of its own: no other test's
//! kernels count.
#![cfg(feature = "remote")]

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::disk::TempDir;
use common::fake_backend::{FakeBackend, image, program};
use kpc::Config;
use kpc::Source;
use kpc::admin::runtime::ProgramManager;
use kpc::admin::store::auth;
use kpc::admin::store::{EntryAuth, Provenance};
use kpc::seal;
use kpc::{BuildOptions, SpecConstants};
use kpc::{RemoteUrl, SigningKey};

fn config(root: &Path, url: &str, signing: Option<SigningKey>, trusted: &SigningKey) -> Config {
    Config::builder()
        .cache_dir(root)
        .remote(RemoteUrl::parse(url).unwrap())
        .signing_key(signing)
        .trusted_keys([trusted.public_key()])
        .host_id(Some("metrics-test".to_string()))
        .build()
        .unwrap()
}

/// The value of the series `name` whose labels include every `labels` pair (0 when absent).
fn value(body: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, v) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            (n == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))))
            .then(|| v.parse::<f64>().ok())?
        })
        .sum()
}

#[test]
fn a_prometheus_scrape_shows_builds_hits_per_level_and_refusals() {
    let test = "a_prometheus_scrape_shows_builds_hits_per_level_and_refusals";
    if common::disk::child_role().as_deref() != Some("scrape") {
        let out = common::disk::child(test, "scrape").output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("SCRAPE CHECKED"),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    // The exporter's own recorder and renderer: what its HTTP listener serves at /metrics. The
    // listener itself is left out: its hyper server, a test-only feature, made cargo build the
    // dependency graph twice (once for the C library, once for the tests) on a fresh machine.
    let exporter = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("the exporter installs as the process's recorder");

    let t = TempDir::new("metrics-scrape");
    let url = format!("fs://{}", t.join("remote").display());
    let key = SigningKey::from_seed(&[9; 32]);
    let be = Arc::new(FakeBackend::new().binary_size(4096));
    // A builder: three programs built, stored on its disk and published (signed).
    let builder = ProgramManager::new(
        be.clone(),
        &config(&t.join("a"), &url, Some(key.clone()), &key),
    );
    for i in 0..3 {
        assert_eq!(program(&builder, i), Source::Built);
    }
    assert_eq!(program(&builder, 0), Source::Memory);
    // Memory hits are published at the next miss or on request.
    builder.publish_metrics();

    // The remote entry of program 2 replaced by one an attacker signed with their own key.
    let k2 = builder.disk_key(
        &image("k2.cl", &["main"]),
        &SpecConstants::new(),
        &BuildOptions::new("-O2"),
    );
    let evil = EntryAuth::default().signer(Some(SigningKey::from_seed(&[66; 32])));
    let forged = auth::wrap(
        &evil,
        &k2,
        &seal(&k2, b"FAKEBIN1 evil", Duration::ZERO),
        &Provenance::for_key("attacker", &k2, None, Duration::ZERO),
    );
    let path = t.join("remote").join(format!(
        "kpc/v1/{}/{}",
        k2.device_digest().to_hex(),
        k2.digest().to_hex()
    ));
    assert!(path.exists(), "{}", path.display());
    std::fs::write(&path, forged).unwrap();

    // A serving node (trusted key only): two programs from the remote, the forged one refused and
    // built locally, not published.
    let serving = ProgramManager::new(be.clone(), &config(&t.join("b"), &url, None, &key));
    assert_eq!(program(&serving, 0), Source::Remote);
    assert_eq!(program(&serving, 1), Source::Remote);
    assert_eq!(program(&serving, 2), Source::Built);
    assert_eq!(be.builds(), 4);

    let body = exporter.render();
    eprintln!("{body}");
    let v = |name: &str, labels: &[(&str, &str)]| value(&body, name, labels);
    assert_eq!(v("kpc_programs_total", &[("source", "built")]), 4.0);
    assert_eq!(v("kpc_programs_total", &[("source", "remote")]), 2.0);
    // Memory hits are not counted one by one on the hit path: the published delta says 1.
    assert_eq!(v("kpc_programs_total", &[("source", "memory")]), 0.0);
    assert_eq!(v("kpc_builds_total", &[]), 4.0);
    assert_eq!(v("kpc_build_duration_seconds_count", &[]), 4.0);
    assert!(v("kpc_build_duration_seconds_sum", &[]) > 0.0, "{body}");
    assert_eq!(v("kpc_cache_hits_total", &[("level", "memory")]), 1.0);
    assert_eq!(v("kpc_cache_hits_total", &[("level", "remote")]), 2.0);
    // Misses: the builder's disk 3, the serving node's disk 3; the remote: the builder's 3, the
    // serving node's forged one.
    assert_eq!(v("kpc_cache_misses_total", &[("level", "disk")]), 6.0);
    assert_eq!(v("kpc_cache_misses_total", &[("level", "remote")]), 4.0);
    // Every disk miss explained: nothing similar was cached on either machine.
    assert_eq!(
        v(
            "kpc_cache_miss_causes_total",
            &[("level", "disk"), ("cause", "new-key")]
        ),
        6.0
    );
    assert_eq!(v("kpc_cache_puts_total", &[("level", "disk")]), 4.0);
    assert_eq!(v("kpc_cache_puts_total", &[("level", "remote")]), 3.0);
    assert_eq!(v("kpc_cache_backfills_total", &[("level", "disk")]), 2.0);
    assert!(
        v("kpc_cache_read_bytes_total", &[("level", "remote")]) >= 2.0 * 4096.0,
        "{body}"
    );
    // What went to the remote: three entries, zstd-compressed (KPC_CACHE_REMOTE_COMPRESS), so fewer
    // bytes than their binaries, and more than none.
    let written = v("kpc_cache_written_bytes_total", &[("level", "remote")]);
    assert!(written > 0.0 && written < 3.0 * 4096.0, "{body}");
    assert_eq!(
        v(
            "kpc_refusals_total",
            &[("level", "remote"), ("reason", "untrusted-signer")]
        ),
        1.0
    );
    // The refusal and the serving node's skipped publish, each one failure of cause `untrusted`.
    assert_eq!(
        v(
            "kpc_store_failures_total",
            &[("level", "remote"), ("cause", "untrusted")]
        ),
        2.0
    );
    assert!(body.contains("# TYPE kpc_programs_total counter"), "{body}");
    println!("SCRAPE CHECKED");
}
