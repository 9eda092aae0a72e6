#!/usr/bin/env python3
"""Fails on a cycle between the modules of a crate. Run by ./ops/test.sh; by hand:

    python3 ops/check_cycles.py              # the checkout this file is in
    python3 ops/check_cycles.py --all        # also print the allowed cycles, edge by edge
    python3 ops/check_cycles.py --root DIR --no-allow       # another tree, nothing allowed
    python3 ops/check_cycles.py --root DIR --allow 'c:a,b'  # another tree, its own list

Exits 1 and prints every cycle that is not allowed (below), with one
reference per edge as `file:line`; 0 when none. Python 3 standard library
only, no build.

Why: a module that reaches back into the modules that use it cannot be
read, tested or moved on its own, and the layering each crate's `lib.rs`
describes under `# Layout` stops being true.

What is checked, per crate (a Cargo.toml beside src/lib.rs or src/main.rs;
target/, third_party/ and .git are skipped):

- The top-level modules: a node per `src/x.rs` or `src/x/` (whatever is
  under `src/x/` counts as `x`); the crate root (lib.rs, main.rs) and
  src/bin/ are not nodes. Then, inside every directory module, the same
  among its children (`x::y` for `src/x/y.rs` or `src/x/y/`), and so on
  down; the directory module's own file (mod.rs or x.rs) is not a node.
- An edge a -> b when a file of a names a path that resolves into b:
  `crate::b...`, `super::...` and `self::...` (resolved from the file's
  module and any inline `mod m { }` around the reference), in `use`
  trees (nested braces included: `use crate::{a::{b}, c}` names a and c)
  and in path expressions anywhere in code. A name the parent module
  imports (`pub use b::Thing;` in lib.rs, then `crate::Thing`) resolves
  to b. Bare paths (`b::Thing` after `use crate::b`) are found through
  their `use`. Comments (doc comments with their examples included),
  string and char literals are removed first.
- Test code is left out: every item under `#[cfg(test)]` (a
  `mod tests { }` block, a test-only fn or impl), and modules declared
  `#[cfg(test)] mod x;` (their files are not nodes).
- A cycle is a strongly connected component of more than one node
  (Tarjan). It is allowed when its modules are a subset of one entry of
  ALLOWED for its crate; a note is printed when an entry's cycle is gone
  or smaller, so the entry can be removed or narrowed.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, FrozenSet, Iterable, List, Optional, Set, Tuple

# The cycles that existed when this check was added: a ratchet. This list
# may only shrink. Break a cycle, then remove (or narrow) its entry; never
# add one, and never add a module to one. Each entry: the crate's directory
# (from the repository root) and the modules of the cycle; a module inside a
# directory module is written `parent::child`.
ALLOWED: List[Tuple[str, FrozenSet[str]]] = [
    ("coordinator", frozenset({"cluster", "filtered", "moves", "search"})),
    ("shard-node", frozenset({"admit", "config", "files", "host", "metrics", "search", "snapshots", "writer"})),
    ("shard-node/engine", frozenset({
        "batch_log", "digest", "filter", "index", "locality", "migrate", "plan", "session",
    })),
]

SKIP_DIRS = {"target", "third_party", ".git"}
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
CFG_TEST = re.compile(r"#\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]")
INLINE_MOD = re.compile(r"\bmod\s+(" + IDENT + r")\s*\{")
USE = re.compile(r"(?<![\w$])use\s+")
PATH_EXPR = re.compile(r"(?<![\w:])\$?(crate|super|self)((?:\s*::\s*" + IDENT + r")+)")


# --- Lexing -----------------------------------------------------------------


def strip(text: str) -> str:
    """The text with comments, string and char literals blanked out (every
    character but newlines becomes a space), so offsets and lines stay."""
    out = list(text)
    n = len(text)
    i = 0

    def blank(a: int, b: int) -> None:
        for k in range(a, min(b, n)):
            if out[k] != "\n":
                out[k] = " "

    def ident_char(k: int) -> bool:
        return 0 <= k < n and (text[k].isalnum() or text[k] == "_")

    while i < n:
        c = text[i]
        if c == "/" and i + 1 < n and text[i + 1] == "/":
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif c == "/" and i + 1 < n and text[i + 1] == "*":
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(i, j)
            i = j
        elif c == "r" and not ident_char(i - 1) or (
            c in "bc" and i + 1 < n and text[i + 1] == "r" and not ident_char(i - 1)
        ):
            # A raw string r"..", r#".."#, br#".."#, or just an identifier.
            start = i
            j = i + 1 if c == "r" else i + 2
            hashes = 0
            while j < n and text[j] == "#":
                hashes, j = hashes + 1, j + 1
            if j < n and text[j] == '"':
                end = text.find('"' + "#" * hashes, j + 1)
                end = n if end < 0 else end + 1 + hashes
                blank(start, end)
                i = end
            else:
                i += 1
                while ident_char(i):
                    i += 1
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            blank(i, j + 1)
            i = j + 1
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}', '{') or a lifetime/label.
            if i + 1 < n and text[i + 1] == "\\":
                j = text.find("'", i + 3)  # past the escaped char ('\'' escapes a quote)
                j = n if j < 0 else j
                blank(i, j + 1)
                i = j + 1
            elif i + 2 < n and text[i + 2] == "'":
                blank(i, i + 3)
                i += 3
            else:
                i += 1
        elif ident_char(i):
            while ident_char(i):
                i += 1
        else:
            i += 1
    return "".join(out)


CLOSE = {")": "(", "]": "[", "}": "{"}


def match_close(text: str, i: int) -> int:
    """Index just past the bracket that closes the one at text[i]."""
    depth = 0
    for j in range(i, len(text)):
        ch = text[j]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


def item_end(text: str, i: int) -> int:
    """Where the item (or statement, field, arm) starting at i ends."""
    m = re.compile(r"\s*(?:pub\s*(?:\([^)]*\))?\s*)?(" + IDENT + r")").match(text, i)
    word = m.group(1) if m else ""
    after = text[m.end():m.end() + 40].split() if m else []
    semicolon_only = word in ("use", "static", "let", "type") or (
        word == "const" and not (after and after[0] in ("fn", "unsafe", "async", "extern"))
    ) or (word == "extern" and after and after[0] == "crate")
    # Items may hold commas (`-> Result<A, B>`, `impl<A, B>`); a field, an
    # argument or a match arm ends at one.
    item = semicolon_only or word in (
        "fn", "impl", "struct", "enum", "union", "trait", "mod", "const", "unsafe", "async", "extern",
        "macro_rules",
    )
    depth = 0
    j = i
    n = len(text)
    while j < n:
        ch = text[j]
        if ch in "([":
            depth += 1
        elif ch in ")]":
            if depth == 0:
                return j
            depth -= 1
        elif ch == "{":
            if depth == 0 and not semicolon_only:
                return match_close(text, j)
            j = match_close(text, j)
            continue
        elif ch == "}":
            return j
        elif ch == ";" and depth == 0:
            return j + 1
        elif ch == "," and depth == 0 and not item:
            return j
        j += 1
    return n


def drop_test_items(clean: str) -> Tuple[str, Set[str]]:
    """The code without the items under `#[cfg(test)]`, and the names of
    the modules declared `#[cfg(test)] mod x;` (whose files are tests)."""
    out = list(clean)
    test_mods: Set[str] = set()
    pos = 0
    while True:
        m = CFG_TEST.search(clean, pos)
        if not m:
            break
        j = m.end()
        while True:  # further attributes on the same item
            k = j
            while k < len(clean) and clean[k].isspace():
                k += 1
            if clean.startswith("#", k) and "[" in clean[k:k + 3]:
                j = match_close(clean, clean.index("[", k))
            else:
                j = k
                break
        end = item_end(clean, j)
        decl = re.compile(r"(?:pub\s*(?:\([^)]*\))?\s*)?mod\s+(" + IDENT + r")\s*;").match(clean, j)
        if decl:
            test_mods.add(decl.group(1))
        for k in range(m.start(), end):
            if out[k] != "\n":
                out[k] = " "
        pos = max(end, m.end())
    return "".join(out), test_mods


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


# --- Paths ------------------------------------------------------------------

TOKEN = re.compile(r"\s*(::|\{|\}|,|\*|;|as\b|" + IDENT + r")")


def parse_use_tree(text: str, i: int) -> Tuple[List[Tuple[List[str], int, str]], int]:
    """The paths of the use tree starting at i: (segments, offset of the
    last segment, the name it is visible as), and where the tree ends."""
    paths: List[Tuple[List[str], int, str]] = []

    def tree(j: int, prefix: List[str], at: int) -> int:
        segs = list(prefix)
        last = at
        while True:
            m = TOKEN.match(text, j)
            if not m:
                return j
            tok = m.group(1)
            if tok == "::":
                j = m.end()
            elif tok == "{":
                j = m.end()
                while True:
                    m2 = TOKEN.match(text, j)
                    if not m2:
                        return j
                    if m2.group(1) == "}":
                        return m2.end()
                    if m2.group(1) == ",":
                        j = m2.end()
                        continue
                    j = tree(j, segs, last)
            elif tok == "*":
                paths.append((segs, last, "*"))
                return m.end()
            elif tok in (",", "}", ";"):
                if len(segs) > len(prefix):
                    paths.append((segs, last, segs[-1]))
                return j
            elif tok == "as":
                m2 = TOKEN.match(text, m.end())
                alias = m2.group(1) if m2 else "_"
                paths.append((segs, last, alias))
                return m2.end() if m2 else m.end()
            elif tok == "self" and len(segs) == len(prefix) and prefix:
                # `a::{self, ..}`: the prefix itself.
                j = m.end()
                m2 = TOKEN.match(text, j)
                if m2 and m2.group(1) == "as":
                    m3 = TOKEN.match(text, m2.end())
                    paths.append((segs, last, m3.group(1) if m3 else "_"))
                    return m3.end() if m3 else m2.end()
                paths.append((segs, last, segs[-1]))
                return j
            else:
                segs = segs + [tok]
                last = m.start(1)
                j = m.end()

    end = tree(i, [], i)
    return paths, end


def resolve(segs: List[str], module: List[str], children_here: Set[str]) -> Optional[List[str]]:
    """An absolute module path from the crate root, or None for a path into
    another crate (or one this check cannot follow)."""
    if not segs:
        return None
    head = segs[0]
    if head in ("crate", "$crate"):
        base: List[str] = []
        rest = segs[1:]
    elif head in ("super", "self"):
        base = list(module)
        rest = segs
        while rest and rest[0] in ("super", "self"):
            if rest[0] == "super":
                if not base:
                    return None
                base = base[:-1]
            rest = rest[1:]
    elif head in children_here:
        base, rest = list(module), segs  # 2018 path to a child module
    else:
        return None
    return base + [s for s in rest if s not in ("self", "*")]


# --- The crate --------------------------------------------------------------


@dataclass
class Reference:
    path: List[str]  # absolute, from the crate root
    module: List[str]  # the module of the file it is in
    file: str
    line: int


@dataclass
class ModuleFile:
    rel: str
    module: List[str]
    clean: str
    refs: List[Reference] = field(default_factory=list)
    imports: Dict[str, Optional[List[str]]] = field(default_factory=dict)  # name -> absolute path (None: another crate)


class Crate:
    def __init__(self, root: Path, crate_dir: Path):
        self.root = root
        self.dir = crate_dir
        self.name = crate_dir.relative_to(root).as_posix() or "."
        self.src = crate_dir / "src"
        self.files: Dict[Tuple[str, ...], ModuleFile] = {}
        self.children: Dict[Tuple[str, ...], Set[str]] = {}
        root_file = self.src / "lib.rs"
        if not root_file.exists():
            root_file = self.src / "main.rs"
        self.load(root_file, [], top=True)

    def load(self, path: Path, module: List[str], top: bool = False) -> None:
        text = path.read_text(encoding="utf-8", errors="replace")
        clean, test_mods = drop_test_items(strip(text))
        mf = ModuleFile(path.relative_to(self.root).as_posix(), module, clean)
        self.files[tuple(module)] = mf
        # Children: x.rs or x/ beside (for the root, mod.rs) or under x/.
        if top or path.name == "mod.rs":
            sub = path.parent
        else:
            sub = path.parent / path.stem
        kids: Dict[str, Path] = {}
        if sub.is_dir():
            for entry in sorted(sub.iterdir()):
                if top and entry.name in ("lib.rs", "main.rs", "bin"):
                    continue
                if entry.is_file() and entry.suffix == ".rs" and entry.name != "mod.rs":
                    kids.setdefault(entry.stem, entry)
                elif entry.is_dir():
                    if (entry / "mod.rs").exists():
                        kids[entry.name] = entry / "mod.rs"
                    elif (sub / (entry.name + ".rs")).exists():
                        kids[entry.name] = sub / (entry.name + ".rs")
        for name in test_mods:
            kids.pop(name, None)
        self.children[tuple(module)] = set(kids)
        self.scan(mf)
        for name, p in sorted(kids.items()):
            self.load(p, module + [name])

    def scan(self, mf: ModuleFile) -> None:
        clean = mf.clean
        mods: List[Tuple[int, int, str]] = []
        for m in INLINE_MOD.finditer(clean):
            mods.append((m.end() - 1, match_close(clean, m.end() - 1), m.group(1)))

        def module_at(offset: int) -> List[str]:
            return mf.module + [name for a, b, name in mods if a < offset < b]

        kids = self.children.get(tuple(mf.module), set())
        used: List[Tuple[int, int]] = []
        for m in USE.finditer(clean):
            paths, end = parse_use_tree(clean, m.end())
            used.append((m.start(), end))
            at_top = not any(a < m.start() < b for a, b, _ in mods) and depth_at(clean, m.start()) == 0
            here = module_at(m.start())
            for segs, off, name in paths:
                absolute = resolve(segs, here, kids if here == mf.module else set())
                if at_top and name not in ("*", "_"):
                    mf.imports[name] = absolute
                if absolute is not None:
                    mf.refs.append(Reference(absolute, here, mf.rel, line_of(clean, off)))
        for m in PATH_EXPR.finditer(clean):
            if any(a <= m.start() < b for a, b in used):
                continue
            segs = [m.group(1)] + [s.strip() for s in m.group(2).split("::") if s.strip()]
            here = module_at(m.start())
            absolute = resolve(segs, here, set())
            if absolute is not None:
                mf.refs.append(Reference(absolute, here, mf.rel, line_of(clean, m.start())))

    def scopes(self) -> Iterable[Tuple[str, ...]]:
        return [s for s, kids in self.children.items() if len(kids) > 1]

    def target(self, scope: Tuple[str, ...], path: List[str]) -> Optional[str]:
        """The child of scope that path reaches, if any. A path that names
        the child is an edge to it; a name the scope's module imports
        (`crate::Thing` after `pub use b::Thing;` in lib.rs) is an edge to
        the module that defines it, through any further re-exports, and
        no edge when another crate defines it."""
        k = len(scope)
        if tuple(path[:k]) != scope or len(path) <= k:
            return None
        if path[k] in self.children[scope]:
            return path[k]
        home = self.defined_in(scope, path[k], 0)
        if home is None or home[:k] != scope or len(home) <= k:
            return None
        return home[k]

    def defined_in(self, module: Tuple[str, ...], name: str, hops: int) -> Optional[Tuple[str, ...]]:
        """The module that defines `module::name`, following `use`s; None
        for an item of another crate."""
        mf = self.files.get(module)
        if mf is None or name not in mf.imports or hops > 16:
            return module
        via = mf.imports[name]
        if via is None:
            return None
        cur: Tuple[str, ...] = ()
        for i, seg in enumerate(via):
            if seg in self.children.get(cur, set()):
                cur = cur + (seg,)
            elif i == len(via) - 1:
                return self.defined_in(cur, seg, hops + 1)
            else:
                return cur  # a path through an item (an enum's variant...)
        return cur

    def graph(self, scope: Tuple[str, ...]) -> Dict[str, Dict[str, Tuple[str, int]]]:
        """node -> node -> the first reference (file, line) that makes the edge."""
        k = len(scope)
        edges: Dict[str, Dict[str, Tuple[str, int]]] = {c: {} for c in self.children[scope]}
        for mod, mf in sorted(self.files.items()):
            if mod[:k] != scope or len(mod) <= k:
                continue
            src = mod[k]
            for r in mf.refs:
                dst = self.target(scope, r.path)
                if dst is None or dst == src:
                    continue
                where = (r.file, r.line)
                if dst not in edges[src] or where < edges[src][dst]:
                    edges[src][dst] = where
        return edges


def depth_at(text: str, offset: int) -> int:
    return text.count("{", 0, offset) - text.count("}", 0, offset)


def tarjan(nodes: Iterable[str], edges: Dict[str, Dict[str, Tuple[str, int]]]) -> List[List[str]]:
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    out: List[List[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


@dataclass
class Cycle:
    crate: str
    modules: FrozenSet[str]  # qualified: `parent::child` below the top level
    edges: List[Tuple[str, str, str, int]]  # from, to, file, line


def find_crates(root: Path) -> List[Path]:
    crates = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        if "Cargo.toml" in filenames:
            src = Path(dirpath) / "src"
            if (src / "lib.rs").exists() or (src / "main.rs").exists():
                crates.append(Path(dirpath))
    return crates


def cycles_of(crate: Crate) -> List[Cycle]:
    found = []
    for scope in sorted(crate.scopes()):
        edges = crate.graph(scope)
        prefix = "".join(s + "::" for s in scope)
        for comp in tarjan(crate.children[scope], edges):
            if len(comp) < 2:
                continue
            members = set(comp)
            es = [
                (prefix + a, prefix + b, f, ln)
                for a in comp
                for b, (f, ln) in sorted(edges[a].items())
                if b in members
            ]
            found.append(Cycle(crate.name, frozenset(prefix + c for c in comp), es))
    return found


def parse_allow(specs: List[str]) -> List[Tuple[str, FrozenSet[str]]]:
    out = []
    for spec in specs:
        crate, _, mods = spec.rpartition(":")
        out.append((crate, frozenset(m.strip() for m in mods.split(",") if m.strip())))
    return out


def show(c: Cycle) -> List[str]:
    lines = [f"{c.crate}: cycle among {{{', '.join(sorted(c.modules))}}}:"]
    for a, b, f, ln in c.edges:
        lines.append(f"  {a} -> {b}    {f}:{ln}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--all", action="store_true", help="print the allowed cycles too, edge by edge")
    ap.add_argument("--allow", action="append", default=[], metavar="CRATE:MOD,MOD",
                    help="an allowed cycle, replacing the built-in list (repeatable)")
    ap.add_argument("--no-allow", action="store_true", help="allow no cycle at all")
    args = ap.parse_args()
    started = time.monotonic()
    root = args.root.resolve()
    allowed = [] if args.no_allow else (parse_allow(args.allow) if args.allow else ALLOWED)

    found: List[Cycle] = []
    for d in find_crates(root):
        found.extend(cycles_of(Crate(root, d)))

    failed = False
    for c in found:
        ok = any(crate == c.crate and c.modules <= mods for crate, mods in allowed)
        if not ok:
            failed = True
            grown = [sorted(mods) for crate, mods in allowed if crate == c.crate and c.modules & mods]
            print("\n".join(show(c)))
            why = (f"  grew beyond the allowed {{{', '.join(grown[0])}}}" if grown else "  a new cycle")
            print(why + ": break it (ALLOWED in ops/check_cycles.py may only shrink)")
        elif args.all:
            print("\n".join(show(c)) + "\n  (allowed)")
    for crate, mods in allowed:
        inside = [c.modules for c in found if c.crate == crate and c.modules <= mods]
        if not inside:
            print(f"note: the allowed cycle {crate}: {{{', '.join(sorted(mods))}}} is gone: "
                  "remove its entry from ALLOWED in ops/check_cycles.py")
        elif set().union(*inside) != mods:
            now = " and ".join("{" + ", ".join(sorted(m)) + "}" for m in inside)
            print(f"note: the allowed cycle {crate}: {{{', '.join(sorted(mods))}}} is now {now}: "
                  "narrow its entry in ALLOWED in ops/check_cycles.py")
    if args.all:
        print(f"({time.monotonic() - started:.2f} s)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
