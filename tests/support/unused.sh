#!/usr/bin/env bash
# The public items of tests/support/ that no test binary uses: what a
# blanket allow(dead_code) would hide.
#
#   bash tests/support/unused.sh
#
# Each test binary declares support as a public module (tests/*/main.rs),
# so rustc reports none of its public items as dead code: each binary uses
# only a part. For the time of one `cargo clippy` this script declares it
# private in every binary, so that each reports what it does not use, and
# prints what all of them report: an item used by no test. It restores the
# main.rs files itself, and exits with status 1 when it found any.
set -euo pipefail
cd "$(dirname "$0")/../.."

mains=(tests/*/main.rs)
backup=$(mktemp -d)
restore() {
  local m
  for m in "${mains[@]}"; do
    cp "$backup/$(dirname "$m" | tr / _)" "$m"
  done
  rm -rf "$backup"
}
for m in "${mains[@]}"; do
  cp "$m" "$backup/$(dirname "$m" | tr / _)"
done
trap restore EXIT
sed -i 's/^pub mod support;$/mod support;/' "${mains[@]}"
binaries=()
for m in "${mains[@]}"; do
  binaries+=("$(basename "$(dirname "$m")")")
done

cargo clippy -q -p weft-cli --tests --message-format=json -- -W dead_code 2>/dev/null |
  python3 -c '
import json, re, sys
unused_in = {}
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") != "compiler-message":
        continue
    d = m["message"]
    spans = [s for s in d["spans"] if s["is_primary"]]
    if not spans or "never" not in d["message"]:
        continue
    # tests/<binary>/../support/x.rs: the same place in every binary.
    where = re.sub(r"^.*support/", "tests/support/", spans[0]["file_name"])
    unused_in.setdefault(m["target"]["name"], set()).add(
        (where, spans[0]["line_start"], d["message"]))
names = sys.argv[1:]
everywhere = set.intersection(*(unused_in.get(n, set()) for n in names))
for where, line, message in sorted(everywhere):
    print(f"{where}:{line}: {message} (in every test binary)")
sys.exit(1 if everywhere else 0)
' "${binaries[@]}"
