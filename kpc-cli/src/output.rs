//! How the CLI prints what scripts read.

use serde_json::Value;

/// Pretty JSON on stdout, for `--json`.
pub(crate) fn print_json(v: &Value) {
    outln!(
        "{}",
        serde_json::to_string_pretty(v).expect("a JSON value always serializes")
    );
}
