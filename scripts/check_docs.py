#!/usr/bin/env python3
"""Checks what the docs state that the repository can confirm.

    python3 scripts/check_docs.py [repository root]    # exit 1 and one line per problem

1. Every page docs/*.md is linked from the index, docs/README.md.
2. Every relative link in README.md and docs/*.md names an existing file, and an anchor
   (#section) names a heading of the linked page (GitHub's heading ids).
3. docs/session.md's "default set (N instances: C on `cpu`, A on `ascend`" equals the
   default list in cmake/LoomSessions.cmake.
4. docs/README.md's "Layers" list has the folders of scripts/check_layers.py, in its order.
"""
import pathlib
import re
import sys

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(text):
    """(line number, line) outside fenced code blocks, with inline code removed."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, re.sub(r"`[^`]*`", "", line)


def slug(heading):
    """GitHub's id of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    ids, seen = set(), {}
    for _, line in prose_lines(path.read_text()):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        k = seen.get(base, 0)
        seen[base] = k + 1
        ids.add(base if k == 0 else f"{base}-{k}")
    return ids


def check_links(root, pages, problems):
    cache = {}
    for page in pages:
        rel = page.relative_to(root)
        for n, line in prose_lines(page.read_text()):
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                path, _, anchor = target.partition("#")
                dest = (page.parent / path).resolve() if path else page.resolve()
                if not dest.exists():
                    problems.append(f"{rel}:{n}: link '{target}': no file {path}")
                    continue
                if anchor and dest.suffix == ".md":
                    if dest not in cache:
                        cache[dest] = anchors(dest)
                    if anchor not in cache[dest]:
                        problems.append(f"{rel}:{n}: link '{target}': {dest.relative_to(root)} has no heading "
                                        f"with id '{anchor}'")


def check_index(root, problems):
    index = root / "docs" / "README.md"
    if not index.exists():
        problems.append("docs/README.md: missing (the index of docs/)")
        return
    linked = set()
    for _, line in prose_lines(index.read_text()):
        for target in LINK.findall(line):
            linked.add((index.parent / target.partition("#")[0]).resolve())
    for page in sorted((root / "docs").glob("*.md")):
        if page.name != "README.md" and page.resolve() not in linked:
            problems.append(f"docs/README.md: does not link docs/{page.name}; add a line for it to the index")


def default_sessions(cmake_text):
    """The entries of _loom_default_sessions: its set(...) and every list(APPEND ...)."""
    text = re.sub(r"#[^\n]*", "", cmake_text)
    blocks = re.findall(r"set\(\s*_loom_default_sessions\b(.*?)\)", text, re.S)
    blocks += re.findall(r"list\(\s*APPEND\s+_loom_default_sessions\b(.*?)\)", text, re.S)
    entry = re.compile(r"^[\w]+/[\w]+/tp\d+pp\d+/(\w+)/[\w]+$")
    devices = []
    for block in blocks:
        for word in block.split():
            m = entry.match(word)
            if m:
                devices.append(m.group(1))
    return devices


def check_instances(root, problems):
    cmake = root / "cmake" / "LoomSessions.cmake"
    doc = root / "docs" / "session.md"
    if not cmake.exists() or not doc.exists():
        return
    devices = default_sessions(cmake.read_text())
    if not devices:
        problems.append("cmake/LoomSessions.cmake: no _loom_default_sessions entries found; "
                        "update scripts/check_docs.py to where the default instances are listed")
        return
    counts = {"all": len(devices), "cpu": devices.count("cpu"), "ascend": devices.count("ascend")}
    m = re.search(r"default set \((\d+) instances: (\d+) on `cpu`, (\d+) on `ascend`", doc.read_text())
    if not m:
        problems.append("docs/session.md: no 'default set (N instances: C on `cpu`, A on `ascend`' sentence; "
                        f"cmake/LoomSessions.cmake has {counts['all']} ({counts['cpu']} cpu, {counts['ascend']} ascend)")
        return
    stated = dict(zip(("all", "cpu", "ascend"), map(int, m.groups())))
    for key in ("all", "cpu", "ascend"):
        if stated[key] != counts[key]:
            problems.append(f"docs/session.md: states {stated[key]} {'' if key == 'all' else key + ' '}instances "
                            f"in the default set; cmake/LoomSessions.cmake lists {counts[key]}")


def check_layers(root, problems):
    script = root / "scripts" / "check_layers.py"
    index = root / "docs" / "README.md"
    if not script.exists() or not index.exists():
        return
    m = re.search(r"LAYERS\s*=\s*\[(.*?)\]", script.read_text(), re.S)
    if not m:
        problems.append("scripts/check_layers.py: no LAYERS list found")
        return
    layers = re.findall(r'"([a-z_0-9]+)"', re.sub(r"#[^\n]*", "", m.group(1)))
    section = re.search(r"^## Layers\s*$(.*?)(?=^## |\Z)", index.read_text(), re.S | re.M)
    if not section:
        problems.append("docs/README.md: no '## Layers' section")
        return
    listed = re.findall(r"^\s*\d+\.\s+`([a-z_0-9]+)`", section.group(1), re.M)
    if listed != layers:
        problems.append(f"docs/README.md: Layers lists {' < '.join(listed)}; scripts/check_layers.py has "
                        f"{' < '.join(layers)}")


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
    root = root.resolve()
    problems = []
    pages = [root / "README.md"] + sorted((root / "docs").glob("*.md"))
    check_index(root, problems)
    check_links(root, [p for p in pages if p.exists()], problems)
    check_instances(root, problems)
    check_layers(root, problems)
    for p in problems:
        print(p)
    if not problems:
        print(f"docs: {len(pages)} pages, links, index, instance count and layers agree with the repository")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
