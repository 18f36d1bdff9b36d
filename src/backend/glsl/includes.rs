//! Where a GLSL image's `#include`s come from: a resolver the embedder supplies, or one of the two
//! here (a directory, a map of names to text).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Component, Path, PathBuf};

/// One resolved `#include`: the name it is known by from now on (nested includes are relative to it,
/// `#line` directives cite it) and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedInclude {
    /// The resolved name, e.g. a path.
    pub name: String,
    /// The included text.
    pub content: String,
}

/// Resolves `#include` directives of GLSL images.
///
/// Contract: for the same arguments and the same underlying files it returns the same text. It is
/// asked once per include when the image is first used; what it returned is hashed into the SPIR-V
/// cache key, so a changed file changes the key (for images made afterwards).
pub trait IncludeResolver: Send + Sync + fmt::Debug {
    /// The text of `requested` as included from `requesting` (the image's name, or an earlier
    /// [`ResolvedInclude::name`]); `relative` is true for `#include "x"`, false for `#include <x>`.
    ///
    /// Errors: a message saying why it cannot be resolved; it becomes the compile error.
    fn resolve(
        &self,
        requested: &str,
        requesting: &str,
        relative: bool,
    ) -> std::result::Result<ResolvedInclude, String>;
}

/// Includes read from files under one directory. A relative include (`"x"`) is looked up next to the
/// including file first, then at the root; `<x>` at the root only. Paths that leave the root (`..`
/// past it, absolute paths) are refused.
#[derive(Debug, Clone)]
pub struct DirIncludes {
    root: PathBuf,
}

impl DirIncludes {
    /// Includes under `root`.
    pub fn new(root: impl Into<PathBuf>) -> DirIncludes {
        DirIncludes { root: root.into() }
    }

    fn inside(rel: &Path) -> Option<PathBuf> {
        let mut out = PathBuf::new();
        for c in rel.components() {
            match c {
                Component::Normal(p) => out.push(p),
                Component::CurDir => {}
                Component::ParentDir => {
                    if !out.pop() {
                        return None;
                    }
                }
                _ => return None,
            }
        }
        Some(out)
    }
}

impl IncludeResolver for DirIncludes {
    fn resolve(
        &self,
        requested: &str,
        requesting: &str,
        relative: bool,
    ) -> std::result::Result<ResolvedInclude, String> {
        let mut candidates = Vec::new();
        if relative {
            let dir = Path::new(requesting).parent().unwrap_or(Path::new(""));
            candidates.extend(DirIncludes::inside(&dir.join(requested)));
        }
        candidates.extend(DirIncludes::inside(Path::new(requested)));
        if candidates.is_empty() {
            return Err(format!(
                "include {requested:?} leaves the include directory {}",
                self.root.display()
            ));
        }
        let mut last = String::new();
        for rel in candidates {
            match std::fs::read_to_string(self.root.join(&rel)) {
                Ok(content) => {
                    return Ok(ResolvedInclude {
                        name: rel.to_string_lossy().into_owned(),
                        content,
                    });
                }
                Err(e) => last = format!("{}: {e}", self.root.join(&rel).display()),
            }
        }
        Err(format!("cannot read include {requested:?} ({last})"))
    }
}

/// Includes from a map of names to text (generated shaders, tests). Names are matched exactly.
#[derive(Debug, Clone, Default)]
pub struct MapIncludes {
    files: BTreeMap<String, String>,
}

impl MapIncludes {
    /// An empty map.
    pub fn new() -> MapIncludes {
        MapIncludes::default()
    }
    /// Adds (or replaces) `name` with `text`.
    pub fn with(mut self, name: &str, text: &str) -> MapIncludes {
        self.files.insert(name.to_owned(), text.to_owned());
        self
    }
}

impl IncludeResolver for MapIncludes {
    fn resolve(
        &self,
        requested: &str,
        _requesting: &str,
        _relative: bool,
    ) -> std::result::Result<ResolvedInclude, String> {
        self.files
            .get(requested)
            .map(|c| ResolvedInclude {
                name: requested.to_owned(),
                content: c.clone(),
            })
            .ok_or_else(|| {
                format!(
                    "no include named {requested:?}; there are: {}",
                    self.files.keys().cloned().collect::<Vec<_>>().join(", ")
                )
            })
    }
}
