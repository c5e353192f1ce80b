"""The shared float64 truth: the same verdicts with and without it, and a damaged entry is
recomputed, never trusted."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conformance.judge.truth import CaseTruth, TruthCache, inputs_digest
from spec.formula import naive_baseline


def computed_by(cache: TruthCache, q: np.ndarray, params: dict, calls: list) -> np.ndarray:
    def compute():
        calls.append(params)
        return q * (2.0 if params["causal"] else 3.0)

    return cache.get("attention", inputs_digest(q), params, compute)


def test_an_entry_is_computed_once_and_keyed_by_inputs_and_parameters(tmp_path):
    cache, calls = TruthCache(tmp_path), []
    q = np.arange(6.0).reshape(2, 3)
    first = computed_by(cache, q, {"causal": True}, calls)
    again = computed_by(cache, q.copy(), {"causal": True}, calls)
    other = computed_by(cache, q, {"causal": False}, calls)
    changed = computed_by(cache, q + 1, {"causal": True}, calls)
    assert len(calls) == 3  # the second call had the first's entry
    np.testing.assert_array_equal(again, first)
    np.testing.assert_array_equal(other, 3 * q)
    np.testing.assert_array_equal(changed, 2 * (q + 1))
    another_process = TruthCache(tmp_path, cache.secret)  # nothing in memory: it reads the entry
    np.testing.assert_array_equal(computed_by(another_process, q, {"causal": True}, calls), 2 * q)
    assert len(calls) == 3
    assert another_process.reused == 1


def test_a_process_keeps_what_it_read_read_only_and_within_its_memory(tmp_path, monkeypatch):
    """The entries a process has seen are handed out again without reading the file (every
    implementation asks for the same ones), as read-only arrays, since each caller gets the
    same array; the least recently used go first once they pass REMEMBERED_BYTES."""
    import conformance.judge.truth

    monkeypatch.setattr(conformance.judge.truth, "REMEMBERED_BYTES", 2 * 12 * 8)
    cache, calls = TruthCache(tmp_path), []
    arrays = [np.full((3, 4), float(n)) for n in range(3)]
    first = computed_by(cache, arrays[0], {"causal": True}, calls)
    assert not first.flags.writeable
    for entry in tmp_path.glob("*.npy"):
        entry.unlink()  # only the process's memory can answer now
    assert computed_by(cache, arrays[0], {"causal": True}, calls) is first
    assert len(calls) == 1
    computed_by(cache, arrays[1], {"causal": True}, calls)
    computed_by(cache, arrays[2], {"causal": True}, calls)  # the third: the first is dropped
    assert cache.remembered_bytes <= 2 * 12 * 8
    for entry in tmp_path.glob("*.npy"):
        entry.unlink()
    np.testing.assert_array_equal(computed_by(cache, arrays[0], {"causal": True}, calls), 0.0)
    assert len(calls) == 4


@pytest.mark.parametrize("damage", ["flip a payload byte", "truncate", "empty"])
def test_a_damaged_entry_is_recomputed_not_trusted(tmp_path, damage):
    cache, calls = TruthCache(tmp_path), []
    q = np.linspace(-1, 1, 12).reshape(3, 4)
    computed_by(cache, q, {"causal": True}, calls)
    (entry,) = tmp_path.glob("*.npy")
    data = bytearray(entry.read_bytes())
    if damage == "flip a payload byte":
        data[-1] ^= 0x40  # the last float's low bits: still a loadable array, but not the truth
    elif damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data = bytearray()
    entry.write_bytes(bytes(data))
    another_process = TruthCache(tmp_path, cache.secret)  # what it did not write, it reads
    value = computed_by(another_process, q, {"causal": True}, calls)
    np.testing.assert_array_equal(value, 2 * q)
    assert len(calls) == 2
    assert another_process.rejected == 1


def test_entries_are_sealed_under_the_runs_secret(tmp_path):
    """What another run, or an implementation that reaches the directory, can do: not find the
    entry for its inputs, not read one, and not pass off one of its own."""
    run, calls = TruthCache(tmp_path), []
    q = np.linspace(-1, 1, 12).reshape(3, 4)
    computed_by(run, q, {"causal": True}, calls)
    (entry,) = tmp_path.glob("*.npy")
    assert q.tobytes() not in entry.read_bytes()
    assert (2 * q).tobytes() not in entry.read_bytes()
    outsider = TruthCache(tmp_path)  # a secret of its own, as every other process has
    assert outsider.path_of("attention", inputs_digest(q), {"causal": True}) != entry
    assert outsider._read(entry) is None
    assert outsider.rejected == 1
    forged = outsider.path_of("attention", inputs_digest(q), {"causal": True})
    outsider._write(forged, np.zeros_like(q))
    entry.write_bytes(forged.read_bytes())  # the forgery under the name the run looks up
    value = computed_by(TruthCache(tmp_path, secret=run.secret), q, {"causal": True}, calls)
    np.testing.assert_array_equal(value, 2 * q)
    assert len(calls) == 2  # rejected and recomputed


def test_verdicts_are_the_same_with_and_without_the_shared_truth(suite, tmp_path):
    # Serial: under xdist the order in which tests finish, and so the order of failing tests
    # and which failure comes first, varies from run to run whatever the truth.
    reports = {}
    for mode, flags in (("shared", ()), ("per test", ("--no-truth-cache",))):
        path = tmp_path / f"{mode.replace(' ', '-')}.json"
        run = suite(
            "--impl",
            "numpy,tests.zoo.mutants:mask_off_by_one",
            "--claims",
            "OUT-FORMULA,MASK-PREFIX,OUT-CONVEX",
            # the mutant's failures unshrunk (derandomized, so the same in both runs)
            "--hypothesis-profile",
            "verdicts",
            "--report-json",
            str(path),
            *flags,
        )
        assert run.returncode == 1, run.stdout[-3000:]  # the mutant fails
        reports[mode] = json.loads(path.read_text())
    assert reports["shared"]["subjects"] == reports["per test"]["subjects"]


@pytest.mark.parametrize(
    "variant",
    [{}, {"causal": False}, {"scale": 0.3}, {"window": 5}, {"key_lengths": np.array([40, 17])}],
    ids=["causal", "full", "scale", "window", "key-lengths"],
)
def test_the_float64_baseline_is_the_oracle_bit_for_bit(variant):
    """The truth hands out the oracle as the float64 naive baseline, without computing it: the
    two must be the same arrays, or a float64 budget would be measured against something else."""
    rng = np.random.default_rng(0)
    q, k, v = (30 * rng.standard_normal((2, 3, 40, 16)) for _ in range(3))
    with np.errstate(invalid="ignore"):  # rows that see no key (key lengths) are NaN in both
        expected = naive_baseline(q, k, v, dtype="float64", **variant)
        found = CaseTruth(q, k, v).baseline(dtype="float64", **variant)
    assert (found.dtype, found.shape) == (expected.dtype, expected.shape)
    assert np.array_equal(found.view(np.uint8), expected.view(np.uint8))
