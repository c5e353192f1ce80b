"""The parts of the README and docs/ that restate code, generated from it: the conventions
(impls.capabilities.CONVENTIONS), the features and their claims (spec.features, spec/claims.toml),
the built-ins (impls.registry.BUILTINS) and the options (conformance.run.options.OPTIONS).

    python -m tests.generated_docs --write    # regenerate every block in place
    python -m tests.generated_docs            # exit 1 naming each stale block

Each block sits between ``<!-- generated: NAME -->`` and ``<!-- end generated: NAME -->`` in its
document; tests/test_generated_docs.py holds every block to what this generates.
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Callable
from pathlib import Path

from conformance.run.options import OPTIONS
from impls.capabilities import CONVENTIONS
from impls.registry import BUILTINS
from spec.catalogue import load_catalogue
from spec.features import FEATURES

ROOT = Path(__file__).resolve().parent.parent
WIDTH = 100  # the README's rows, as the code's


def bullet(text: str) -> list[str]:
    """``text`` as one Markdown bullet, wrapped at WIDTH, code spans kept whole."""
    return textwrap.wrap(
        text, WIDTH, initial_indent="- ", subsequent_indent="  ", break_on_hyphens=False,
        break_long_words=False,
    )  # fmt: skip


def conventions() -> list[str]:
    """Each convention of the contract and the answers it accepts."""
    return [
        line
        for name, answers in CONVENTIONS.items()
        for line in bullet(
            f"`{name}`: " + "; or ".join(f"`{value}`, {says}" for value, says in answers.items())
        )
    ]


def features() -> list[str]:
    """Each feature: its Capabilities flag, the keywords a call brings, the claims it unlocks."""
    claims = load_catalogue().claims.values()
    lines = []
    for feature in FEATURES:
        ids = ", ".join(f"`{c.id}`" for c in claims if feature.name in c.needs)
        keywords = ", ".join(f"`{k}`" for k in feature.keywords) or "its shapes"
        lines += bullet(f"`{feature.name}` ({keywords}): {ids or 'no claim of its own'}")
    return lines


def builtins() -> list[str]:
    """The built-in implementations, as the registry describes them."""
    return ["| name | what |", "| --- | --- |"] + [
        f"| `{name}` | {builtin.note} |" for name, builtin in BUILTINS.items()
    ]


def options() -> list[str]:
    """Every option of the plugin and of ``attnspec run``, with its default."""
    rows = ["| option | meaning | default |", "| --- | --- | --- |"]
    for option in OPTIONS:
        spelled = f"`{option.flag}`" if option.action == "store_true" else (
            f"`{option.flag} {option.metavar}`"
        )  # fmt: skip
        if option.run_flags:
            spelled += " (" + ", ".join(f"`{flag}`" for flag in option.run_flags)
            spelled += " on `attnspec run`)"
        rows.append(f"| {spelled} | {option.does} | {option.default} |")
    return rows


BLOCKS: dict[str, tuple[str, Callable[[], list[str]]]] = {
    "conventions": ("README.md", conventions),
    "features": ("README.md", features),
    "builtins": ("README.md", builtins),
    "options": ("docs/options.md", options),
}


def markers(name: str) -> tuple[str, str]:
    return f"<!-- generated: {name} -->\n", f"<!-- end generated: {name} -->\n"


def current_block(text: str, name: str) -> str:
    """What the document holds between ``name``'s markers; a clear error where they are not."""
    start, end = markers(name)
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise ValueError(f"the document lacks one '{start.strip()}' ... '{end.strip()}' pair")
    return text.split(start, 1)[1].split(end, 1)[0]


def generated_block(name: str) -> str:
    return "\n".join(BLOCKS[name][1]()) + "\n"


def with_block(text: str, name: str) -> str:
    start, end = markers(name)
    before = text.split(start, 1)[0]
    after = text.split(end, 1)[1]
    return before + start + generated_block(name) + end + after


def stale_blocks() -> list[str]:
    """``document: name`` for each block that differs from what its code generates."""
    return [
        f"{document}: {name}"
        for name, (document, _) in BLOCKS.items()
        if current_block((ROOT / document).read_text(encoding="utf-8"), name)
        != generated_block(name)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.generated_docs", description=__doc__)
    parser.add_argument("--write", action="store_true", help="regenerate every block in place")
    options_given = parser.parse_args(argv)
    if options_given.write:
        for name, (document, _) in BLOCKS.items():
            path = ROOT / document
            path.write_text(with_block(path.read_text(encoding="utf-8"), name), encoding="utf-8")
        return 0
    stale = stale_blocks()
    for block in stale:
        print(f"stale: {block} (python -m tests.generated_docs --write)")
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
