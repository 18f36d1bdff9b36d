//! Unit tests of the configuration parsers.

use super::*;

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
    let pairs: Vec<(String, String)> = pairs
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    move |k| {
        pairs
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| OsString::from(v))
    }
}

#[test]
fn defaults_match_design() {
    let c = Config::from_lookup(env(&[("HOME", "/home/u")])).unwrap();
    assert!(c.persistent && c.in_mem);
    assert_eq!(c.max_size, GIB);
    assert_eq!(c.min_device_image_size, 0);
    assert_eq!(c.max_device_image_size, GIB);
    assert_eq!(c.in_mem_eviction_threshold, 0);
    assert_eq!(c.lock_timeout, Duration::from_secs(30));
    assert_eq!(c.trace.bits(), 0);
    assert_eq!(c.device, DeviceSelector::Auto);
    assert_eq!(c.cache_dir, Some(PathBuf::from("/home/u/.cache/kpc")));
    assert_eq!(c.cache_dir_source, CacheDirSource::Home);
}

#[test]
fn cache_dir_resolution_order() {
    let c = Config::from_lookup(env(&[
        ("KPC_CACHE_DIR", "/x/kpc"),
        ("XDG_CACHE_HOME", "/xdg"),
        ("HOME", "/h"),
    ]))
    .unwrap();
    assert_eq!(c.cache_dir, Some(PathBuf::from("/x/kpc")));
    let c = Config::from_lookup(env(&[("XDG_CACHE_HOME", "/xdg"), ("HOME", "/h")])).unwrap();
    assert_eq!(c.cache_dir, Some(PathBuf::from("/xdg/kpc")));
    // A relative XDG_CACHE_HOME is ignored, per the XDG spec.
    let c = Config::from_lookup(env(&[("XDG_CACHE_HOME", "rel"), ("HOME", "/h")])).unwrap();
    assert_eq!(c.cache_dir, Some(PathBuf::from("/h/.cache/kpc")));
    let c = Config::from_lookup(env(&[])).unwrap();
    assert_eq!(c.cache_dir, None);
    assert_eq!(c.disk_cache_root(), None);
    let c = Config::from_lookup(env(&[("HOME", "/h"), ("KPC_CACHE_PERSISTENT", "0")])).unwrap();
    assert_eq!(c.disk_cache_root(), None);
    let e = Config::from_lookup(env(&[("KPC_CACHE_DIR", " ")])).unwrap_err();
    assert!(e.to_string().contains("KPC_CACHE_DIR"), "{e}");
}

#[test]
fn sizes() {
    let p = |s| parse_size("V", s);
    assert_eq!(p("0").unwrap(), 0);
    assert_eq!(p("4096").unwrap(), 4096);
    assert_eq!(p("512K").unwrap(), 512 << 10);
    assert_eq!(p("512k").unwrap(), 512 << 10);
    assert_eq!(p("3M").unwrap(), 3 << 20);
    assert_eq!(p("1G").unwrap(), GIB);
    assert_eq!(p("1GiB").unwrap(), GIB);
    assert_eq!(p("2 MiB").unwrap(), 2 << 20);
    assert_eq!(p("1T").unwrap(), 1 << 40);
    for bad in [
        "",
        "G",
        "-1",
        "1.5G",
        "1X",
        "99999999999999999999",
        "16777216T",
    ] {
        let e = p(bad).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("V=") && msg.contains("expected"),
            "{bad}: {msg}"
        );
    }
}

#[test]
fn durations() {
    let p = |s| parse_duration("V", s);
    assert_eq!(p("30s").unwrap(), Duration::from_secs(30));
    assert_eq!(p("30").unwrap(), Duration::from_secs(30));
    assert_eq!(p("500ms").unwrap(), Duration::from_millis(500));
    assert_eq!(p("2m").unwrap(), Duration::from_secs(120));
    assert_eq!(p("0").unwrap(), Duration::ZERO);
    for bad in ["", "s", "-1s", "3 weeks", "1e999", "nan"] {
        assert!(p(bad).is_err(), "{bad}");
    }
}

#[test]
fn every_malformed_variable_is_named_in_its_error() {
    for (var, bad) in [
        ("KPC_CACHE_PERSISTENT", "maybe"),
        ("KPC_CACHE_IN_MEM", "2"),
        ("KPC_CACHE_MAX_SIZE", "lots"),
        ("KPC_CACHE_MIN_DEVICE_IMAGE_SIZE", "1Q"),
        ("KPC_CACHE_MAX_DEVICE_IMAGE_SIZE", "-5"),
        ("KPC_IN_MEM_CACHE_EVICTION_THRESHOLD", "1.5M"),
        ("KPC_CACHE_LOCK_TIMEOUT", "forever"),
        ("KPC_CACHE_TRACE", "8"),
        ("KPC_CACHE_TRACE", "disk"),
        ("KPC_CACHE_DEBUG", "2"),
        ("KPC_CACHE_DEBUG", "verbose"),
        ("KPC_DEVICE", "cuda:0"),
        ("KPC_DEVICE", "vulkan:fast"),
        ("KPC_CACHE_SEAL", "strict"),
    ] {
        let e = Config::from_lookup(env(&[(var, bad)])).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains(var) && msg.contains(bad) && msg.contains("expected"),
            "{var}={bad}: {msg}"
        );
    }
}

#[test]
fn min_above_max_is_rejected() {
    let e = Config::from_lookup(env(&[
        ("KPC_CACHE_MIN_DEVICE_IMAGE_SIZE", "2M"),
        ("KPC_CACHE_MAX_DEVICE_IMAGE_SIZE", "1M"),
    ]))
    .unwrap_err();
    assert!(matches!(e, ConfigError::Inconsistent(_)));
    assert!(e.to_string().contains("KPC_CACHE_MIN_DEVICE_IMAGE_SIZE"));
}

#[test]
fn values_are_applied() {
    let c = Config::from_lookup(env(&[
        ("KPC_CACHE_PERSISTENT", "off"),
        ("KPC_CACHE_IN_MEM", "0"),
        ("KPC_CACHE_MAX_SIZE", "0"),
        ("KPC_IN_MEM_CACHE_EVICTION_THRESHOLD", "64K"),
        ("KPC_CACHE_LOCK_TIMEOUT", "250ms"),
        ("KPC_CACHE_TRACE", "0x5"),
        ("KPC_CACHE_DEBUG", "1"),
        ("KPC_DEVICE", "opencl:1"),
    ]))
    .unwrap();
    assert!(c.cache_debug);
    assert!(!c.persistent && !c.in_mem);
    assert_eq!(c.max_size, 0);
    assert_eq!(c.in_mem_eviction_threshold, 64 << 10);
    assert_eq!(c.lock_timeout, Duration::from_millis(250));
    assert!(c.trace.contains(TraceFlags::DISK) && c.trace.contains(TraceFlags::BUILDS));
    assert!(!c.trace.contains(TraceFlags::MEMORY));
    assert_eq!(
        c.device,
        DeviceSelector::Index(Some(BackendKind::OpenCl), 1)
    );
}

#[test]
fn device_selectors_round_trip() {
    for s in [
        "auto",
        "vulkan:0",
        "vulkan:gpu",
        "opencl:1",
        "any:cpu",
        "vulkan:discrete",
    ] {
        assert_eq!(DeviceSelector::parse(s).unwrap().to_string(), s);
    }
}

#[test]
fn non_utf8_value_is_an_error() {
    use std::os::unix::ffi::OsStringExt;
    let e = Config::from_lookup(|k| {
        (k == "KPC_CACHE_MAX_SIZE").then(|| OsString::from_vec(vec![0x31, 0xff]))
    })
    .unwrap_err();
    assert!(e.to_string().contains("KPC_CACHE_MAX_SIZE"));
    // A cache root is a path, and paths may be any bytes.
    let c = Config::from_lookup(|k| {
        (k == "KPC_CACHE_DIR").then(|| OsString::from_vec(vec![b'/', 0x66, 0xff]))
    })
    .unwrap();
    assert!(c.cache_dir.is_some());
}

#[test]
fn a_selector_error_names_the_variable_only_when_it_came_from_one() {
    let code = DeviceSelector::parse("vulkan:fast")
        .unwrap_err()
        .to_string();
    assert!(
        code.starts_with("device selector \"vulkan:fast\" is not valid")
            && !code.contains("KPC_DEVICE"),
        "{code}"
    );
    let env = Config::from_lookup(|n| (n == "KPC_DEVICE").then(|| "vulkan:fast".into()))
        .unwrap_err()
        .to_string();
    assert!(
        env.starts_with("KPC_DEVICE=\"vulkan:fast\" is not valid"),
        "{env}"
    );
}
