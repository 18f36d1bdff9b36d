//! The `kpc` command's OpenCL parts, run as a user runs them.

// The support code all of the workspace's integration tests share.
use crate::common;

use std::process::Command;

fn kpc() -> Command {
    let mut c = common::cli::kpc_command();
    c.env_remove("KPC_DEVICE").env("KPC_CACHE_PERSISTENT", "0");
    c
}

#[test]
fn kpc_devices_lists_the_opencl_device_and_opencl_cpu_selects_it() {
    let Some(d) = common::drivers::opencl_device(
        "kpc_devices_lists_the_opencl_device_and_opencl_cpu_selects_it",
    ) else {
        return;
    };
    let selector = if d.device_type == kpc::DeviceType::Cpu {
        "opencl:cpu".to_string()
    } else {
        format!("opencl:{}", d.index)
    };
    let out = kpc()
        .arg("devices")
        .env("KPC_DEVICE", &selector)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = format!("opencl:{}  {}", d.index, d.name);
    let row = text
        .lines()
        .find(|l| l.contains(&line))
        .unwrap_or_else(|| panic!("no row {line:?}:\n{text}"));
    assert!(
        row.contains("KPC_DEVICE selects this"),
        "{selector}: {row}\n{text}"
    );
    assert!(text.contains(&d.fingerprint.digest.to_hex()), "{text}");
    for field in [
        "platform_name",
        "platform_version",
        "device_name",
        "device_version",
        "driver_version",
        "vendor_id",
    ] {
        assert!(text.contains(field), "{field} missing:\n{text}");
    }
}

#[test]
fn no_opencl_icd_is_a_clear_error_not_a_panic() {
    // Point the ICD loader at an empty vendor directory (works whether or not an ICD is installed).
    let out = kpc()
        .arg("devices")
        .env("KPC_DEVICE", "opencl:0")
        .env("OCL_ICD_VENDORS", "/nonexistent/kpc-no-icd")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("opencl: OpenCL unavailable: "),
        "{text}\n{err}"
    );
    assert!(
        text.contains("KPC_DEVICE=opencl:0: OpenCL unavailable"),
        "{text}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(!out.status.success());
}

#[test]
fn kpc_bench_build_measures_opencl_kernels() {
    let Some(d) = common::drivers::opencl_device("kpc_bench_build_measures_opencl_kernels") else {
        return;
    };
    let out = kpc()
        .args(["bench-build", "--kernel", "saxpy"])
        .env("KPC_DEVICE", format!("opencl:{}", d.index))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = text
        .lines()
        .find(|l| l.starts_with("saxpy"))
        .unwrap_or_else(|| panic!("no row for saxpy:\n{text}"));
    assert!(!row.contains("failed"), "{row}");
    assert!(text.contains("POCL_KERNEL_CACHE=0"), "{text}");
}
