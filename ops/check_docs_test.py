#!/usr/bin/env python3
"""Tests of ops/check_docs.py: it must fail on each kind of problem it is
meant to catch, naming the file and line, and pass on a clean tree. Run by
./ops/test.sh beside the check itself; by hand: `python3 ops/check_docs_test.py`.
Standard library only (unittest)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CHECK = HERE / "check_docs.py"

MAIN_RS = """
use clap::{Parser, Subcommand};

#[derive(Parser)]
struct Cli {
    #[arg(long, global = true)]
    endpoint: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs it.
    Demo(demo::DemoArgs),
    /// Nodes, collections, shards.
    Status,
    /// Shards.
    #[command(subcommand)]
    Shard(placement::ShardCommand),
    Rebalance {
        #[arg(long)]
        dry_run: bool,
    },
    ProtoDescriptor { output: PathBuf },
}
"""

PLACEMENT_RS = """
#[derive(clap::Subcommand, Debug)]
pub enum ShardCommand {
    /// Move one.
    Move {
        shard: String,
        #[arg(long)]
        to: Option<String>,
    },
    Recover { shard: String },
}
"""

README = """
# demo

    cargo run --release --bin shoalctl -- demo
    shoalctl --endpoint http://127.0.0.1:7700 status

See [the docs](docs/index.md) and `ops/src/main.rs`.

## Errors

| code | in one line |
| --- | --- |
| INVALID_ARGUMENT | wrong |
| UNAVAILABLE | retry |
"""

ERRORS = """
# Errors

## INVALID_ARGUMENT

Wrong.

## UNAVAILABLE

Retry.
"""

INDEX = """
# Index

- [errors](errors.md), [errors' retry](errors.md#unavailable), [main](../ops/src/main.rs)
- `shoalctl shard move docs/2 --to shard-1` and `shoalctl rebalance --dry-run`
- `shoalctl proto-descriptor`, `shoalctl shard move|recover`, `target/release/shoalctl status`
- placeholders pass: `docs/*.md`, `shard-node/<x>.rs`, `/tmp/out`, `../shared/datasets/pypi/make.sh`, `ops/src/main.rs:12`
"""


def make_tree(root: Path) -> None:
    files = {
        "ops/src/main.rs": MAIN_RS,
        "ops/src/placement.rs": PLACEMENT_RS,
        "README.md": README,
        "docs/errors.md": ERRORS,
        "docs/index.md": INDEX,
    }
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")


def run(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK), "--root", str(root)], capture_output=True, text=True)


class CheckDocs(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="check-docs-"))
        make_tree(self.tmp)

    def tearDown(self) -> None:
        shutil.rmtree(self.tmp)

    def append(self, rel: str, text: str) -> int:
        """Appends a line to a page; returns its line number."""
        p = self.tmp / rel
        lines = p.read_text(encoding="utf-8").splitlines()
        lines += ["", text]
        p.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return len(lines)

    def assert_fails_with(self, where: str, what: str) -> None:
        r = run(self.tmp)
        self.assertEqual(r.returncode, 1, f"expected a failure naming {where}; got:\n{r.stdout}{r.stderr}")
        self.assertTrue(
            any(line.startswith(where + ":") and what in line for line in r.stdout.splitlines()),
            f"no line `{where}: ...{what}...` in:\n{r.stdout}",
        )

    def test_a_clean_tree_passes(self) -> None:
        r = run(self.tmp)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stdout, "")

    def test_a_missing_path_in_code_fails(self) -> None:
        n = self.append("docs/index.md", "The parser is `ops/src/nothing.rs`.")
        self.assert_fails_with(f"docs/index.md:{n}", "ops/src/nothing.rs")

    def test_a_missing_path_in_a_code_block_fails(self) -> None:
        n = self.append("docs/index.md", "    ops/nothing.sh --fast")
        self.assert_fails_with(f"docs/index.md:{n}", "ops/nothing.sh")

    def test_a_broken_link_fails(self) -> None:
        n = self.append("README.md", "Read [this](docs/nope.md).")
        self.assert_fails_with(f"README.md:{n}", "docs/nope.md does not exist")

    def test_a_link_to_a_missing_heading_fails(self) -> None:
        n = self.append("docs/index.md", "See [that](errors.md#not-a-code).")
        self.assert_fails_with(f"docs/index.md:{n}", "no heading #not-a-code")

    def test_a_fake_subcommand_fails(self) -> None:
        n = self.append("docs/index.md", "Run `shoalctl frobnicate --now`.")
        self.assert_fails_with(f"docs/index.md:{n}", "`shoalctl frobnicate` is not a shoalctl subcommand")

    def test_a_fake_nested_subcommand_fails(self) -> None:
        n = self.append("docs/index.md", "    ./target/release/shoalctl shard explode docs/1")
        self.assert_fails_with(f"docs/index.md:{n}", "`shoalctl shard explode` is not a subcommand")

    def test_a_subcommand_passes_once_it_is_defined(self) -> None:
        self.append("docs/index.md", "Run `shoalctl frobnicate`.")
        self.assertEqual(run(self.tmp).returncode, 1)
        main = self.tmp / "ops/src/main.rs"
        main.write_text(main.read_text().replace("    Status,\n", "    Status,\n    /// New.\n    Frobnicate,\n"))
        r = run(self.tmp)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_history_markers_fail(self) -> None:
        for text in ("Measured in session 23.", "As issue 17 asked.", "In round 3 of 30."):
            with self.subTest(text=text):
                make_tree(self.tmp)
                n = self.append("docs/index.md", text)
                self.assert_fails_with(f"docs/index.md:{n}", "development history")

    def test_an_error_code_missing_from_errors_md_fails(self) -> None:
        readme = self.tmp / "README.md"
        readme.write_text(readme.read_text() + "| DATA_LOSS | damaged |\n")
        self.assert_fails_with("README.md", "DATA_LOSS is in the README's error table but has no `## DATA_LOSS`")

    def test_an_error_code_missing_from_the_readme_fails(self) -> None:
        self.append("docs/errors.md", "## PERMISSION_DENIED")
        self.assert_fails_with("docs/errors.md", "PERMISSION_DENIED has a section here but no row")

    def test_a_long_readme_cell_fails(self) -> None:
        readme = self.tmp / "README.md"
        readme.write_text(readme.read_text() + "| INTERNAL | " + "a measurement history, " * 10 + "|\n")
        self.append("docs/errors.md", "## INTERNAL")
        self.assert_fails_with("README.md", "a table cell of")

    def test_the_real_clap_definitions_parse_and_a_fake_one_is_caught(self) -> None:
        """On a copy of this repository's ops/src: its subcommands are found,
        a made-up one is refused, and adding it to the enum makes it pass."""
        shutil.rmtree(self.tmp / "ops")
        shutil.copytree(REPO / "ops" / "src", self.tmp / "ops" / "src")
        sys.path.insert(0, str(HERE))
        try:
            import check_docs
        finally:
            sys.path.pop(0)
        commands = check_docs.shoalctl_commands(self.tmp)
        for real in ("demo", "dev", "status", "ingest", "search", "snapshot", "shard", "node", "rebalance"):
            self.assertIn(real, commands)
        self.assertIn("move", commands["shard"] or set())
        self.assertIn("restore", commands["snapshot"] or set())
        n = self.append("docs/index.md", "Run `shoalctl frobnicate` then `shoalctl shard move docs/0`.")
        self.assert_fails_with(f"docs/index.md:{n}", "`shoalctl frobnicate` is not a shoalctl subcommand")
        main = self.tmp / "ops/src/main.rs"
        text = main.read_text()
        self.assertIn("enum Command {\n", text)
        main.write_text(text.replace("enum Command {\n", "enum Command {\n    /// Made up by the test.\n    Frobnicate,\n", 1))
        r = run(self.tmp)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=1)
