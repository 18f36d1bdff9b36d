#!/usr/bin/env python3
# Issue 42: every public struct whose fields are all public is #[non_exhaustive] (stats, options,
# features, descriptions: a new field is then not a breaking change), or says in its documentation
# why it is "Exhaustive on purpose" (what the embedder fills in completely: interop handles, the
# launch descriptor, const kernel tables). A public struct here: one the crate root, `admin`,
# `interop` or `kernels` exports. Structs of crate-private modules that public methods return
# without any module exporting them (reports such as `EvictReport`) cannot be named outside the
# crate, hence neither built nor destructured there, and need neither. Prints each offender; exits 1
# if there is any.
# Usage: python3 scripts/exhaustive-structs.py [ROOT]
import os, re, sys
root = sys.argv[1] if len(sys.argv) > 1 else '.'
exported = set()
for f in ('src/lib.rs', 'src/admin.rs', 'src/interop.rs', 'src/kernels.rs'):
    text = open(os.path.join(root, f)).read()
    for u in re.findall(r'pub use ([^;]+);', text, re.S):
        exported.update(re.findall(r'\b([A-Z]\w*)\b', u))
    exported.update(re.findall(r'pub struct (\w+)', text))
struct = re.compile(r'((?:^[ \t]*(?:#\[[^\n]*\]|///[^\n]*)\n)*)^pub struct (\w+)[^{;(]*\{(.*?)^\}', re.M | re.S)
bad = []
for d, _, files in os.walk(os.path.join(root, 'src')):
    for fn in files:
        if not fn.endswith('.rs'):
            continue
        path = os.path.join(d, fn)
        for attrs, name, body in struct.findall(open(path).read()):
            fields = re.findall(r'^    (pub(?:\([^)]*\))? )?\w+:', body, re.M)
            if name not in exported or not fields or not all(v.strip() == 'pub' for v in fields):
                continue
            if 'non_exhaustive' in attrs or 'Exhaustive on purpose' in attrs:
                continue
            bad.append(f'{os.path.relpath(path, root)}: {name}')
for b in sorted(bad):
    print(b)
print(f'exhaustive public structs without a reason: {len(bad)}')
sys.exit(1 if bad else 0)
