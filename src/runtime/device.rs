//! Platform and device discovery across backends, and `KPC_DEVICE` selection.
//!
//! A platform is one backend as this machine has it: its devices, or why it cannot be used. Adding a
//! backend means adding it to [`platforms`] and to `ContextBuilder::build`; nothing else here changes.

use crate::backend::{DeviceInfo, DeviceType};
use crate::config::{BackendKind, DeviceClass, DeviceSelector};
use crate::error::{Error, Result};

/// One backend on this machine, as [`platforms`] found it when called (not cached: a later call
/// enumerates again).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Platform {
    /// The backend.
    pub backend: BackendKind,
    /// Its devices in enumeration order, or why the backend is unavailable (no loader, no driver, no
    /// device).
    pub devices: Result<Vec<DeviceInfo>>,
}

/// Every backend compiled into kpc, in preference order (Vulkan, then OpenCL), each with its devices
/// or the reason it is unavailable. Never fails: an unavailable backend is reported, not an error.
pub fn platforms() -> Vec<Platform> {
    vec![
        Platform {
            backend: BackendKind::Vulkan,
            devices: crate::backend::vulkan::devices(),
        },
        Platform {
            backend: BackendKind::OpenCl,
            devices: crate::backend::opencl::devices(),
        },
    ]
}

/// The fingerprint the cache keys `device`'s entries by. Discovery's, except for a Vulkan device
/// that persists pipeline binaries: its fingerprint adds the driver's global pipeline key, which
/// only an opened device gives, so it is opened (see `VulkanBackend::cache_fingerprint`).
///
/// Errors: as opening the device.
pub fn cache_fingerprint(
    device: &DeviceInfo,
    config: &crate::Config,
) -> Result<crate::backend::DeviceFingerprint> {
    match device.backend {
        BackendKind::Vulkan => {
            crate::backend::vulkan::VulkanBackend::cache_fingerprint(device.index, config)
        }
        BackendKind::OpenCl => Ok(device.fingerprint.clone()),
    }
}

/// The device `selector` names among [`platforms`].
///
/// Errors: [`Error::NoSuchDevice`] listing the devices that exist when none matches;
/// [`Error::Unavailable`] when the selector names one backend and it is unavailable, or names a
/// device kpc cannot run on.
pub fn select_device(selector: &DeviceSelector) -> Result<DeviceInfo> {
    select_from(selector, &platforms())
}

fn class_rank(t: DeviceType) -> u8 {
    match t {
        DeviceType::DiscreteGpu => 0,
        DeviceType::IntegratedGpu => 1,
        DeviceType::VirtualGpu => 2,
        DeviceType::Cpu => 3,
        DeviceType::Other => 4,
    }
}

fn matches_class(t: DeviceType, c: DeviceClass) -> bool {
    match c {
        DeviceClass::Gpu => t.is_gpu(),
        DeviceClass::Discrete => t == DeviceType::DiscreteGpu,
        DeviceClass::Integrated => t == DeviceType::IntegratedGpu,
        DeviceClass::Cpu => t == DeviceType::Cpu,
    }
}

/// A line per device and per unavailable backend: what an error shows as "available".
pub fn describe_platforms(platforms: &[Platform]) -> String {
    let mut lines = Vec::new();
    for p in platforms {
        match &p.devices {
            Ok(devs) => {
                for d in devs {
                    let note = d
                        .unusable
                        .as_ref()
                        .map_or(String::new(), |u| format!(" (unusable: {u})"));
                    lines.push(format!(
                        "{}:{} {} [{}]{note}",
                        d.backend, d.index, d.name, d.device_type
                    ));
                }
            }
            Err(e) => lines.push(format!("{}: {e}", p.backend)),
        }
    }
    if lines.is_empty() {
        "none".into()
    } else {
        lines.join("\n")
    }
}

/// [`select_device`] over a given list of platforms: the selection rule itself.
///
/// - `auto`: a discrete GPU, else an integrated, else a virtual GPU, else a CPU device, else anything;
///   ties go to the earlier backend (Vulkan before OpenCL), then the lower index.
/// - `BACKEND:N`: the N-th device of that backend (`any:N`: of all backends, in order).
/// - `BACKEND:CLASS`: the first device of the class (`gpu`: discrete first, then integrated, then
///   virtual), by the same tie rule.
///
/// Devices kpc cannot run on are skipped by `auto` and classes; naming one by index is an error that
/// says why.
pub fn select_from(selector: &DeviceSelector, platforms: &[Platform]) -> Result<DeviceInfo> {
    let restrict = match selector {
        DeviceSelector::Auto => None,
        DeviceSelector::Index(b, _) | DeviceSelector::Class(b, _) => *b,
    };
    // A backend named explicitly but unavailable: say why, rather than "no such device".
    if let Some(b) = restrict {
        match platforms.iter().find(|p| p.backend == b) {
            Some(Platform {
                devices: Err(e), ..
            }) => return Err(e.clone()),
            None => {
                return Err(Error::Unavailable {
                    backend: b,
                    reason: "this build of kpc does not include it".into(),
                });
            }
            _ => {}
        }
    }
    let candidates: Vec<&DeviceInfo> = platforms
        .iter()
        .filter(|p| restrict.is_none_or(|b| b == p.backend))
        .filter_map(|p| p.devices.as_ref().ok())
        .flatten()
        .collect();
    let no_match = || Error::NoSuchDevice {
        selector: selector.to_string(),
        available: describe_platforms(platforms),
    };
    let usable = || candidates.iter().copied().filter(|d| d.unusable.is_none());
    let picked = match selector {
        DeviceSelector::Auto => usable().min_by_key(|d| class_rank(d.device_type)),
        DeviceSelector::Index(_, i) => {
            let d = candidates.get(*i).copied().ok_or_else(no_match)?;
            if let Some(why) = &d.unusable {
                return Err(Error::Unavailable {
                    backend: d.backend,
                    reason: format!("device {} ({}) cannot be used: {why}", d.index, d.name),
                });
            }
            Some(d)
        }
        DeviceSelector::Class(_, c) => usable()
            .filter(|d| matches_class(d.device_type, *c))
            .min_by_key(|d| class_rank(d.device_type)),
    };
    picked.cloned().ok_or_else(no_match)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{DeviceFingerprint, DeviceLimits};

    fn dev(backend: BackendKind, index: usize, t: DeviceType) -> DeviceInfo {
        DeviceInfo {
            backend,
            index,
            name: format!("{backend}{index}"),
            device_type: t,
            driver: "d".into(),
            api_version: "1".into(),
            fingerprint: DeviceFingerprint::new(backend, vec![]),
            limits: DeviceLimits::default(),
            unusable: None,
        }
    }

    fn world() -> Vec<Platform> {
        use BackendKind::*;
        use DeviceType::*;
        vec![
            Platform {
                backend: Vulkan,
                devices: Ok(vec![dev(Vulkan, 0, Cpu), dev(Vulkan, 1, IntegratedGpu)]),
            },
            Platform {
                backend: OpenCl,
                devices: Ok(vec![dev(OpenCl, 0, Cpu), dev(OpenCl, 1, DiscreteGpu)]),
            },
        ]
    }

    fn pick(s: &str, w: &[Platform]) -> Result<String> {
        select_from(&DeviceSelector::parse(s).unwrap(), w).map(|d| d.name)
    }

    #[test]
    fn auto_prefers_discrete_then_gpu_then_cpu() {
        let mut w = world();
        assert_eq!(pick("auto", &w).unwrap(), "opencl1");
        w[1].devices = Ok(vec![dev(BackendKind::OpenCl, 0, DeviceType::Cpu)]);
        assert_eq!(pick("auto", &w).unwrap(), "vulkan1");
        w[0].devices = Ok(vec![dev(BackendKind::Vulkan, 0, DeviceType::Cpu)]);
        assert_eq!(
            pick("auto", &w).unwrap(),
            "vulkan0",
            "CPU ties go to the earlier backend"
        );
    }

    #[test]
    fn index_and_class_selectors() {
        let w = world();
        assert_eq!(pick("vulkan:1", &w).unwrap(), "vulkan1");
        assert_eq!(pick("opencl:0", &w).unwrap(), "opencl0");
        assert_eq!(pick("any:2", &w).unwrap(), "opencl0");
        assert_eq!(pick("vulkan:gpu", &w).unwrap(), "vulkan1");
        assert_eq!(pick("any:gpu", &w).unwrap(), "opencl1");
        assert_eq!(pick("vulkan:cpu", &w).unwrap(), "vulkan0");
        assert!(matches!(
            pick("vulkan:discrete", &w),
            Err(Error::NoSuchDevice { .. })
        ));
        let e = pick("vulkan:7", &w).unwrap_err();
        assert!(e.to_string().contains("vulkan:1 vulkan1"), "{e}");
    }

    #[test]
    fn unusable_and_unavailable() {
        let mut w = world();
        w[0].devices.as_mut().unwrap()[1].unusable = Some("too old".into());
        assert_eq!(pick("vulkan:gpu", &w).ok(), None);
        assert!(
            pick("vulkan:1", &w)
                .unwrap_err()
                .to_string()
                .contains("too old")
        );
        w[0].devices = Err(Error::Unavailable {
            backend: BackendKind::Vulkan,
            reason: "no loader".into(),
        });
        let e = pick("vulkan:0", &w).unwrap_err();
        assert_eq!(e.to_string(), "Vulkan unavailable: no loader");
        assert_eq!(pick("auto", &w).unwrap(), "opencl1");
    }
}
