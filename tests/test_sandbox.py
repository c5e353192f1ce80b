"""The judge out of the judged's reach: implementations that forge or read the truth, signal or
trace the judge, leave a daemon or write files where the judge reads FAIL, and change nothing
else: not numpy's verdict beside them, not the report, not a concurrent run, not the files."""

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

from impls.sandbox import expected_confinement
from tests.suite_process import ROOT, run_module

PLANTED = "tests.planted.escaping"
ATTACKS = (
    "forges_the_truth",
    "reads_the_truth",
    "stops_the_judge",
    "terminates_the_judge",
    "kills_the_judge",
    "leaves_a_daemon_that_rewrites_the_report",
    "writes_files_where_the_judge_reads",
    "traces_the_judge",
)
MODES = ("serial", "xdist", "attnspec run")
# Past this, a run the attacks stopped or slowed counts as lost (each run takes seconds).
BOUND = 300
# The attacks fail by design: their failures need not be shrunk to minimal examples, which nothing
# here reads (half of each run's time otherwise).
VERDICTS_ONLY = ("--hypothesis-profile", "verdicts")

pytestmark = pytest.mark.skipif(
    expected_confinement().level != "full",
    reason=f"workers cannot be fully confined here: {expected_confinement().describe()}",
)


def judged(report: Path) -> dict[str, dict]:
    return {s["name"]: s for s in json.loads(report.read_text())["subjects"]}


def planted_run(
    mode: str,
    tmp_path: Path,
    *extra: str,
    impls: tuple[str, ...] = ("numpy", *(f"{PLANTED}:{name}" for name in ATTACKS)),
    claims: str = "OUT-FORMULA",
) -> tuple[subprocess.CompletedProcess, Path]:
    """numpy and every attack (or ``impls``) judged on OUT-FORMULA (or ``claims``): serially,
    under -n 2, or through attnspec run; the files the attacks aim at are named by
    ATTNSPEC_PLANTED_MARK."""
    report = tmp_path / f"{mode}.json"
    options = ["--impl", ",".join(impls), "--claims", claims, "--report-json", str(report), *extra]
    env = {"ATTNSPEC_PLANTED_MARK": str(tmp_path / "mark")}
    if mode == "attnspec run":
        run = run_module(
            "conformance", "run", *options, "-n", "2", "--profile", "verdicts",
            timeout=BOUND, env=env,
        )  # fmt: skip
    else:
        parallel = ["-n", "2"] if mode == "xdist" else []
        run = run_module(
            "pytest", "conformance", "-p", "no:cacheprovider", *options, *parallel, *VERDICTS_ONLY,
            timeout=BOUND, env=env,
        )  # fmt: skip
    return run, report


@pytest.mark.parametrize("mode", MODES)
def test_every_attack_fails_and_changes_nothing_else(tmp_path, mode):
    concurrent_report = tmp_path / "concurrent.json"
    concurrent = subprocess.Popen(
        [sys.executable, "-m", "pytest", "conformance", "-p", "no:cacheprovider", "-q",
         "--impl", "tests.planted.plain:correct", "--claims", "OUT-FORMULA",
         "--report-json", str(concurrent_report)],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    started = time.monotonic()
    run, report = planted_run(mode, tmp_path)
    output = run.stdout + run.stderr
    assert run.returncode == 1, output[-4000:]
    assert time.monotonic() - started < BOUND
    subjects = judged(report)
    assert subjects["numpy"]["verdict"] == "conforms"
    assert subjects["numpy"]["sandbox"] == "full"
    for name in ATTACKS:
        assert subjects[f"{PLANTED}:{name}"]["verdict"] == "FAILS", name
        assert subjects[f"{PLANTED}:{name}"]["sandbox"] == "full", name
    time.sleep(1)  # what a daemon would do once the judge has gone
    assert judged(report)["numpy"]["verdict"] == "conforms"  # the report as the judge wrote it
    assert not list(tmp_path.glob("mark*")), list(tmp_path.glob("mark*"))
    assert not (ROOT / "mark.py").exists()
    assert not (ROOT / "conformance" / "mark.py").exists()
    assert concurrent.wait(timeout=BOUND) == 0
    assert judged(concurrent_report)["tests.planted.plain:correct"]["verdict"] == "conforms"
    if mode != "attnspec run":  # its progress goes to the terminal; pytest's output is checked
        for attempt in ("forge the truth", "read the truth", "send SIGSTOP", "ptrace", "write"):
            assert f"planted {attempt}" in output, attempt
        done = [line for line in output.splitlines() if ": done:" in line]
        assert all("/scratch-" in line for line in done), done  # its own HOME only


HOARDING = "tests.planted.hoarding"
# Each hoarder, right on every call, and the bound its failure must name.
HOARDERS = {
    "fills_its_disk": "--worker-disk",
    "keeps_children_past_its_bound": "--worker-processes",
}
SMALL_BOUNDS = ("--worker-disk", "64MiB", "--worker-processes", "64")  # each hoards 96 past it


# Right on every call, wrong once it sees a process naming pytest (the judge) in /proc.
PRYING = "tests.planted.prying:answers_wrongly_once_it_sees_the_judge"


@pytest.mark.parametrize("mode", MODES)
def test_a_kernel_that_takes_the_disk_or_the_process_table_fails_naming_the_bound(tmp_path, mode):
    """Unbounded, both conform while the machine's disk and process table fill (seen with
    --worker-disk 0 --worker-processes 0); within the bounds, each call fails naming its bound,
    numpy beside them conforms, and nothing either made outlives the run. Beside them, a kernel
    that answers wrongly once it sees the judge in /proc conforms: its worker's PID namespace
    shows it its own processes alone (unconfined it FAILS: the test after the next)."""
    impls = ("numpy", PRYING, *(f"{HOARDING}:{name}" for name in HOARDERS))
    run, report = planted_run(mode, tmp_path, *SMALL_BOUNDS, impls=impls, claims="MASK-PREFIX")
    assert run.returncode == 1, (run.stdout + run.stderr)[-4000:]
    subjects = judged(report)
    assert subjects["numpy"]["verdict"] == "conforms"
    assert subjects[PRYING]["verdict"] == "conforms", subjects[PRYING]["claims"]
    for name, option in HOARDERS.items():
        subject = subjects[f"{HOARDING}:{name}"]
        assert subject["verdict"] == "FAILS", name
        message = subject["claims"]["MASK-PREFIX"]["first_failure"]["message"]
        assert option in message, message
    survivors = [comm for comm in Path("/proc").glob("[0-9]*/comm") if _named_hoard(comm)]
    assert survivors == [], survivors


@pytest.mark.parametrize("name", sorted(HOARDERS))
def test_a_bench_of_a_kernel_past_its_bounds_times_nothing_and_names_the_bound(name):
    bench = run_module(
        "conformance", "bench", "--impl", f"{HOARDING}:{name}", "--baseline", "numpy",
        "--shape", "1,2,2,64,64,32", *SMALL_BOUNDS, timeout=BOUND,
    )  # fmt: skip
    printed = bench.stdout + bench.stderr
    assert bench.returncode == 1, printed[-4000:]
    assert f"not timed: {HOARDING}:{name}" in printed, printed[-4000:]
    assert HOARDERS[name] in printed, printed[-4000:]


def test_a_bench_of_a_kernel_looking_for_the_judge_finds_none():
    """The bench's workers are confined as the run's are: the prying kernel, wrong once it sees
    a process naming pytest or the bench, is right on its first (checked) call and timed."""
    bench = run_module(
        "conformance", "bench", "--impl", PRYING, "--baseline", "numpy",
        "--shape", "1,2,2,64,64,32", "--rounds", "3", timeout=BOUND,
    )  # fmt: skip
    printed = bench.stdout + bench.stderr
    assert "is wrong" not in printed, printed[-4000:]
    assert PRYING in bench.stdout, printed  # its row in the table


def _named_hoard(comm: Path) -> bool:
    try:
        return comm.read_bytes().strip() == b"attnspec-hoard"
    except OSError:  # gone meanwhile
        return False


COLLUDING = "tests.planted.colluding"
CHANNELS = {"files": "files in /dev/shm", "sysv": "SysV shared memory",
            "message_queue": "POSIX message queues"}  # fmt: skip
HONEST = tuple(f"{COLLUDING}:honest_through_{channel}" for channel in CHANNELS)
PARASITES = tuple(f"{COLLUDING}:parasite_through_{channel}" for channel in CHANNELS)
MEMORY_PLANTINGS = (f"{COLLUDING}:maps_shared_memory", f"{COLLUDING}:fills_dev_shm")
PLANTED_BOUND = ("--worker-memory", "512MiB")  # the plantings hold 768 MiB past it
# A claim whose every answer fits the message queues an ordinary user may fill (238 KB in all):
# with one the queues could not hold, the parasite through them would fail for want of room.
COLLUDED_CLAIM = "MASK-PREFIX"


def machine_shared_state() -> dict[str, list[str]]:
    """What a candidate could leave behind for another: the planted files in the machine's
    /dev/shm and every SysV IPC object of the machine's IPC namespace (POSIX queues have no
    listing without mounting their file system)."""
    state = {"/dev/shm": sorted(n for n in os.listdir("/dev/shm") if n.startswith("attnspec-"))}
    for kind in ("shm", "sem", "msg"):
        lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
        state[f"SysV {kind}"] = sorted(line.split()[0] + " " + line.split()[1] for line in lines)
    return state


def verdict_and_message(subject: dict) -> tuple[str, str]:
    first = subject["claims"][COLLUDED_CLAIM]["first_failure"]
    return subject["verdict"], first["message"] if first else ""


@pytest.mark.parametrize("mode", MODES)
def test_colluding_candidates_find_nothing_and_leave_nothing(tmp_path, mode):
    """Honest kernels leave every answer in /dev/shm, SysV shared memory and POSIX message
    queues; the parasites judged beside them find none (each worker has its own IPC namespace
    and /dev/shm) and FAIL; the plantings that hold memory RLIMIT_DATA does not count FAIL with
    the memory bound's message; nothing of the run stays on the machine."""
    before = machine_shared_state()
    impls = (*[x for pair in zip(HONEST, PARASITES, strict=True) for x in pair], *MEMORY_PLANTINGS)
    run, report = planted_run(
        mode, tmp_path, "--require-sandbox", *PLANTED_BOUND, impls=impls, claims=COLLUDED_CLAIM
    )
    output = run.stdout + run.stderr
    assert run.returncode == 1, output[-4000:]
    subjects = judged(report)
    for name in HONEST:
        assert subjects[name]["verdict"] == "conforms", verdict_and_message(subjects[name])
    for name in (*PARASITES, *MEMORY_PLANTINGS):
        assert subjects[name]["verdict"] == "FAILS", name
        assert subjects[name]["sandbox"] == "full", subjects[name]["sandbox"]
    for name in MEMORY_PLANTINGS:
        message = verdict_and_message(subjects[name])[1]
        assert "exceeded its memory bound of 512 MiB" in message, message
    if mode != "attnspec run":  # its progress goes to the terminal; pytest's output is checked
        for channel in CHANNELS.values():
            assert f"planted parasite through {channel}: no answer" in output, channel
            assert f"planted parasite through {channel}: found answer" not in output, channel
    assert machine_shared_state() == before


def test_a_later_run_finds_nothing_an_earlier_one_left(tmp_path):
    """The cross-run channel: an earlier run's honest kernels leave their answers, and a later
    run judges the parasites alone on the same (default) seed."""
    before = machine_shared_state()
    earlier, _ = planted_run("serial", tmp_path, impls=HONEST, claims=COLLUDED_CLAIM)
    assert earlier.returncode == 0, (earlier.stdout + earlier.stderr)[-4000:]
    later, report = planted_run("serial", tmp_path, impls=PARASITES, claims=COLLUDED_CLAIM)
    assert later.returncode == 1, (later.stdout + later.stderr)[-4000:]
    assert {s["verdict"] for s in judged(report).values() if s["selector"]} == {"FAILS"}
    assert machine_shared_state() == before


@pytest.mark.parametrize("channel", CHANNELS)
def test_no_channel_carries_answers_into_a_bench(channel):
    """attnspec bench times the parasite with the honest kernel as its baseline, on the same
    inputs: the parasite's first call is checked, finds nothing, and is not timed."""
    before = machine_shared_state()
    bench = run_module(
        "conformance", "bench", "--impl", f"{COLLUDING}:parasite_through_{channel}",
        "--baseline", f"{COLLUDING}:honest_through_{channel}", "--shape", "1,2,2,64,64,32",
        "--rounds", "3", "--dtype", "float32", timeout=BOUND,
    )  # fmt: skip
    assert bench.returncode == 1, (bench.stdout + bench.stderr)[-3000:]
    assert "is wrong in its first call, before any timing" in bench.stdout + bench.stderr
    assert machine_shared_state() == before


def test_unconfined_a_worker_writes_where_it_likes_but_cannot_read_the_sealed_truth(tmp_path):
    """What the tests above would see without the sandbox (--no-sandbox): the write goes
    through, and the kernel that looks for the judge in /proc sees it. The truth is sealed under
    the run's secret all the same (conformance/judge/truth.py): reading the entries numpy's
    judgement left passes nothing."""
    report = tmp_path / "report.json"
    impls = f"numpy,{PLANTED}:reads_the_truth,{PLANTED}:writes_beside_the_mark,{PRYING}"
    run = run_module(
        "pytest", "conformance", "-p", "no:cacheprovider", "--impl", impls,
        "--claims", "OUT-FORMULA", "--no-sandbox", "--report-json", str(report), *VERDICTS_ONLY,
        env={"ATTNSPEC_PLANTED_MARK": str(tmp_path / "mark")},
    )  # fmt: skip
    assert run.returncode == 1, run.stdout[-3000:]
    assert (tmp_path / "mark.written").exists()
    assert "planted read the truth: done: no entry for these inputs" in run.stdout
    subjects = judged(report)
    assert subjects[f"{PLANTED}:writes_beside_the_mark"]["sandbox"] == "none (--no-sandbox)"
    reader = subjects[f"{PLANTED}:reads_the_truth"]["claims"]["OUT-FORMULA"]
    assert reader["passed"] == 0, reader
    assert subjects[PRYING]["verdict"] == "FAILS"  # it saw the judge


@pytest.mark.parametrize(
    ("abi", "level"),
    [("0", "none (the kernel offers no Landlock"), ("5", "partial (Landlock ABI 5")],
)
def test_a_kernel_that_cannot_confine_is_said_and_refused_on_request(abi, level):
    env = {"ATTNSPEC_LANDLOCK_ABI": abi}
    run = run_module(
        "pytest", "conformance", "-p", "no:cacheprovider", "--impl", "numpy",
        "--claims", "SCORE-SHAPE", env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:]
    assert f"attnspec: sandbox: {level}" in run.stdout
    assert "judged UNCONFINED: sandbox " + level in run.stdout
    refused = run_module(
        "pytest", "conformance", "-p", "no:cacheprovider", "--impl", "numpy",
        "--require-sandbox", env=env,
    )  # fmt: skip
    assert refused.returncode == 4
    assert "--require-sandbox, but workers would run " + level in refused.stderr


# Loads impls/sandbox.py by its path (it needs only the standard library), so that an ordinary
# user runs it whether or not the site-packages of this interpreter are readable to it.
CONFINED_PROCESS = """
import ctypes, importlib.util, os, resource, socket, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("sandbox", sys.argv[3])
sandbox = sys.modules["sandbox"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sandbox)
scratch, parent, port = Path(sys.argv[1]), os.getppid(), int(sys.argv[4])
bounds = sandbox.WorkerBounds(memory_bytes=1 << 30, disk_bytes=64 << 20, tasks=64)
print("confined", sandbox.confine(scratch, sys.path, bounds).describe())
print("data bound", resource.getrlimit(resource.RLIMIT_DATA)[0])
print("tasks bound", resource.getrlimit(resource.RLIMIT_NPROC)[0])
(scratch / "written").write_text("ok")
disk = os.statvfs(scratch)
print("scratch", (scratch / "written").read_text(), disk.f_blocks * disk.f_frsize)
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for what, attempt in [
    ("write outside", lambda: Path(sys.argv[2]).write_text("escaped")),
    ("list /tmp", lambda: os.listdir("/tmp")),
    ("signal the parent", lambda: os.kill(parent, 0)),
    ("read the parent's memory", lambda: open(f"/proc/{parent}/mem", "rb")),
    ("connect to the loopback", lambda: socket.create_connection(("127.0.0.1", port), 2)),
    ("send UDP", lambda: udp.sendto(b"secret", ("127.0.0.1", port))),
    ("allocate past the bound", lambda: bytearray(2 << 30)),
    ("write past the disk bound", lambda: (scratch / "hoard").write_bytes(bytes(96 << 20))),
]:
    try:
        attempt()
        print("ALLOWED", what)
    except (OSError, MemoryError):
        print("refused", what)
libc = ctypes.CDLL(None, use_errno=True)
print("refused ptrace" if libc.ptrace(16, parent, 0, 0) != 0 else "ALLOWED ptrace")
kinds = ("ipc", "mnt", "net", "pid")
print("namespaces", *(os.readlink(f"/proc/self/ns/{kind}") for kind in kinds))
print("processes seen", sorted(int(entry) for entry in os.listdir("/proc") if entry.isdigit()))
shm = os.statvfs("/dev/shm")
print("/dev/shm size", shm.f_blocks * shm.f_frsize)
(Path("/dev/shm") / sys.argv[5]).write_text("left for another")
libc.shmget.argtypes = (ctypes.c_int, ctypes.c_size_t, ctypes.c_int)
print("SysV segment", libc.shmget(int(sys.argv[6]), 4096, 0o1000 | 0o600) >= 0)
status = Path("/proc/self/status").read_text().splitlines()
print("capabilities", [line for line in status if line.startswith("CapEff")][0].split()[1])
children = []
read_end, write_end = os.pipe()
try:
    while len(children) < 80:
        child = os.fork()
        if child == 0:
            os.close(write_end)
            os.read(read_end, 1)  # until the parent closes its end
            os._exit(0)
        children.append(child)
    print("tasks past the bound: allowed")
except OSError:
    print("tasks past the bound: refused after", len(children))
os.close(write_end)
for child in children:
    os.waitpid(child, 0)
"""


@pytest.mark.parametrize("user", ["this one", "an ordinary one"])
def test_a_confined_process_can_write_only_its_scratch_as_root_and_as_an_ordinary_user(
    request, user
):
    command = [sys.executable, "-c", CONFINED_PROCESS]
    if user == "an ordinary one":
        if os.geteuid() != 0 or shutil.which("setpriv") is None:
            pytest.skip("needs root and setpriv to start a process as nobody")
        command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *command]
    # Beside tmp_path, whose parents an ordinary user may not enter.
    shared = Path(tempfile.mkdtemp(prefix="attnspec-sandbox-test-"))
    request.addfinalizer(lambda: shutil.rmtree(shared, ignore_errors=True))
    shared.chmod(0o777)
    scratch = shared / "scratch"
    scratch.mkdir()
    scratch.chmod(0o777)
    outside = shared / "outside"
    left_in_shm = f"attnspec-sandbox-test-{os.getpid()}"
    segment_key = 0x5A000000 + os.getpid()
    before = machine_shared_state()
    with socket.create_server(("127.0.0.1", 0)) as listener:  # what a leaked secret would reach
        listener.settimeout(0.5)
        port = str(listener.getsockname()[1])
        sandbox = str(ROOT / "impls" / "sandbox.py")
        run = subprocess.run(
            [*command, str(scratch), str(outside), sandbox, port, left_in_shm, str(segment_key)],
            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        with pytest.raises(TimeoutError):
            listener.accept()
    assert run.returncode == 0, run.stderr
    assert "confined full" in run.stdout
    assert "ALLOWED" not in run.stdout, run.stdout
    assert [line.startswith("refused ") for line in run.stdout.splitlines()].count(True) == 9
    assert f"data bound {1 << 30}" in run.stdout
    assert "tasks bound 64" in run.stdout
    assert "capabilities 0000000000000000" in run.stdout
    # its scratch a tmpfs of its disk bound, which the kernel holds it to, gone with it
    assert f"scratch ok {64 << 20}" in run.stdout
    assert not (scratch / "written").exists()
    assert not outside.exists()
    # An ordinary user's fork past the bound the kernel refuses (its tasks counted in its own
    # user namespace); root's it never refuses (RLIMIT_NPROC exempts uid 0 whatever the
    # namespace), so there the judge counts a worker's tasks and stops it at the bound
    # (conformance.run.memory_watch; the hoarding kernels' test above).
    # (its tasks: its relay outside its PID namespace, that namespace's process 1, itself, and
    # 61 children)
    refused = "tasks past the bound: refused after 61" in run.stdout
    assert refused == (user == "an ordinary one" or os.geteuid() != 0), run.stdout
    # its own IPC, mount and network namespaces, and a /dev/shm of its bound, gone with it
    namespaces = next(line for line in run.stdout.splitlines() if line.startswith("namespaces"))
    for kind in ("ipc", "mnt", "net", "pid"):
        assert os.readlink(f"/proc/self/ns/{kind}") not in namespaces.split(), namespaces
    assert f"/dev/shm size {1 << 30}" in run.stdout
    # its PID namespace's process 1 and itself, no process of the machine's
    assert "processes seen [1, 2]" in run.stdout, run.stdout
    assert "SysV segment True" in run.stdout
    assert not (Path("/dev/shm") / left_in_shm).exists()
    assert machine_shared_state() == before
