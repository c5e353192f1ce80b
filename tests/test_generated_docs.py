"""The README's and docs' restatements of code are what that code says: each generated block
(tests.generated_docs) as its code generates it, and the README's list of commands the parser's."""

from __future__ import annotations

import argparse
import re

import pytest

from conformance.cli import build_parser
from tests.generated_docs import BLOCKS, ROOT, current_block, generated_block, with_block


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_each_generated_block_is_what_its_code_generates(name):
    document, _ = BLOCKS[name]
    held = current_block((ROOT / document).read_text(encoding="utf-8"), name)
    assert held == generated_block(name), (
        f"{document}'s '{name}' block is stale: python -m tests.generated_docs --write"
    )


def test_a_block_edited_by_hand_is_seen_and_regenerated():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    edited = text.replace("| `numpy_flash` |", "| `numpy_flash_renamed` |", 1)
    assert current_block(edited, "builtins") != generated_block("builtins")
    assert current_block(with_block(edited, "builtins"), "builtins") == generated_block("builtins")


def test_a_document_without_its_markers_is_a_clear_error():
    with pytest.raises(ValueError, match="generated: options"):
        current_block("# a document\n", "options")


def test_the_readme_lists_every_command_of_attnspec():
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## The `attnspec` command\n", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^- `attnspec (\w+)", section, re.M)
    assert sorted(listed) == sorted(subparsers.choices), "the README's list of commands"
