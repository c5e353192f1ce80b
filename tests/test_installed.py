"""attnspec as a kernel author meets it: the wheel built from this tree and installed (not
editable) into a fresh venv with only its declared dependencies, used from empty directories
outside the checkout. Every other test runs inside the checkout, where none of this shows."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from tests.suite_process import ROOT
from tests.test_readme_example import readme_example

TIMEOUT = 600
# What the wheel is built from: the tree as a fresh clone has it, without what runs leave behind.
NOT_SHIPPED = (".git", ".tox", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache")
TOP_LEFT_KERNEL = readme_example().replace(
    "np.tri(*s.shape[-2:], s.shape[-1] - s.shape[-2], bool)", "np.tri(*s.shape[-2:], 0, bool)"
)
ENTRY_POINT_PACKAGE = """
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "mykernel"
version = "0.1"

[tool.setuptools]
py-modules = ["mykernel"]

[project.entry-points."attnspec.impls"]
mykernel = "mykernel:attention"
"""


class Installed:
    """A venv holding the wheel, and a way to run commands in it from a directory."""

    def __init__(self, root: Path, wheel: Path):
        self.root = root
        self.wheel = wheel
        self.bin = root / "venv" / "bin"

    def run(self, command: str, cwd: Path) -> subprocess.CompletedProcess:
        """``command`` through the shell, as typed, with the venv's bin first on PATH (so that a
        printed ``python -m pytest ...`` runs the venv's python) and nothing of the checkout."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PYTHON", "ATTNSPEC_", "PYTEST_"))  # a shell has none of these
        }
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(self.bin.parent)
        return subprocess.run(
            command,
            shell=True,
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )

    def empty_directory(self, name: str) -> Path:
        path = self.root / name
        path.mkdir()
        return path


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    root = tmp_path_factory.mktemp("installed")
    source = root / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*NOT_SHIPPED))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "-w", str(root / "dist"), str(source)],
        check=True,
        timeout=TIMEOUT,
    )
    (wheel,) = (root / "dist").glob("attnspec-*.whl")
    venv.create(root / "venv", with_pip=True)
    subprocess.run(
        [root / "venv/bin/python", "-m", "pip", "install", "-q", "--no-compile", str(wheel)],
        check=True,
        timeout=TIMEOUT,
    )
    return Installed(root, wheel)


def test_the_wheel_ships_every_module_of_the_checkout(installed):
    shipped = set(zipfile.ZipFile(installed.wheel).namelist())
    modules = [
        path.relative_to(ROOT).as_posix()
        for top in ("spec", "impls", "conformance")
        for path in (ROOT / top).rglob("*")
        if path.suffix in (".py", ".toml", ".cu") and "__pycache__" not in path.parts
    ]
    assert len(modules) > 50
    assert sorted(set(modules) - shipped) == []


def test_the_readme_example_conforms_through_attnspec_run_and_plain_pytest(installed):
    author = installed.empty_directory("author")
    (author / "mykernel.py").write_text(readme_example())
    for command in (
        "attnspec run -v --impl mykernel:attention --report-json report.json",  # -v: the header
        # the same test modules judged just above: plain pytest's own way in is what is new here
        "python -m pytest --pyargs conformance --impl mykernel:attention --report-json report.json"
        " --claims OUT-FORMULA,MASK-FUTURE-INVARIANT,SOFTMAX-ROWSUM",
    ):
        run = installed.run(command, author)
        assert run.returncode == 0, command + "\n" + run.stdout[-3000:] + run.stderr[-3000:]
        verdicts = {
            s["name"]: s["verdict"]
            for s in json.loads((author / "report.json").read_text())["subjects"]
        }
        assert verdicts["mykernel:attention"] == "conforms", (command, verdicts)
        if command.startswith("attnspec"):
            # the judge's pytest runs in a directory of its own, which holds nothing of the
            # author's, with no cache
            assert "rootdir: /tmp/attnspec-run-" in run.stdout, run.stdout[:2000]
        else:  # pytest's rootdir, where its cache goes, is the author's directory
            assert f"rootdir: {author}\n" in run.stdout, run.stdout[:2000]
    assert not list((installed.bin.parent / "lib").rglob(".pytest_cache"))


def test_a_printed_reproducer_runs_where_it_was_printed_and_fails_the_same_way(installed):
    author = installed.empty_directory("top_left")
    (author / "topleft.py").write_text(TOP_LEFT_KERNEL)
    run = installed.run(
        "attnspec run --impl topleft:attention --claims OUT-FORMULA --report-json report.json"
        " --profile verdicts",  # unshrunk: the first failure's reproducer is what is run again
        author,
    )
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    # the reproducer as the screen shows it, wrapped within 100 columns: pasted whole
    first = re.search(r"^ +reproduce: ((?:.*\\\n)*.*)$", run.stdout, re.MULTILINE)
    assert first, run.stdout[-3000:]
    pasted = first.group(1)
    assert "\\\n" in pasted, pasted  # wrapped: the paste below crosses its line breaks
    (subject,) = [
        s for s in json.loads((author / "report.json").read_text())["subjects"] if s["selector"]
    ]
    failure = subject["claims"]["OUT-FORMULA"]["first_failure"]
    again = installed.run(pasted, author)
    assert again.returncode == 1, pasted + "\n" + again.stdout[-3000:] + again.stderr
    assert failure["message"].splitlines()[0] in again.stdout


@pytest.mark.parametrize(
    ("decoy", "package"),
    [("spec/__init__.py", "spec"), ("impls.py", "impls"), ("conformance.py", "conformance")],
)
def test_a_module_in_the_working_directory_that_shadows_the_suite_is_refused_or_ignored(
    installed, decoy, package
):
    """attnspec run imports nothing of the directory it runs from: it judges, the decoy unread.
    Plain pytest puts that directory first on sys.path: it refuses, naming the decoy."""
    author = installed.empty_directory(f"decoy_{package}")
    (author / "mykernel.py").write_text(readme_example())
    (author / decoy).parent.mkdir(exist_ok=True)
    (author / decoy).write_text("raise SystemExit('the decoy was imported')\n")
    judged = installed.run("attnspec run --impl mykernel:attention --claims OUT-FORMULA", author)
    output = judged.stdout + judged.stderr
    assert judged.returncode == 0, output[-3000:]
    assert "the decoy was imported" not in output
    run = installed.run("python -m pytest --pyargs conformance --impl mykernel:attention", author)
    output = run.stdout + run.stderr
    assert run.returncode == 4, output[-3000:]
    shadowing = [line for line in output.splitlines() if "shadows attnspec's package" in line]
    assert len(shadowing) == 1, output[-3000:]
    assert str(author / decoy) in shadowing[0]
    assert "the decoy was imported" not in output


@pytest.mark.parametrize("with_a_spec_package", [False, True])
def test_another_projects_pytest_run_is_left_alone(installed, with_a_spec_package):
    project = installed.empty_directory(f"other_project_{with_a_spec_package}")
    if with_a_spec_package:  # a name the suite's package has: theirs is imported, not refused
        (project / "spec").mkdir()
        (project / "spec" / "__init__.py").write_text("OURS = True\n")
        (project / "test_theirs.py").write_text(
            "import spec\n\ndef test_theirs():\n    assert spec.OURS\n"
        )
    else:
        (project / "test_theirs.py").write_text("def test_theirs():\n    pass\n")
    run = installed.run("python -m pytest", project)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "1 passed" in run.stdout
    assert "attnspec:" not in run.stdout  # no header, no verdicts: not a judgement


def test_a_kernel_registered_through_the_entry_point_is_judged_by_its_name(installed):
    package = installed.empty_directory("kernel_package")
    (package / "pyproject.toml").write_text(ENTRY_POINT_PACKAGE)
    (package / "mykernel.py").write_text(readme_example())
    install = installed.run(
        f"python -m pip install -q --no-deps {shlex.quote(str(package))}",
        installed.root,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    elsewhere = installed.empty_directory("elsewhere")
    listed = installed.run("attnspec list", elsewhere)
    assert re.search(r"^mykernel\s+entry point\s", listed.stdout, re.MULTILINE), listed.stdout
    # which claims it meets is the test above's; here, that the name reaches the same kernel
    run = installed.run(
        "attnspec run --impl mykernel --claims OUT-FORMULA --report-json report.json", elsewhere
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (subject,) = [
        s for s in json.loads((elsewhere / "report.json").read_text())["subjects"] if s["selector"]
    ]
    assert (subject["name"], subject["verdict"]) == ("mykernel", "conforms")
