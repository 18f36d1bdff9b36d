//! `kpc devices`: every backend, its devices, their types, driver versions and fingerprints.

use std::process::ExitCode;

use kpc::Config;
use kpc::{platforms, select_device};

pub fn run(config: &Config) -> kpc::Result<ExitCode> {
    let selected = select_device(&config.device);
    for p in platforms() {
        match &p.devices {
            Err(e) => outln!("{}: {e}", p.backend),
            Ok(devs) => {
                outln!("{}: {} device(s)", p.backend, devs.len());
                for d in devs {
                    let mark = match &selected {
                        Ok(s) if s.backend == d.backend && s.index == d.index => {
                            "  <- KPC_DEVICE selects this"
                        }
                        _ => "",
                    };
                    outln!(
                        "  {}:{}  {}  [{}]{mark}",
                        d.backend,
                        d.index,
                        d.name,
                        d.device_type
                    );
                    outln!("    driver       {}", d.driver);
                    outln!("    api          {}", d.api_version);
                    if let Some(why) = &d.unusable {
                        outln!("    unusable     {why}");
                    }
                    let l = &d.limits;
                    outln!(
                        "    limits       workgroup {} invocations {:?}, shared {} KiB, push {} B, subgroup {}, shuffle {}, fp16 storage {}, fp16 math {}, f16 matrix units {} (fp16 sums {}), workgroup-scope matrices (NV cm2) {}, timestamps {}",
                        l.max_workgroup_invocations,
                        l.max_workgroup_size,
                        l.max_shared_memory_bytes / 1024,
                        l.max_push_constant_bytes,
                        l.subgroup_size.map_or("-".to_string(), |s| s.to_string()),
                        l.subgroup_shuffle,
                        l.storage_16bit,
                        l.float16_arithmetic,
                        l.cooperative_matrix_f16,
                        l.cooperative_matrix_f16_acc,
                        match l.cooperative_matrix2_workgroup {
                            0 => "no".to_string(),
                            n => format!("up to {n} invocations"),
                        },
                        l.timestamps
                    );
                    outln!("    fingerprint  {}", d.fingerprint.digest.to_hex());
                    for (k, v) in &d.fingerprint.fields {
                        outln!("      {k:<20} {v}");
                    }
                }
            }
        }
    }
    match selected {
        Ok(_) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            outln!("KPC_DEVICE={}: {e}", config.device);
            Ok(ExitCode::FAILURE)
        }
    }
}
