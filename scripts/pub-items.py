#!/usr/bin/env python3
# Counts the kpc library's public API items (issue 26): `pub` fns (methods included), structs, enums,
# traits, consts, statics, types and unions defined in modules reachable from the crate root through
# `pub mod`, plus the names that `pub use` statements in those modules export. A text count, not
# rustdoc's: items of crate-private modules count only where re-exported.
# Usage: python3 scripts/pub-items.py [ROOT [MODULE_PATH_TO_SKIP ...]]
#   e.g. at 662a057 (one crate): python3 scripts/pub-items.py . crate::capi crate::bin
import re, sys, os
root = sys.argv[1] if len(sys.argv) > 1 else '.'
skip = set(sys.argv[2:])  # module paths to ignore (e.g. capi, bin in the old layout)
item = re.compile(r'^\s*pub (?:unsafe |async |const )*(fn|struct|enum|trait|const|static|type|union) ([A-Za-z_]\w*)', re.M)
use = re.compile(r'^\s*pub use ([^;]+);', re.M | re.S)
modre = re.compile(r'^\s*(?:#\[[^\]]*\]\s*)*(pub(?:\([^)]*\))? )?mod (\w+)\s*([;{])', re.M)
total = 0
def names_in_use(u):
    u = re.sub(r'\s+', ' ', u)
    if '{' in u:
        inner = u[u.index('{')+1:u.rindex('}')]
        parts = []
        depth = 0; cur = ''
        for ch in inner:
            if ch == '{': depth += 1
            if ch == '}': depth -= 1
            if ch == ',' and depth == 0: parts.append(cur); cur = ''
            else: cur += ch
        parts.append(cur)
        return sum((names_in_use(p) for p in parts if p.strip()), [])
    n = u.strip().split('::')[-1].strip()
    if ' as ' in n: n = n.split(' as ')[-1]
    return [] if n in ('self', '*') else [n]
def visit(path, modpath, public):
    global total
    if not public or modpath in skip: return
    text = open(path).read()
    # drop #[cfg(test)] mod tests { ... } blocks crudely: inline mods are ignored below
    total += len(item.findall(text))
    for u in use.findall(text): total += len(names_in_use(u))
    d = os.path.dirname(path); base = os.path.basename(path)
    sub = d if base in ('lib.rs', 'mod.rs') else os.path.join(d, base[:-3])
    for m in modre.finditer(text):
        vis, name, kind = m.groups()
        if kind != ';': continue
        ispub = vis is not None and vis.strip() == 'pub'
        for cand in (os.path.join(sub, name + '.rs'), os.path.join(sub, name, 'mod.rs')):
            if os.path.exists(cand):
                visit(cand, modpath + '::' + name, ispub); break
visit(os.path.join(root, 'src/lib.rs'), 'crate', True)
print(total)
