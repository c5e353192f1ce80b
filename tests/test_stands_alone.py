"""The project stands alone: nothing in a clone points outside it."""

from __future__ import annotations

import subprocess

from tests.suite_process import ROOT

OUTSIDE = ("../shared", "shared/seed", "spec-extensions.md")


def test_no_tracked_file_points_outside_the_clone():
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    offenders = []
    for name in tracked:
        path = ROOT / name
        if name == "tests/test_stands_alone.py" or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        offenders += [f"{name}: {needle}" for needle in OUTSIDE if needle in text]
    assert not offenders, offenders
