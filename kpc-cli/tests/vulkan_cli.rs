//! The `kpc` command's Vulkan parts, run as a user runs them.

// The support code all of the workspace's integration tests share.
use crate::common;

use std::process::Command;

fn kpc() -> Command {
    let mut c = common::cli::kpc_command();
    c.env_remove("KPC_DEVICE").env("KPC_CACHE_PERSISTENT", "0");
    c
}

#[test]
fn kpc_devices_lists_the_vulkan_device_with_its_fingerprint() {
    let Some(d) =
        common::drivers::vulkan_device("kpc_devices_lists_the_vulkan_device_with_its_fingerprint")
    else {
        return;
    };
    let out = kpc().arg("devices").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(&format!("vulkan:{}  {}", d.index, d.name)),
        "{text}"
    );
    assert!(text.contains(&d.fingerprint.digest.to_hex()), "{text}");
    for field in [
        "vendor_id",
        "device_id",
        "driver_version",
        "driver_id",
        "driver_name",
        "pipeline_cache_uuid",
        "api_version",
    ] {
        assert!(text.contains(field), "{field} missing:\n{text}");
    }
    assert!(text.contains("KPC_DEVICE selects this"), "{text}");
}

#[test]
fn no_vulkan_driver_is_a_clear_error_not_a_panic() {
    // Point the loader at no driver at all (works whether or not one is installed).
    let out = kpc()
        .arg("devices")
        .env("VK_ICD_FILENAMES", "/nonexistent/kpc-no-driver.json")
        .env("VK_DRIVER_FILES", "/nonexistent/kpc-no-driver.json")
        // Hide OpenCL too, or `auto` would select an OpenCL device.
        .env("OCL_ICD_VENDORS", "/nonexistent/kpc-no-icd")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("Vulkan unavailable: "), "{text}\n{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!out.status.success(), "no device can be selected");
    let out = kpc()
        .arg("devices")
        .env("KPC_DEVICE", "vulkan:0")
        .env("VK_ICD_FILENAMES", "/nonexistent/kpc-no-driver.json")
        .env("VK_DRIVER_FILES", "/nonexistent/kpc-no-driver.json")
        // Hide OpenCL too, or `auto` would select an OpenCL device.
        .env("OCL_ICD_VENDORS", "/nonexistent/kpc-no-icd")
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("KPC_DEVICE=vulkan:0: Vulkan unavailable")
    );
}

#[test]
fn kpc_bench_build_prints_a_row_per_kernel() {
    let Some(_) = common::drivers::vulkan_device("kpc_bench_build_prints_a_row_per_kernel") else {
        return;
    };
    let out = kpc().args(["bench-build"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for k in kpc::kernels::SPIRV
        .iter()
        .chain(kpc_attention::kernels::SPIRV)
    {
        let row = text
            .lines()
            .find(|l| l.starts_with(k.name))
            .unwrap_or_else(|| panic!("no row for {}:\n{text}", k.name));
        assert!(!row.contains("failed"), "{row}");
        // Only a kernel the device cannot run may be skipped, and only for that reason.
        if row.contains("skipped") {
            assert!(
                k.cooperative_matrix && row.contains("cooperative matrices"),
                "{row}"
            );
        }
    }
}
