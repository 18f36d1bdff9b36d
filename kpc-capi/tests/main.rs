//! The C API's tests, one binary: C programs compiled with `cc` against the built library and
//! header, and the committed header checked against cbindgen.

#[path = "../../tests/common/mod.rs"]
mod common;

mod capi_c;
mod capi_header;
