#!/usr/bin/env bash
# Times what a newcomer waits for on a fresh machine (issue 15), on a fresh clone of this checkout's
# HEAD with an empty target directory and empty driver caches (a new XDG_CACHE_HOME: Mesa's shader
# cache, PoCL's kernel cache and kpc's own cache all start empty):
#   1. scripts/main.sh, end to end, then its phases separately (apt via scripts/setup.sh, the release
#      build with cargo's --timings, the library alone, `kpc attention --check`);
#   2. scripts/test.sh, end to end, with each test binary's own time and the loom models'.
# The crates.io download is included (cargo's registry cache is kept; a fresh machine also fetches
# the crates, which here took seconds). Apt is timed as installed: run `scripts/fresh-timings.sh
# --purge` to remove the packages setup.sh installs first, so that their install is timed too.
# Usage: scripts/fresh-timings.sh [--purge]   (prints a table; the logs stay in the printed folder)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/kpc-fresh.XXXXXX)
export XDG_CACHE_HOME="$work/xdg-cache"
mkdir -p "$XDG_CACHE_HOME"
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }
row() { printf '| %s | %s |\n' "$1" "$2" | tee -a "$work/table.md"; }

if [ "${1:-}" = "--purge" ]; then
  pkgs=$(grep -o '^pkgs=(.*' "$src/scripts/setup.sh" -A3 | tr -d '()' | sed 's/pkgs=//' | tr '\n' ' ')
  # build-essential, python3, curl and ca-certificates stay: this script and git need them.
  purge=$(for p in $pkgs; do case $p in build-essential|python3|curl|ca-certificates|pkg-config) ;; *) echo "$p" ;; esac; done)
  DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq $purge >/dev/null 2>&1 || true
  apt-get autoremove -y -qq >/dev/null 2>&1 || true
fi

git clone -q "$src" "$work/kpc"
cd "$work/kpc"
echo "fresh clone of $(git rev-parse --short HEAD) in $work/kpc" | tee "$work/table.md"
row "phase" "seconds"
row "---" "---"

# 1. The main job, as a newcomer runs it.
t=$(now); ./scripts/main.sh > "$work/main.log" 2>&1; row "scripts/main.sh (apt, build, kpc attention --check)" "$(since "$t")"
grep -q "^check: .*: ok$" "$work/main.log" || { echo "main.sh did not print a passing check; see $work/main.log" >&2; exit 1; }

# Its phases, measured again separately from an empty target directory (apt now has nothing to do
# unless --purge ran above, which the main.sh row already paid).
rm -rf target
t=$(now); bash -c '. scripts/setup.sh' > "$work/apt.log" 2>&1; row "  apt (scripts/setup.sh, packages present)" "$(since "$t")"
t=$(now); cargo build --release --timings > "$work/build.log" 2>&1; row "  cargo build --release (empty target)" "$(since "$t")"
python3 - "$work" <<'EOF' | tee -a "$work/table.md"
import glob, json, re, sys
f = sorted(glob.glob('target/cargo-timings/cargo-timing-*.html'))[-1]
units = json.loads(re.search(r'const UNIT_DATA = (\[.*?\]);', open(f).read(), re.S).group(1))
units.sort(key=lambda u: -u['duration'])
for u in units[:5]:
    what = u['name'] + (' (' + u['target'].strip() + ')' if u.get('target', '').strip() else '')
    print(f"|     {what} | {u['duration']:.1f} |")
EOF
# What an embedder pays: the library alone with its default features, from an empty target directory.
t=$(now); CARGO_TARGET_DIR="$work/lib-target" cargo build --release -p kpc > "$work/lib-build.log" 2>&1; row "  cargo build --release -p kpc (the library alone, default features, empty target)" "$(since "$t")"
rm -rf "$work/lib-target"
# main.sh's run filled the caches under XDG_CACHE_HOME; the first run is timed with empty ones again.
export XDG_CACHE_HOME="$work/xdg-cache-2"; mkdir -p "$XDG_CACHE_HOME"
t=$(now); target/release/kpc attention --check > "$work/attention.log" 2>&1; row "  kpc attention --check (first run, cold caches)" "$(since "$t")"
t=$(now); target/release/kpc attention --check > "$work/attention2.log" 2>&1; row "  kpc attention --check (second run: kernels from disk)" "$(since "$t")"
export XDG_CACHE_HOME="$work/xdg-cache-3"; mkdir -p "$XDG_CACHE_HOME"

# 2. Every test, as CI runs it.
t=$(now); ./scripts/test.sh > "$work/test.log" 2>&1; row "scripts/test.sh (build tests, run all, loom)" "$(since "$t")"
python3 - "$work/test.log" <<'EOF' | tee -a "$work/table.md"
import re, sys
name = None
for line in open(sys.argv[1], errors='replace'):
    m = re.match(r'\s+Running (\S+)', line)
    if m:
        name = m.group(1)
        continue
    m = re.match(r'test result: \w+\. (\d+) passed.*finished in ([\d.]+)s', line)
    if m and name:
        print(f"|   {name} ({m.group(1)} tests) | {float(m.group(2)):.1f} |")
        name = None
EOF
echo "logs: $work"
