//! Which Vulkan devices persist pipeline binaries (`KPC_VULKAN_PIPELINE_BINARY`), and the
//! fingerprint fields that say so. The driver's global pipeline key (`vkGetPipelineKeyKHR` without a
//! create info) is one of them (`pipeline_binary_key`), so a driver that can no longer use stored
//! binaries is a clean miss, not a refusal.

use crate::error::{Error, Result};

/// The variable that chooses the Vulkan binary kind.
pub(crate) const VAR: &str = "KPC_VULKAN_PIPELINE_BINARY";

/// What `KPC_VULKAN_PIPELINE_BINARY` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Pipeline binaries where the device has the extension, pipeline-cache data elsewhere (the
    /// default).
    Auto,
    /// Pipeline-cache data on every device.
    Off,
    /// Pipeline binaries; a device without the extension is unusable (for testing the path).
    Require,
}

/// Parses the variable's value (`None`: unset).
///
/// Errors: [`Error::Config`] naming the variable and what it accepts.
pub(crate) fn parse_mode(value: Option<&str>) -> Result<Mode> {
    match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        None | Some("" | "auto") => Ok(Mode::Auto),
        Some("0" | "off" | "false" | "no") => Ok(Mode::Off),
        Some("require") => Ok(Mode::Require),
        Some(_) => Err(Error::Config(crate::config::ConfigError::Invalid {
            var: VAR,
            value: value.unwrap_or_default().to_string(),
            accepted: "auto, off (also 0/false/no) or require",
        })),
    }
}

/// The mode the process's environment asks for.
pub(crate) fn mode_from_env() -> Result<Mode> {
    let v = std::env::var_os(VAR);
    parse_mode(v.as_ref().map(|v| v.to_string_lossy()).as_deref())
}

/// `fp` with the binary kind a device persists (`kpc_vulkan_binary`) and, for pipeline binaries,
/// the driver's global key (`pipeline_binary_key`), as the last fields: a driver whose key changes
/// gets another fingerprint, so entries it cannot use are clean misses, and `kpc cache explain`
/// names the field that differs.
pub(crate) fn fingerprint_for(
    fp: &crate::backend::DeviceFingerprint,
    global_key: Option<&[u8]>,
) -> crate::backend::DeviceFingerprint {
    use super::super::pipeline_cache::{PIPELINE_BINARY_KIND, PIPELINE_CACHE_KIND};
    let mut fields: Vec<(String, String)> = fp
        .fields
        .iter()
        .filter(|(k, _)| k != KIND_FIELD && k != KEY_FIELD)
        .cloned()
        .collect();
    match global_key {
        None => fields.push((KIND_FIELD.into(), PIPELINE_CACHE_KIND.into())),
        Some(key) => {
            fields.push((KIND_FIELD.into(), PIPELINE_BINARY_KIND.into()));
            let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
            fields.push((KEY_FIELD.into(), hex));
        }
    }
    crate::backend::DeviceFingerprint::new(fp.backend, fields)
}

/// The fingerprint field naming the binary kind.
pub(crate) const KIND_FIELD: &str = "kpc_vulkan_binary";
/// The fingerprint field holding the driver's global pipeline key.
pub(crate) const KEY_FIELD: &str = "pipeline_binary_key";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_is_parsed_or_refused_by_name() {
        assert_eq!(parse_mode(None).unwrap(), Mode::Auto);
        assert_eq!(parse_mode(Some(" Auto ")).unwrap(), Mode::Auto);
        assert_eq!(parse_mode(Some("OFF")).unwrap(), Mode::Off);
        assert_eq!(parse_mode(Some("0")).unwrap(), Mode::Off);
        assert_eq!(parse_mode(Some("require")).unwrap(), Mode::Require);
        let e = parse_mode(Some("always")).unwrap_err().to_string();
        assert!(e.contains(VAR) && e.contains("require"), "{e}");
    }

    #[test]
    fn the_fingerprint_names_the_kind_and_the_drivers_key() {
        use crate::backend::DeviceFingerprint;
        use crate::config::BackendKind;
        let discovered = DeviceFingerprint::new(
            BackendKind::Vulkan,
            vec![
                ("vendor_id".into(), "0x10de".into()),
                (KIND_FIELD.into(), "pipeline-binary".into()),
            ],
        );
        let cache = fingerprint_for(&discovered, None);
        let a = fingerprint_for(&discovered, Some(&[1, 2, 3]));
        let b = fingerprint_for(&a, Some(&[1, 2, 4]));
        assert_eq!(
            a.fields,
            vec![
                ("vendor_id".to_string(), "0x10de".to_string()),
                (KIND_FIELD.to_string(), "pipeline-binary".to_string()),
                (KEY_FIELD.to_string(), "010203".to_string()),
            ]
        );
        // Another driver key, another fingerprint; the fields are replaced, never duplicated.
        assert_ne!(a.digest, b.digest);
        assert_eq!(b.fields.len(), 3);
        assert_eq!(
            cache.fields[1],
            (KIND_FIELD.to_string(), "pipeline-cache".to_string())
        );
        assert_eq!(cache.fields.len(), 2);
        // A device that persists pipeline-cache data keeps the fingerprint discovery gave it.
        assert_eq!(fingerprint_for(&cache, None), cache);
    }
}
