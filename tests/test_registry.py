"""Selecting implementations: built-ins, module:attr, entry points, and clear usage errors."""

from __future__ import annotations

import pytest

from conformance.run.selection import select
from impls import PlainCallable, RegistryError, resolve
from impls.registry import BUILTINS


def test_every_builtin_resolves_and_declares_itself():
    for name in BUILTINS:
        impl = resolve(name)
        assert impl.name == name
        assert impl.family in ("numpy", "torch", "jax", "cupy")
        assert impl.capabilities.dtypes


def test_module_attribute_gives_a_plain_callable():
    impl = resolve("tests.planted.plain:correct")
    assert isinstance(impl, PlainCallable)
    assert impl.capabilities.dtypes == ("float64", "float32")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "no_such_impl",
            "unknown implementation 'no_such_impl'; available: built-in: numpy_reference",
        ),
        ("tests.planted.plain", "to import one, write package.module:attribute"),
        ("tests.planted.nowhere:fn", "importing module 'tests.planted.nowhere' failed"),
        ("tests.planted.plain:missing", "has no attribute 'missing'; it has: "),
        (
            "tests.planted.plain:NOT_CALLABLE",
            "is a int, which is neither an attnspec Implementation",
        ),
        ("tests.planted.plain:wrong_signature", "cannot be called as fn(q, k, v, *, causal=True"),
        (":correct", "expected package.module:attribute"),
        ("  ", "empty implementation name"),
        ("nump", "did you mean 'numpy'"),
        ("torch_spda", "did you mean 'torch_sdpa'"),
    ],
)
def test_bad_names_are_usage_errors_naming_the_problem(name, message):
    with pytest.raises(RegistryError) as info:
        resolve(name)
    assert message in str(info.value)


def test_entry_points_are_found(monkeypatch):
    from importlib.metadata import EntryPoint

    import impls.registry as registry

    point = EntryPoint(
        name="vendor_kernel", value="tests.planted.plain:correct", group=registry.ENTRY_POINT_GROUP
    )
    monkeypatch.setattr(registry, "entry_points", lambda group: [point])
    assert resolve("vendor_kernel").name == "vendor_kernel"
    assert "entry points: vendor_kernel" in registry.available_names()


def names_selected(*args) -> list[str]:
    """The names :func:`select` gives, with its workers closed (and their output files gone)."""
    selection = select(*args)
    for selected in selection:
        selected.client.close()
    return [selected.client.name for selected in selection]


def test_selection_order_and_sources():
    assert names_selected(["numpy,numpy_reference", "numpy"]) == ["numpy", "numpy_reference"]
    assert names_selected(None, {"ATTNSPEC_IMPL": "torch_sdpa"}) == ["torch_sdpa"]
    assert names_selected(None, {}) == list(BUILTINS)


def test_two_names_for_one_implementation_are_rejected():
    with pytest.raises(RegistryError, match="both name an implementation called"):
        select(["numpy", "impls.numpy_vectorised:NumpyVectorised"])


@pytest.mark.parametrize("values", [[""], [" , "], ["", ","]])
def test_an_empty_impl_option_is_a_usage_error_not_every_builtin(values):
    with pytest.raises(RegistryError, match="names no implementation"):
        select(values)


def test_torchs_skip_hint_names_the_pinned_version(monkeypatch):
    """An unpinned torch pulls a CUDA build of several GB: the hint must not send users there."""
    from impls import torch_arrays, torch_sdpa

    monkeypatch.setattr(torch_arrays, "torch", None)
    reason = torch_sdpa.TorchSdpa.unavailable_reason(
        torch_sdpa.TorchSdpa.__new__(torch_sdpa.TorchSdpa)
    )
    assert "torch==2.13.0" in reason
    assert "attnspec[torch]" not in reason
