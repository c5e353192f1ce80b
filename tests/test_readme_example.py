"""The README's five-line implementation, exactly as written there, conforms; and the
CONTRACT-ERRORS conventions catch answers that follow none of them."""

from __future__ import annotations

import json
import re

import pytest

from tests.suite_process import ROOT, run_suite

PLANTED = "tests.planted.plain"


def first_python_block(heading: str) -> str:
    """The first ```python block of the README after ``heading``."""
    section = (ROOT / "README.md").read_text(encoding="utf-8").split(heading, 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def readme_example() -> str:
    return first_python_block("## Judge your kernel")


def readme_extension_example() -> str:
    """The extension section's example: the five-line callable with a softcap, importing what
    the five-line one does."""
    body = first_python_block("## Attention as kernels ship it: the extensions")
    return "import numpy as np\n\n\n" + body


def readme_backward_example() -> str:
    return first_python_block("## The backward: gradients of every feature")


ROW_TERM = "- (grad_out * (p @ v)).sum(-1, keepdims=True)"
V_SCALE = " * np.reshape(v_scale, (-1, 1, 1))"
FP8_HEADING = "## FP8: the scales, the formats, where P is rounded"
BACKWARD_CLAIMS = ("OUT-GRAD", "MASK-GRAD", "GRAD-DETERMINISM")
FP8_CLAIMS = ("FP8-SCALES", "FP8-FORMAT", "FP8-ACCURACY", "FP8-NAN")
SPARSE_HEADING = "## Which keys a query sees: masks, draft trees, top-k indices, cascades"
CAUSAL_TERM = " & ((j <= i) if causal else True)"


@pytest.fixture(scope="module")
def written_and_planted(tmp_path_factory):
    """One run judging the README's backward, FP8 and sparse examples as written, and each with
    one thing left out (the row term of dS; v's scale; the causal mask), on their claims: (the
    report's subjects by name, the run's output)."""
    examples = {
        "backward": (readme_backward_example(), ROW_TERM),
        "fp8": ("import numpy as np\n\n\n" + first_python_block(FP8_HEADING), V_SCALE),
        "sparse": ("import numpy as np\n\n\n" + first_python_block(SPARSE_HEADING), CAUSAL_TERM),
    }
    directory = tmp_path_factory.mktemp("readme_examples")
    for name, (example, left_out) in examples.items():
        assert left_out in example, name
        (directory / f"written_{name}.py").write_text(example)
        (directory / f"planted_{name}.py").write_text(example.replace(left_out, ""))
    report_path = directory / "report.json"
    selectors = [f"{kind}_{name}:attention" for name in examples for kind in ("written", "planted")]
    run = run_suite(
        *("--impl", ",".join(selectors), "-n", "2"),
        *("--claims", ",".join((*BACKWARD_CLAIMS, *FP8_CLAIMS, "SPARSE-KEYS"))),
        *("--report-json", str(report_path)),
        env_overrides={"PYTHONPATH": str(directory)},
    )
    assert run.returncode == 1, run.stdout[-4000:] + run.stderr[-2000:]
    subjects = {s["name"]: s["claims"] for s in json.loads(report_path.read_text())["subjects"]}
    return subjects, run.stdout


def assert_met(claims: dict, ids) -> None:
    for claim in ids:
        assert claims[claim]["verdict"] == "met", (claim, claims[claim])
        assert claims[claim]["passed"] > 0, claim


def test_the_readme_fp8_example_meets_the_fp8_claims_as_written(written_and_planted):
    """Written as the README shows it, the FP8 key/value cache callable meets FP8-SCALES,
    FP8-FORMAT, FP8-ACCURACY and FP8-NAN; with v's scale left out it fails FP8-SCALES, diagnosed
    as fp8-v-scale-dropped."""
    subjects, output = written_and_planted
    assert_met(subjects["written_fp8:attention"], FP8_CLAIMS)
    assert subjects["planted_fp8:attention"]["FP8-SCALES"]["verdict"] == "FAILED"
    assert "diagnosis: fp8-v-scale-dropped" in output, output[-4000:]


def test_the_readme_sparse_example_meets_sparse_keys_as_written(written_and_planted):
    """Written as the README shows it, the callable over each row's listed keys meets
    SPARSE-KEYS; with the causal mask left out it fails it."""
    subjects, _ = written_and_planted
    assert_met(subjects["written_sparse:attention"], ("SPARSE-KEYS",))
    assert subjects["planted_sparse:attention"]["SPARSE-KEYS"]["verdict"] == "FAILED"


def test_the_readme_backward_is_judged_on_the_gradients_and_meets_them_as_written(
    written_and_planted,
):
    """Written as the README shows it, the hand-written backward meets OUT-GRAD, MASK-GRAD and
    GRAD-DETERMINISM; with the row term of dS left out it fails OUT-GRAD."""
    subjects, _ = written_and_planted
    assert_met(subjects["written_backward:attention"], BACKWARD_CLAIMS)
    assert subjects["planted_backward:attention"]["OUT-GRAD"]["verdict"] == "FAILED"


def test_the_readme_extension_example_meets_softcap_as_written(suite, tmp_path):
    (tmp_path / "mykernel.py").write_text(readme_extension_example())
    report_path = tmp_path / "report.json"
    run = suite(
        *("--impl", "mykernel:attention", "--claims", "SOFTCAP,OUT-FORMULA"),
        *("--report-json", str(report_path)),
        env_overrides={"PYTHONPATH": str(tmp_path)},
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    (subject,) = [s for s in json.loads(report_path.read_text())["subjects"] if s["selector"]]
    assert subject["claims"]["SOFTCAP"]["verdict"] == "met"
    assert subject["claims"]["SOFTCAP"]["passed"] > 0


def test_the_readme_example_has_five_lines_of_code():
    body = [line for line in readme_example().splitlines() if line.startswith("    ")]
    assert len(body) == 5, body


def test_the_readme_example_conforms_as_written(suite, tmp_path):
    (tmp_path / "mykernel.py").write_text(readme_example())
    report_path = tmp_path / "report.json"
    run = suite(
        "--impl",
        "mykernel:attention",
        "-n",
        "2",
        "--report-json",
        str(report_path),
        env_overrides={"PYTHONPATH": str(tmp_path)},
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    (subject,) = [s for s in json.loads(report_path.read_text())["subjects"] if s["selector"]]
    assert subject["verdict"] == "conforms"
    assert subject["claims"]["CONTRACT-ERRORS"]["verdict"] == "met"
    assert subject["conventions"] == {
        "batch_axes": "broadcast",
        "mixed_dtypes": "promote",
        "nonfinite_scale": "nan",
        "unseen_rows": "nan",
    }


def test_answers_that_follow_no_convention_fail_contract_errors(suite, tmp_path):
    bad = {
        "unseen_rows_garbage": "neither all zero nor all NaN",
        "zeros_for_nonfinite_scale": "that are not NaN",
        "broadcasts_keys_wrongly": "returned the broadcast shape with wrong values",
        "promotes_to_a_third_dtype": "returned dtype float16, which is neither input's",
    }
    report_path = tmp_path / "report.json"
    run = suite(
        "--impl",
        ",".join(f"{PLANTED}:{name}" for name in ["correct", *bad]),
        "--claims",
        "CONTRACT-ERRORS",
        "--report-json",
        str(report_path),
    )
    assert run.returncode == 1, run.stdout[-4000:] + run.stderr[-2000:]
    verdicts = {s["name"]: s["verdict"] for s in json.loads(report_path.read_text())["subjects"]}
    assert verdicts[f"{PLANTED}:correct"] == "conforms"
    for name, message in bad.items():
        assert verdicts[f"{PLANTED}:{name}"] == "FAILS", name
        assert message in run.stdout, name
    # These calls have shapes of their own: a reproducer comment with a Case's shapes would lie.
    reproducers = [line for line in run.stdout.splitlines() if line.startswith("reproduce: ")]
    assert reproducers
    assert not [line for line in reproducers if "# B=" in line]


def test_the_readme_example_written_with_one_over_sqrt_fails_on_head_dim_0(suite, tmp_path):
    """What the README says of D = 0: the example raises only because Python's 0 ** -0.5 does."""
    example = readme_example()
    written_otherwise = example.replace("q.shape[-1] ** -0.5", "1 / np.sqrt(q.shape[-1])")
    assert written_otherwise != example
    (tmp_path / "mykernel.py").write_text(written_otherwise)
    run = suite(
        "--impl",
        "mykernel:attention",
        "--claims",
        "CONTRACT-ERRORS",
        "-k",
        "unattendable",
        env_overrides={"PYTHONPATH": str(tmp_path)},
    )
    assert run.returncode == 1, run.stdout[-4000:] + run.stderr[-2000:]
    failed = [line for line in run.stdout.splitlines() if line.startswith("FAILED")]
    assert failed, run.stdout[-4000:]
    assert all("head-dim-0" in line for line in failed), failed
