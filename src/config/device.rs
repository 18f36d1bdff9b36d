//! Which device a context opens: the `KPC_DEVICE` selector, parsed strictly.

use std::fmt;

use super::{ConfigError, invalid};

const DEVICE_ACCEPTED: &str = "auto, or BACKEND:INDEX or BACKEND:TYPE where BACKEND is vulkan|opencl|any and TYPE is gpu|discrete|integrated|cpu (e.g. vulkan:0, vulkan:gpu, opencl:1, any:cpu)";

/// Which backend a [`DeviceSelector`] restricts to, and which a context runs on. Displayed as in
/// `KPC_DEVICE` (`vulkan`, `opencl`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// Vulkan compute through ash.
    Vulkan,
    /// OpenCL through opencl3.
    OpenCl,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Vulkan => "vulkan",
            BackendKind::OpenCl => "opencl",
        })
    }
}

/// A class of device, as a selector names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceClass {
    /// Any GPU: discrete first, then integrated, then virtual.
    Gpu,
    /// A discrete GPU only.
    Discrete,
    /// An integrated GPU only.
    Integrated,
    /// A CPU device (lavapipe, PoCL).
    Cpu,
}

/// How `KPC_DEVICE` picks a device. Resolving one never opens a device; a selector that names no
/// existing device is [`crate::Error::NoSuchDevice`], listing those that exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DeviceSelector {
    /// Prefer a discrete GPU, then any GPU, then a CPU device, on any backend.
    #[default]
    Auto,
    /// The N-th device of a backend (in that backend's enumeration order), or of all backends.
    Index(Option<BackendKind>, usize),
    /// The first device of a class, on a backend or on any.
    Class(Option<BackendKind>, DeviceClass),
}

impl DeviceSelector {
    /// Parses the `KPC_DEVICE` syntax: `auto`, `vulkan:0`, `vulkan:gpu`, `opencl:cpu`, `any:1`, ...
    /// given in code; a malformed one is [`ConfigError::InvalidValue`] (a "device selector").
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        DeviceSelector::parse_as(s, None)
    }

    /// [`DeviceSelector::parse`] of the value of variable `var`: an error names the variable.
    pub(super) fn parse_var(var: &'static str, s: &str) -> Result<Self, ConfigError> {
        DeviceSelector::parse_as(s, Some(var))
    }

    fn parse_as(s: &str, var: Option<&'static str>) -> Result<Self, ConfigError> {
        let t = s.trim().to_ascii_lowercase();
        if t.is_empty() || t == "auto" {
            return Ok(DeviceSelector::Auto);
        }
        let err = || match var {
            Some(var) => invalid(var, s, DEVICE_ACCEPTED),
            None => ConfigError::InvalidValue {
                what: "device selector",
                value: s.to_owned(),
                accepted: DEVICE_ACCEPTED,
            },
        };
        let (b, rest) = t.split_once(':').ok_or_else(err)?;
        let backend = match b {
            "vulkan" | "vk" => Some(BackendKind::Vulkan),
            "opencl" | "cl" => Some(BackendKind::OpenCl),
            "any" | "*" => None,
            _ => return Err(err()),
        };
        if let Ok(i) = rest.parse::<usize>() {
            return Ok(DeviceSelector::Index(backend, i));
        }
        let class = match rest {
            "gpu" => DeviceClass::Gpu,
            "discrete" | "dgpu" => DeviceClass::Discrete,
            "integrated" | "igpu" => DeviceClass::Integrated,
            "cpu" => DeviceClass::Cpu,
            _ => return Err(err()),
        };
        Ok(DeviceSelector::Class(backend, class))
    }
}

impl fmt::Display for DeviceSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = |b: &Option<BackendKind>| b.map_or("any".to_string(), |b| b.to_string());
        match self {
            DeviceSelector::Auto => f.write_str("auto"),
            DeviceSelector::Index(be, i) => write!(f, "{}:{i}", b(be)),
            DeviceSelector::Class(be, c) => {
                let c = match c {
                    DeviceClass::Gpu => "gpu",
                    DeviceClass::Discrete => "discrete",
                    DeviceClass::Integrated => "integrated",
                    DeviceClass::Cpu => "cpu",
                };
                write!(f, "{}:{c}", b(be))
            }
        }
    }
}
