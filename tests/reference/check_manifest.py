"""Checks that tests/data/MANIFEST.md names the script (or "input") of every file in tests/data.

Usage: python3 tests/reference/check_manifest.py [REPO_ROOT]
The first column of each table row lists paths relative to tests/data, separated by ", ";
"{a,b}" alternatives and "*" wildcards are allowed; a trailing ".xz" of a file is ignored. A solid
archive packs/NAME.tar.xz (tests/reference/pack_fixtures.sh) needs a row itself, and so does each of
its members (paths relative to tests/data), as if it were a file of its own.
Exit 1, naming the files, when a file has no row, a row matches no file, or a row's script is
not in tests/reference/."""
import fnmatch, os, re, sys, tarfile

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
data = os.path.join(root, "tests", "data")
ref = os.path.join(root, "tests", "reference")


def expand(p):
    m = re.search(r"\{([^{}]*)\}", p)
    if not m:
        return [p]
    return [x for alt in m.group(1).split(",") for x in expand(p[:m.start()] + alt + p[m.end():])]


rows = []
for line in open(os.path.join(data, "MANIFEST.md"), encoding="utf-8"):
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if not line.startswith("|") or len(cells) < 3 or cells[0] in ("file", "") or set(cells[0]) <= set("-"):
        continue
    patterns = [re.sub(r"\.xz$", "", x) for p in cells[0].split(", ") for x in expand(p)]
    rows.append((patterns, cells[1]))

files = []
for d, _, names in os.walk(data):
    for n in names:
        rel = os.path.relpath(os.path.join(d, n), data)
        if rel == "MANIFEST.md":
            continue
        if rel.endswith(".tar.xz"):
            with tarfile.open(os.path.join(data, rel), "r:xz") as tf:
                files.extend(m.name for m in tf.getmembers() if m.isfile())
            files.append(rel[:-3])
        else:
            files.append(rel[:-3] if rel.endswith(".xz") else rel)

errors = []
used = set()
for f in sorted(files):
    hits = [i for i, (pats, _) in enumerate(rows) if any(fnmatch.fnmatchcase(f, p) for p in pats)]
    if not hits:
        errors.append(f"tests/data/{f}: no row in tests/data/MANIFEST.md says which script made it")
    used.update(hits)
for i, (pats, script) in enumerate(rows):
    if i not in used:
        errors.append(f"MANIFEST.md row {' '.join(pats)}: matches no file")
    name = script.split()[0]
    if name != "input" and not os.path.isfile(os.path.join(ref, name)):
        errors.append(f"MANIFEST.md row {' '.join(pats)}: script {name} is not in tests/reference/")
for e in errors:
    print(e)
print(f"{len(files)} files, {len(rows)} rows, {len(errors)} problems")
sys.exit(1 if errors else 0)
