#!/usr/bin/env python3
"""Tests of ops/check_cycles.py: on a tree of small crates made here, it
must find each kind of cycle it is meant to find (naming every edge with
its file and line), see none where there is none, and judge cycles against
its allowlist. Run by ./ops/test.sh beside the check itself; by hand:
`python3 ops/check_cycles_test.py`. Standard library only (unittest)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
CHECK = HERE / "check_cycles.py"

# A crate without a cycle: x uses a and c, nothing uses x back. References
# to x that must not count: in comments, strings, char literals and tests.
ACYCLIC = {
    "demo/Cargo.toml": '[package]\nname = "demo"\n',
    "demo/src/lib.rs": """
        //! Docs naming `crate::x::run`, which is no reference.
        pub mod a;
        pub mod c;
        pub mod x;
        pub mod m;
        pub use a::Thing;
        pub use c::{C, Outside};
    """,
    "demo/src/a.rs": """
        //! ```
        //! use crate::x::Runner;
        //! ```
        pub mod b {}
        pub struct Thing;
        /* crate::x::run() in a /* nested */ comment */
        pub fn name() -> &'static str { "crate::x::run" }
        pub fn brace() -> char { '{' }
        pub fn quote() -> char { '\\'' }
        pub fn raw() -> &'static str { r#"use crate::x;"# }

        #[cfg(test)]
        mod tests {
            use crate::x::run;
        }
    """,
    "demo/src/c.rs": """
        pub use shoal_other::Outside;
        pub struct C;
        #[cfg(test)]
        pub(crate) fn helper() -> Result<u8, String> { crate::x::run(); Ok(1) }
        pub fn c() {}
    """,
    "demo/src/x.rs": """
        use crate::{a::{b, Thing}, c};
        pub struct Runner;
        pub fn run() { c::c(); let _ = Thing; }
        mod inner {
            // `super` here is x, not the crate root: no edge to m (which
            // uses x).
            #[allow(unused_imports)]
            use super::m;
        }
    """,
    "demo/src/m/mod.rs": """
        mod p;
        mod q;
        use crate::c;
        pub fn go() { crate::x::run() }
    """,
    "demo/src/m/p.rs": """
        use super::q::Q;
    """,
    "demo/src/m/q.rs": """
        pub struct Q;
        pub fn f() {}
    """,
}


def make_tree(root: Path, files: Dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")


def run(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK), "--root", str(root), *args], capture_output=True, text=True)


def line_with(root: Path, rel: str, needle: str) -> int:
    lines = (root / rel).read_text(encoding="utf-8").splitlines()
    return next(i for i, line in enumerate(lines, 1) if needle in line)


class CheckCycles(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="check-cycles-"))
        make_tree(self.tmp, ACYCLIC)

    def tearDown(self) -> None:
        shutil.rmtree(self.tmp)

    def add(self, rel: str, text: str) -> int:
        """Appends a line to a file of the tree; returns its line number."""
        p = self.tmp / rel
        lines = p.read_text(encoding="utf-8").splitlines() + [text]
        p.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return len(lines)

    def assert_cycle(self, r: subprocess.CompletedProcess, modules: List[str], edges: List[str]) -> None:
        self.assertEqual(r.returncode, 1, f"expected a cycle among {modules}; got:\n{r.stdout}{r.stderr}")
        out = r.stdout.splitlines()
        self.assertIn(f"demo: cycle among {{{', '.join(modules)}}}:", out, r.stdout)
        for edge in edges:
            self.assertTrue(any(line.split() == edge.split() for line in out), f"no line `{edge}` in:\n{r.stdout}")

    def test_a_tree_without_a_cycle_passes(self) -> None:
        r = run(self.tmp, "--no-allow")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stdout, "")

    def test_a_cycle_through_a_nested_use_tree_fails(self) -> None:
        # x -> c only through `c` after the nested `a::{b, Thing}`.
        n = self.add("demo/src/c.rs", "pub fn back() { crate::x::run() }")
        r = run(self.tmp, "--no-allow")
        self.assert_cycle(r, ["c", "x"], [f"c -> x demo/src/c.rs:{n}", "x -> c demo/src/x.rs:1"])
        self.assertIn("a new cycle", r.stdout)

    def test_a_cycle_through_the_nested_group_of_a_use_tree_fails(self) -> None:
        # x -> a through `a::{b, Thing}`; a -> x through a renaming use.
        n = self.add("demo/src/a.rs", "pub use crate::x::Runner as R;")
        self.assert_cycle(run(self.tmp, "--no-allow"), ["a", "x"], [f"a -> x demo/src/a.rs:{n}", "x -> a demo/src/x.rs:1"])

    def test_a_cycle_through_super_among_submodules_fails(self) -> None:
        n = self.add("demo/src/m/q.rs", "pub fn g() { super::p::h() }")
        self.add("demo/src/m/p.rs", "pub fn h() {}")
        self.assert_cycle(
            run(self.tmp, "--no-allow"), ["m::p", "m::q"], [f"m::q -> m::p demo/src/m/q.rs:{n}", "m::p -> m::q demo/src/m/p.rs:1"]
        )

    def test_a_name_the_root_re_exports_leads_to_its_module(self) -> None:
        # `crate::C` is c's (lib.rs: `pub use c::{C, ..}`); `crate::Outside`,
        # re-exported the same way, is another crate's (c.rs: `pub use
        # shoal_other::Outside`) and leads nowhere.
        self.add("demo/src/c.rs", "pub fn uses() { crate::a::name(); }")
        self.add("demo/src/a.rs", "pub fn outside(_: crate::Outside) {}")
        self.assertEqual(run(self.tmp, "--no-allow").returncode, 0)
        n = self.add("demo/src/a.rs", "pub fn own(_: crate::C) {}")
        self.assert_cycle(run(self.tmp, "--no-allow"), ["a", "c"], [f"a -> c demo/src/a.rs:{n}"])

    def test_code_after_a_test_module_still_counts(self) -> None:
        n = self.add("demo/src/a.rs", "pub fn after_tests() { crate::x::run() }")
        self.assert_cycle(run(self.tmp, "--no-allow"), ["a", "x"], [f"a -> x demo/src/a.rs:{n}"])

    def test_an_allowed_cycle_passes_and_a_grown_one_fails(self) -> None:
        self.add("demo/src/c.rs", "pub fn back() { crate::x::run() }")
        r = run(self.tmp, "--allow", "demo:c,x")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stdout, "")
        r = run(self.tmp, "--allow", "demo:a,c,x")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("note: the allowed cycle demo: {a, c, x} is now {c, x}", r.stdout)
        n = self.add("demo/src/a.rs", "pub fn uses() { crate::x::run() }")
        r = run(self.tmp, "--allow", "demo:c,x")
        self.assert_cycle(r, ["a", "c", "x"], [f"a -> x demo/src/a.rs:{n}", "x -> a demo/src/x.rs:1"])
        self.assertIn("grew beyond the allowed {c, x}", r.stdout)

    def test_an_allowed_cycle_that_is_gone_is_noted(self) -> None:
        r = run(self.tmp, "--allow", "demo:c,x", "--allow", "other:p,q")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("note: the allowed cycle demo: {c, x} is gone", r.stdout)
        self.assertIn("note: the allowed cycle other: {p, q} is gone", r.stdout)

    def test_crates_under_target_and_third_party_are_skipped(self) -> None:
        for skipped in ("target", "third_party"):
            make_tree(self.tmp / skipped, {k: v for k, v in ACYCLIC.items()})
            self.add(f"{skipped}/demo/src/c.rs", "pub fn back() { crate::x::run() }")
        self.assertEqual(run(self.tmp, "--no-allow").returncode, 0)


if __name__ == "__main__":
    unittest.main(verbosity=1)
