"""What the attnspec commands (``attnspec run``, ``list``, ``bench``) and the Python verifier
share: how a usage error is said, and a selector as a worker far from the caller's directory
takes it. Both command modules import it from here, below them, so neither imports the other."""

from __future__ import annotations

import sys

from conformance.run.settings import file_of_selector

USAGE_ERROR = 2  # the exit status of a usage error, as argparse's own


def usage_error(message: str) -> int:
    """Says ``message`` as attnspec's usage error, on stderr; returns the exit status."""
    print(f"attnspec: error: {message}", file=sys.stderr)
    return USAGE_ERROR


def absolute_selector(selector: str) -> str:
    """``./mykernel.py:attention`` with its file's path made absolute; others as they are."""
    selector = selector.strip()
    file = file_of_selector(selector)
    return selector if file is None else f"{file}:{selector.partition(':')[2]}"
