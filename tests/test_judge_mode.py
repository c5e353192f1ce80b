"""Judge mode: nothing of the judged runs in the judge. Each planted candidate of
``tests/planted/candidates/`` (a kernel and one more file) is judged as a reward loop would judge
it, with ``attnspec run`` started from its own directory, serially and with ``-n 2``: the verdict
and the report are what they would be without the extra file, nothing appears outside the
worker's scratch, a listener on 127.0.0.1 receives nothing, and the run keeps to its budget.
Under plain pytest, ``--require-sandbox`` refuses such a directory, naming the file.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.suite_process import ROOT

CANDIDATES = ROOT / "tests" / "planted" / "candidates"
CLAIMS = "MASK-PREFIX"  # six tests: what a verdict needs, in seconds
SECRET = "planted-token-4242"
# The installed `attnspec` command as a console script runs it: its own directory, not the
# current one, first on sys.path; here the checkout stands for the installation.
ATTNSPEC = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); from attnspec import main; sys.exit(main())"
)


def planted(name: str, parent: Path) -> Path:
    """A fresh copy of candidate ``name``, its files named as planted (without ``.planted``)."""
    directory = parent / name
    directory.mkdir()
    for source in (CANDIDATES / name).iterdir():
        shutil.copy(source, directory / source.name.removesuffix(".planted"))
    return directory


def attnspec_run(directory: Path, *args: str, timeout: float = 300, env=None):
    """``attnspec run ARGS`` from ``directory``, as a harness starts it there; with the judge's
    environment holding a secret it must not hand on."""
    environ = dict(os.environ, ATTNSPEC_PLANTED_SECRET=SECRET, PYTHONPATH=str(ROOT)) | (env or {})
    environ.pop("ATTNSPEC_IMPL", None)
    return subprocess.run(
        [sys.executable, "-I", "-c", ATTNSPEC, str(ROOT), "run", *args],
        cwd=directory, env=environ, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def judged(directory: Path, *args: str, workers: int = 1, timeout: float = 300):
    """(exit status, the candidate's subject in the JSON report, the run's output)."""
    report = directory.parent / f"{directory.name}-report.json"
    parallel = ["-n", str(workers)] if workers > 1 else []
    run = attnspec_run(
        directory, "--impl", "mykernel:attention", "--claims", CLAIMS, "--require-sandbox",
        "--report-json", str(report), *parallel, *args, timeout=timeout,
    )  # fmt: skip
    assert report.exists(), (run.stdout + run.stderr)[-3000:]
    subjects = json.loads(report.read_text())["subjects"]
    subject = next(s for s in subjects if s["selector"] == "mykernel:attention")
    return run.returncode, subject, run.stdout + run.stderr


def received(server: socket.socket) -> bytes | None:
    """What reached ``server`` (a listening TCP socket or a bound UDP one), or None."""
    server.settimeout(0.1)
    try:
        if server.type == socket.SOCK_DGRAM:
            return server.recv(100)
        connection, _ = server.accept()
        with connection:
            return connection.recv(100) or b"(a connection)"
    except TimeoutError:
        return None


def files_of(directory: Path) -> set[str]:
    return {path.name for path in directory.iterdir()}


@pytest.fixture(params=[1, 2], ids=["serial", "-n 2"])
def workers(request) -> int:
    return request.param


@pytest.mark.parametrize("name", ["forged_ledger", "ini_plugin"])
def test_a_file_that_forges_the_verdict_is_not_loaded(tmp_path, workers, name):
    directory = planted(name, tmp_path)
    status, subject, output = judged(directory, workers=workers)
    assert status == 1, output[-3000:]
    assert subject["verdict"] == "FAILS", output[-3000:]
    assert subject["claims"]["MASK-PREFIX"]["verdict"] == "FAILED"
    assert subject["sandbox"] == "full"


def test_a_standard_library_name_beside_the_kernel_runs_in_no_process_of_the_judge(
    tmp_path, workers
):
    directory = planted("hmac_beside", tmp_path)
    status, subject, output = judged(directory, workers=workers)
    marks = sorted(name for name in files_of(directory) if name.startswith("hmac-ran-in-"))
    ran_in = [(directory / mark).read_text() for mark in marks]
    assert not marks, f"hmac.py ran in: {ran_in}"
    assert status == 0, output[-3000:]
    assert subject["verdict"] == "conforms"


def test_a_fork_server_is_isolated_from_the_candidates_directory(tmp_path, workers):
    directory = planted("zipfile_in_fork_server", tmp_path)
    status, subject, output = judged(directory, workers=workers)
    assert "escaped" not in files_of(directory), "the worker wrote outside its scratch"
    assert status == 0, output[-3000:]
    assert subject["verdict"] == "conforms"
    assert subject["sandbox"] == "full"


def test_a_worker_gets_no_secret_and_no_network(tmp_path, workers):
    directory = planted("sends_a_secret", tmp_path)
    with (
        socket.create_server(("127.0.0.1", 0)) as listener,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as datagrams,
    ):
        port = listener.getsockname()[1]
        datagrams.bind(("127.0.0.1", port))
        (directory / "port").write_text(str(port))
        status, subject, output = judged(directory, workers=workers)
        assert received(listener) is None, "the listener was reached"
        assert received(datagrams) is None, "a datagram arrived"
    assert status == 0, output[-3000:]
    assert subject["verdict"] == "conforms"


def test_a_worker_past_its_memory_bound_fails_that_test_and_the_run_goes_on(tmp_path):
    directory = planted("allocates_past_its_bound", tmp_path)
    status, subject, output = judged(directory, "--worker-memory", "1GiB")
    assert status == 1, output[-3000:]
    formula = subject["claims"]["MASK-PREFIX"]
    assert formula["verdict"] == "FAILED"
    assert "exceeded its memory bound of 1 GiB" in formula["first_failure"]["message"]
    # every test was run, each failing on its own: none was skipped as a dead implementation
    assert formula["skipped"] == 0
    assert formula["passed"] == 0


def test_an_implementation_that_hangs_stops_at_its_budget(tmp_path):
    directory = planted("hangs_every_second_call", tmp_path)
    started = time.monotonic()
    status, subject, output = judged(directory, "--call-timeout", "2", "--impl-budget", "5")
    seconds = time.monotonic() - started
    assert seconds < 60, f"the run took {seconds:.0f} s past a budget of 5 s"
    reasons = [r for c in subject["claims"].values() for r in c["skip_reasons"]]
    assert any("budget of 5 s (--impl-budget)" in reason for reason in reasons), output[-3000:]
    assert status == 1


@pytest.mark.parametrize(
    ("name", "named"),
    [
        ("forged_ledger", "the conftest {}/conftest.py"),
        ("ini_plugin", "the ini file {0}/pytest.ini; the plugin {0}/evilplug.py"),
        ("hmac_beside", "{}/hmac.py, which shadows the standard library's hmac"),
    ],
)
def test_plain_pytest_with_require_sandbox_refuses_the_directory(tmp_path, name, named):
    directory = planted(name, tmp_path)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "conformance", "--impl",
         "mykernel:attention", "--claims", CLAIMS, "--require-sandbox", "-p", "no:cacheprovider"],
        cwd=directory, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 4, (run.stdout + run.stderr)[-3000:]
    assert named.format(directory) in run.stdout + run.stderr


AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def test_a_worker_is_confined_as_an_ordinary_user_too(request):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to start the judge as nobody")
    # The judge starts this interpreter again (its pytest, its fork servers): nobody must be able
    # to, which an interpreter under root's home forbids (tests/test_sandbox.py confines a
    # process as nobody without starting another).
    again = subprocess.run([*AS_NOBODY, "/bin/sh", "-c", '"$0" -c pass', sys.executable])
    if again.returncode != 0:
        pytest.skip(f"nobody may not start {sys.executable} (its directories are closed to it)")
    # Beside tmp_path, whose parents an ordinary user may not enter.
    shared = Path(tempfile.mkdtemp(prefix="attnspec-judge-test-"))
    request.addfinalizer(lambda: shutil.rmtree(shared, ignore_errors=True))
    shared.chmod(0o755)
    directory = planted("sends_a_secret", shared)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        (directory / "port").write_text(str(listener.getsockname()[1]))
        report = shared / "report.json"
        environ = dict(os.environ, ATTNSPEC_PLANTED_SECRET=SECRET, PYTHONPATH=str(ROOT))
        shared.chmod(0o777)
        run = subprocess.run(
            [*AS_NOBODY, sys.executable, "-I", "-c", ATTNSPEC, str(ROOT), "run", "--impl",
             "mykernel:attention", "--claims", CLAIMS, "--require-sandbox", "--report-json",
             str(report)],
            cwd=directory, env=environ, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert received(listener) is None, "the listener was reached"
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    subject = next(
        s for s in json.loads(report.read_text())["subjects"] if s["selector"] is not None
    )
    assert subject["verdict"] == "conforms"
    assert subject["sandbox"] == "full"
