#!/usr/bin/env python3
"""Checks the docs against the repository. Run by ./ops/test.sh; by hand:

    python3 ops/check_docs.py                  # the checkout this file is in
    python3 ops/check_docs.py --root DIR       # another tree (the self-test uses this)
    python3 ops/check_docs.py --shoalctl target/debug/shoalctl
                                               # also compare the parsed subcommands
                                               # with the binary's --help

Exits 1 and prints `file:line: what` for every problem found, 0 when none.
Python 3 standard library only.

Which files: README.md, every docs/**/*.md and clients/python/*.md (the
pages a reader is sent to). Other READMEs beside code are not checked.

What fails, and the rules:

1. Paths that do not exist. Candidates are taken from inline code spans
   (`...`), from fenced and indented code blocks, and from Markdown link
   targets [text](target).
   - A link target is resolved the way Markdown does: relative to the
     directory of the page (or from the repository root if it starts with
     `/`). URLs (anything with a scheme, e.g. https:, mailto:), pure
     anchors (#...) and targets that leave the repository are skipped.
     A `#anchor` on a link to a .md file must name a heading of that page
     (GitHub's slugs).
   - In code spans and blocks, each whitespace-separated token is a
     candidate only if its first path component names an entry at the
     repository root (`docs/x.md`, `ops/shoal.example.toml`,
     `shard-node/engine/src/lib.rs`, `README.md`, `.ci/run`), and it is
     resolved from the root. So `../shared/...`, `/tmp/...`, `./shoal-data`,
     `$ds/base.fvecs` and bare file names are never candidates.
   - Skipped as placeholders: tokens holding any of `* ? < > { } [ ] $ ~ …`
     or `...`; `target/...` (build output); `collection/N` shard names such
     as `docs/2`; and a token followed by `:LINE` or `::item` is checked
     without that suffix. Surrounding quotes and punctuation are stripped.
2. `shoalctl <subcommand>` in code spans and code blocks that is not a
   real subcommand. The list is parsed from the clap definitions in
   ops/src (the `Command` enum of ops/src/main.rs and the enums its
   `#[command(subcommand)]` variants name), so no build is needed. Global
   flags before the subcommand (`--endpoint URL`) and cargo's `--` are
   skipped; for a command with subcommands (`shard`, `snapshot`, ...), the
   word after it is checked too; `a|b|c` checks each. `help` is accepted
   at every level, as clap adds it.
3. Development history in a page: `session N`, `issue N`, `round N of`
   (any case; also `session-N`). Pages say what is, not how it came to be.
4. The codes of README.md's error table (the first table after a heading
   with "error" in it; first column) must be exactly the codes that
   docs/errors.md has a `## CODE` heading for.
5. README.md stays a front page: at most 150 lines, and no table cell
   longer than 200 characters (figures and their history go in
   docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

HISTORY = re.compile(r"\bsession[ -]\d+|\bissue \d+|\bround \d+ of\b", re.IGNORECASE)
PLACEHOLDER_CHARS = set("*?<>{}[]$~…")
SHARD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*/\d+$")
LINK = re.compile(r"(?<!\!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMAGE_LINK = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?[^)]*\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
GLOBAL_FLAGS_WITH_VALUE = {"--endpoint", "--api-key", "--tls-ca"}
GRPC_CODES = {
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
    "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
    "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
}


class Problems:
    def __init__(self, root: Path):
        self.root = root
        self.items: List[str] = []

    def add(self, path: Path, line: int, what: str) -> None:
        self.items.append(f"{path.relative_to(self.root).as_posix()}:{line}: {what}")


# ---------------------------------------------------------------- pages


def pages(root: Path) -> List[Path]:
    out = []
    if (root / "README.md").is_file():
        out.append(root / "README.md")
    out += sorted((root / "docs").rglob("*.md")) if (root / "docs").is_dir() else []
    py = root / "clients" / "python"
    out += sorted(py.glob("*.md")) if py.is_dir() else []
    return out


def lines_with_code(text: str) -> Iterator[Tuple[int, str, bool]]:
    """(line number, line, whether the whole line is code: inside a fenced
    block or an indented block)."""
    fence: Optional[str] = None
    prev_blank = True
    in_indented = False
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if fence is not None:
            if stripped.startswith(fence):
                fence = None
                yield n, line, False
            else:
                yield n, line, True
            continue
        m = re.match(r"^\s*(```+|~~~+)", line)
        if m:
            fence = m.group(1)[:3]
            yield n, line, False
            prev_blank = False
            continue
        indented = line.startswith("    ") or line.startswith("\t")
        if indented and (prev_blank or in_indented) and stripped:
            in_indented = True
        elif stripped:
            in_indented = False
        yield n, line, in_indented and bool(stripped)
        prev_blank = not stripped


def code_pieces(text: str) -> Iterator[Tuple[int, str]]:
    """Every piece of code of a page with its line: whole code lines, and
    the inline code spans of the other lines."""
    for n, line, is_code in lines_with_code(text):
        if is_code:
            yield n, line
        else:
            for m in CODE_SPAN.finditer(line):
                yield n, m.group(2)


def prose_lines(text: str) -> Iterator[Tuple[int, str]]:
    for n, line, is_code in lines_with_code(text):
        if not is_code:
            yield n, line


# ---------------------------------------------------------------- paths


def root_entries(root: Path) -> Set[str]:
    return {p.name for p in root.iterdir() if p.name not in (".git", "target")}


def clean_token(tok: str) -> str:
    while True:
        before = tok
        tok = tok.lstrip("\"'`([").rstrip("\"'`)],;.!")
        tok = re.sub(r"::.*$", "", tok)
        tok = re.sub(r":\d+(?:[-:]\d+)?$", "", tok)
        tok = tok.rstrip(",;:.")
        if tok == before:
            return tok


def is_placeholder(tok: str) -> bool:
    return any(c in PLACEHOLDER_CHARS for c in tok) or "..." in tok


def check_code_paths(page: Path, text: str, roots: Set[str], problems: Problems) -> None:
    root = problems.root
    for n, piece in code_pieces(text):
        for raw in re.split(r"[\s=]+", piece):
            tok = clean_token(raw)
            if not tok or is_placeholder(tok) or SCHEME.match(tok):
                continue
            first = tok.split("/", 1)[0]
            if first not in roots or first == "target" or SHARD_NAME.match(tok):
                continue
            if "/" not in tok and not (root / tok).exists() and "." not in tok:
                # A bare word that happens to be a root directory's name
                # (`proto`, `docs`): prose, not a path.
                continue
            if not (root / tok).exists():
                problems.add(page, n, f"path `{tok}` does not exist")


def slug(heading: str) -> str:
    h = re.sub(r"`", "", heading.strip().lower())
    h = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", h)
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors_of(page: Path, cache: Dict[Path, Set[str]]) -> Set[str]:
    if page not in cache:
        seen: Dict[str, int] = {}
        out: Set[str] = set()
        for _, line, is_code in lines_with_code(page.read_text(encoding="utf-8")):
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m and not is_code:
                s = slug(m.group(1))
                k = seen.get(s, 0)
                out.add(s if k == 0 else f"{s}-{k}")
                seen[s] = k + 1
        cache[page] = out
    return cache[page]


def check_links(page: Path, text: str, problems: Problems, anchor_cache: Dict[Path, Set[str]]) -> None:
    root = problems.root.resolve()
    for n, line in prose_lines(text):
        line_wo_code = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        targets = [m.group(1) for m in LINK.finditer(line_wo_code)] + [m.group(1) for m in IMAGE_LINK.finditer(line_wo_code)]
        for target in targets:
            if SCHEME.match(target) or target.startswith("#"):
                if target.startswith("#") and len(target) > 1 and target[1:].lower() not in anchors_of(page, anchor_cache):
                    problems.add(page, n, f"link `{target}`: no such heading in this page")
                continue
            path_part, _, anchor = target.partition("#")
            if is_placeholder(path_part):
                continue
            base = root if path_part.startswith("/") else page.resolve().parent
            resolved = (base / path_part.lstrip("/")).resolve()
            try:
                rel = resolved.relative_to(root)
            except ValueError:
                continue  # outside the repository
            if rel.parts and rel.parts[0] == "target":
                continue
            if not resolved.exists():
                problems.add(page, n, f"link `{target}`: {rel.as_posix()} does not exist")
            elif anchor and resolved.suffix == ".md" and anchor.lower() not in anchors_of(resolved, anchor_cache):
                problems.add(page, n, f"link `{target}`: {rel.as_posix()} has no heading #{anchor}")


# ---------------------------------------------------------------- shoalctl


def kebab(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"-\1", name).lower()


def strip_rust_comments(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    return re.sub(r"//[^\n]*", "", src)


def enum_body(src: str, name: str) -> Optional[str]:
    m = re.search(r"\benum\s+" + re.escape(name) + r"\b[^{]*\{", src)
    if not m:
        return None
    depth, i = 1, m.end()
    while i < len(src) and depth:
        depth += {"{": 1, "}": -1}.get(src[i], 0)
        i += 1
    return src[m.end() : i - 1]


def top_level_items(body: str) -> List[str]:
    """The enum's variants, each with its attributes, split at depth-0 commas."""
    items, depth, cur = [], 0, []
    for ch in body:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        items.append("".join(cur))
    return [i for i in items if i.strip()]


def parse_variant(item: str) -> Tuple[List[str], str, bool, Optional[str]]:
    """(names, variant, has #[command(subcommand)], type of a tuple variant)."""
    attrs = re.findall(r"#\[(.*?)\]\s*(?=#|\w)", item, flags=re.S)
    rest = re.sub(r"#\[.*?\]\s*(?=#|\w)", "", item, flags=re.S).strip()
    m = re.match(r"(\w+)\s*(\((.*)\))?", rest, flags=re.S)
    if not m:
        return [], "", False, None
    variant = m.group(1)
    ty = m.group(3).strip().split("::")[-1].strip() if m.group(3) else None
    names = [kebab(variant)]
    subcommand = False
    for a in attrs:
        if not a.startswith("command"):
            continue
        if re.search(r"\bsubcommand\b", a):
            subcommand = True
        n = re.search(r'\bname\s*=\s*"([^"]+)"', a)
        if n:
            names[0] = n.group(1)
        names += re.findall(r'\b(?:visible_)?alias\s*=\s*"([^"]+)"', a)
        for group in re.findall(r"\b(?:visible_)?aliases\s*=\s*\[([^\]]*)\]", a):
            names += re.findall(r'"([^"]+)"', group)
    return names, variant, subcommand, ty


def shoalctl_commands(root: Path) -> Dict[str, Optional[Set[str]]]:
    """Top-level subcommand -> its subcommands (None for a leaf)."""
    src_dir = root / "ops" / "src"
    main = src_dir / "main.rs"
    if not main.is_file():
        return {}
    every = "\n".join(strip_rust_comments(p.read_text(encoding="utf-8")) for p in sorted(src_dir.rglob("*.rs")))
    main_src = strip_rust_comments(main.read_text(encoding="utf-8"))
    cli = re.search(r"#\[command\(subcommand\)\]\s*(?:pub\s+)?\w+\s*:\s*([\w:]+)", main_src)
    top = cli.group(1).split("::")[-1] if cli else "Command"
    body = enum_body(main_src, top)
    if body is None:
        raise SystemExit(f"check_docs: no enum {top} in {main}: update the parser")
    out: Dict[str, Optional[Set[str]]] = {"help": None}
    for item in top_level_items(body):
        names, _, sub, ty = parse_variant(item)
        if not names:
            continue
        children: Optional[Set[str]] = None
        if sub:
            sub_body = enum_body(every, ty or "")
            if sub_body is None:
                raise SystemExit(f"check_docs: no enum {ty} under {src_dir} for subcommand {names[0]}: update the parser")
            children = {"help"}
            for s in top_level_items(sub_body):
                children.update(parse_variant(s)[0])
        for n in names:
            out[n] = children
    if len(out) < 3:
        raise SystemExit(f"check_docs: found only {sorted(out)} as shoalctl subcommands in {main}: update the parser")
    return out


def commands_from_binary(binary: str) -> Dict[str, Optional[Set[str]]]:
    def listed(args: List[str]) -> Set[str]:
        text = subprocess.run([binary, *args, "--help"], capture_output=True, text=True, check=True).stdout
        part = text.split("Commands:", 1)
        if len(part) < 2:
            return set()
        names = set()
        for line in part[1].splitlines():
            if line.strip() and not line.startswith("  "):
                break
            m = re.match(r"^  (\S+)", line)
            if m:
                names.add(m.group(1).rstrip(","))
        return names

    out: Dict[str, Optional[Set[str]]] = {}
    for c in listed([]):
        children = listed([c]) if c != "help" else set()
        out[c] = children or None
    return out


def check_shoalctl(page: Path, text: str, commands: Dict[str, Optional[Set[str]]], problems: Problems) -> None:
    for n, piece in code_pieces(text):
        for m in re.finditer(r"(?<![\w-])shoalctl(?![\w-])", piece):
            toks = piece[m.end() :].split()
            i = 0
            while i < len(toks) and toks[i].startswith("-"):
                flag = toks[i].split("=", 1)[0]
                i += 2 if flag in GLOBAL_FLAGS_WITH_VALUE and "=" not in toks[i] else 1
            if i >= len(toks):
                continue
            first = toks[i].rstrip(",;.)`'\"")
            if not re.fullmatch(r"[a-z][a-z0-9|-]*", first):
                continue  # `shoalctl`'s, a placeholder, prose
            for word in first.split("|"):
                if word and word not in commands:
                    problems.add(page, n, f"`shoalctl {word}` is not a shoalctl subcommand (ops/src/main.rs)")
            children = commands.get(first.split("|")[0])
            if children is None or i + 1 >= len(toks) or "|" in first:
                continue
            second = toks[i + 1].rstrip(",;.)`'\"")
            if not re.fullmatch(r"[a-z][a-z0-9|-]*", second):
                continue
            for word in second.split("|"):
                if word and word not in children:
                    problems.add(page, n, f"`shoalctl {first} {word}` is not a subcommand of `shoalctl {first}`")


# ---------------------------------------------------------------- history, errors


def check_history(page: Path, text: str, problems: Problems) -> None:
    for n, line in enumerate(text.splitlines(), 1):
        for m in HISTORY.finditer(line):
            problems.add(page, n, f"development history in a page: {m.group(0)!r}")


def table_codes(lines: List[str], start: int) -> List[Tuple[int, str]]:
    """First-column codes of the first table at or after `start`."""
    out: List[Tuple[int, str]] = []
    i = start
    while i < len(lines) and not lines[i].lstrip().startswith("|"):
        if i > start and lines[i].startswith("#"):
            return out
        i += 1
    while i < len(lines) and lines[i].lstrip().startswith("|"):
        cell = lines[i].strip().strip("|").split("|")[0].strip().strip("`").strip("*").strip("`")
        if re.fullmatch(r"[A-Z][A-Z_]+", cell):
            out.append((i + 1, cell))
        i += 1
    return out


def check_error_table(root: Path, problems: Problems) -> None:
    readme, errors = root / "README.md", root / "docs" / "errors.md"
    if not readme.is_file():
        return
    lines = readme.read_text(encoding="utf-8").splitlines()
    heading = next((i for i, l in enumerate(lines) if re.match(r"^#{1,6}\s.*\berrors?\b", l, re.IGNORECASE)), None)
    if heading is None:
        problems.add(readme, 1, "no heading with 'error' followed by the table of error codes")
        return
    in_readme = table_codes(lines, heading)
    if not in_readme:
        problems.add(readme, heading + 1, "no table of error codes after this heading")
        return
    if not errors.is_file():
        problems.add(readme, heading + 1, "docs/errors.md does not exist")
        return
    err_lines = errors.read_text(encoding="utf-8").splitlines()
    in_errors = {}
    for i, l in enumerate(err_lines, 1):
        m = re.match(r"^##\s+`?([A-Z][A-Z_]+)`?\s*$", l)
        if m:
            in_errors[m.group(1)] = i
    for line, code in in_readme:
        if code not in GRPC_CODES:
            problems.add(readme, line, f"{code} is not a gRPC status code")
        elif code not in in_errors:
            problems.add(readme, line, f"{code} is in the README's error table but has no `## {code}` in docs/errors.md")
    readme_set = {c for _, c in in_readme}
    for code, line in in_errors.items():
        if code not in readme_set:
            problems.add(errors, line, f"{code} has a section here but no row in the README's error table")


README_MAX_LINES = 150
README_MAX_CELL = 200


def check_readme_size(root: Path, problems: Problems) -> None:
    readme = root / "README.md"
    if not readme.is_file():
        return
    lines = readme.read_text(encoding="utf-8").splitlines()
    if len(lines) > README_MAX_LINES:
        problems.add(readme, len(lines), f"README.md has {len(lines)} lines, more than {README_MAX_LINES}")
    for n, line in enumerate(lines, 1):
        if line.lstrip().startswith("|"):
            for cell in line.strip().strip("|").split("|"):
                if len(cell.strip()) > README_MAX_CELL:
                    problems.add(readme, n, f"a table cell of {len(cell.strip())} characters (at most {README_MAX_CELL})")


# ---------------------------------------------------------------- main


def check(root: Path, binary: Optional[str] = None) -> List[str]:
    root = root.resolve()
    problems = Problems(root)
    commands = shoalctl_commands(root)
    if binary:
        from_bin = commands_from_binary(binary)
        parsed = {k: (sorted(v) if v else None) for k, v in commands.items()}
        built = {k: (sorted(v) if v else None) for k, v in from_bin.items()}
        if parsed != built:
            problems.items.append(f"ops/src/main.rs:1: parsed subcommands {parsed} differ from `{binary} --help`'s {built}")
    roots = root_entries(root)
    anchor_cache: Dict[Path, Set[str]] = {}
    for page in pages(root):
        text = page.read_text(encoding="utf-8")
        check_code_paths(page, text, roots, problems)
        check_links(page, text, problems, anchor_cache)
        if commands:
            check_shoalctl(page, text, commands, problems)
        check_history(page, text, problems)
    check_error_table(root, problems)
    check_readme_size(root, problems)
    return problems.items


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--shoalctl", help="a built shoalctl whose --help must list what the parser found")
    args = ap.parse_args()
    found = check(args.root, args.shoalctl)
    for p in found:
        print(p)
    if found:
        print(f"check_docs: {len(found)} problem(s) (rules: the top of ops/check_docs.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
