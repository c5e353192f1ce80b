"""The worker process: the implementation's end of the worker line, serving one selector.

The judge (``conformance/``) never imports an implementation's module. It runs this module in a
process of its own (forked by :mod:`impls.fork_server`, or ``python -m impls.worker_process FD
PATHS SELECTOR SCRATCH``), which resolves the selector, says what the implementation declares
(:class:`impls.messages.Ready`), and then answers each :class:`impls.messages.Call`: NumPy
arrays in, NumPy arrays out, with everything the contract does on native arrays (conversion, the
call, autograd) done here. Whatever the implementation raises, prints or patches stays in this
process; a crash or a hang ends it and nothing else.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import faulthandler
import functools
import json
import os
import sys
import traceback
import zlib
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from impls.bench_inputs import (
    BLOCK_QUERY_DTYPE,
    fresh_block_call,
    fresh_fp8_inputs,
    fresh_inputs,
)
from impls.block_scaled_calls import cache_format
from impls.capabilities import operand_layouts
from impls.contract import Implementation
from impls.device_clock import AnswerStillWritten, DeviceClock
from impls.messages import (
    OPS,
    SEVERAL_OUTPUTS,
    Answered,
    Broke,
    Call,
    Close,
    Description,
    InputArray,
    NotChecked,
    NotResolved,
    OutputArray,
    Raised,
    Ready,
    Timed,
    receive,
    send,
)
from impls.sandbox import Confinement, WorkerBounds, become_subreaper, confine
from spec.block_scaled import BLOCK_FORMATS, PAGED_SCALES, stored_dtypes, unread_bytes
from spec.formula import page_pool
from spec.fp8 import FP8_FORMATS

Answer = Answered | Timed | Raised | Broke | NotChecked


def describe(impl) -> Description:
    """What the judge needs to know of an implementation, in its own words (how far its worker is
    confined is the judge's to say, not the worker's: the judge sets ``sandbox``)."""
    return Description(
        name=impl.name,
        family=impl.family,
        device=impl.device,
        version=impl.version(),
        capabilities=impl.capabilities,
        unavailable_reason=impl.unavailable_reason(),
        call_timeout=getattr(impl, "call_timeout", None),
    )


def returned(impl, native, input_device: str) -> OutputArray:
    """A native array as plain data; a TypeError names what breaks the contract."""
    try:
        array = impl.to_numpy(native)
        dtype = impl.dtype_name(native)
        device = impl.device_of(native)
    except Exception as exc:
        raise TypeError(
            f"returned {type(native).__module__}.{type(native).__qualname__}, which its own "
            f"to_numpy/dtype_name cannot read ({type(exc).__name__}: {exc})"
        ) from None

    if not isinstance(array, np.ndarray):
        raise TypeError(f"to_numpy gave {type(array).__qualname__}, but should give numpy.ndarray")
    if array.dtype.type.__module__.startswith("ml_dtypes"):
        # ml_dtypes' bfloat16 and FP8, widened exactly: the judge reads NumPy's own dtypes only
        array = array.astype(np.float32)
    return OutputArray(array, dtype, device, input_device)


INPUT_NAMES = ("q", "k", "v", "grad_out", "grad_lse")


def snapshot(impl, natives: list) -> list:
    """Copies of the native inputs' values as the implementation is handed them (after its own
    conversion, which may round), or None where it cannot read them back."""

    copies = []
    for native in natives:
        try:
            copies.append(np.array(impl.to_numpy(native), dtype=np.float64, copy=True))
        except Exception:
            copies.append(None)
    return copies


def changed_inputs(impl, natives: list, before: list) -> str | None:
    """What the call changed in its inputs, if anything: a caller's arrays must come back as
    they went in (a kernel that scales q in place corrupts whatever the caller does next)."""

    for name, native, original in zip(INPUT_NAMES, natives, before, strict=False):
        if original is None:
            continue
        try:
            after = np.asarray(impl.to_numpy(native), dtype=np.float64)
        except Exception:
            continue
        if after.shape != original.shape:
            return f"changed the shape of its input {name} in place"
        differs = ~((after == original) | (np.isnan(after) & np.isnan(original)))
        if differs.any():
            return (
                f"changed its input {name} in place ({int(differs.sum())} of {differs.size} "
                "values): a caller's arrays must come back as they went in"
            )
    return None


class LayoutUnavailable(Exception):
    """The suite's own default helpers cannot make a layout's views of this implementation's
    arrays: the layout is not checked, and the implementation is not blamed."""


def suite_view(impl, helper: str, layout: str, make: Callable[[], Any]) -> Any:
    """``make()``: a view made with ``impl``'s ``helper`` (permuted, broadcast, or the native
    slicing none overrides). Where the implementation defines the helper, its failure is its own;
    where the suite's default made the view, the failure is the suite's (LayoutUnavailable)."""
    own = helper != "slicing" and getattr(type(impl), helper) is not getattr(Implementation, helper)
    try:
        return make()
    except Exception as exc:
        if own:
            raise
        how, remedy = (
            ("slicing its arrays", "return arrays that slice as NumPy's do")
            if helper == "slicing"
            else (f"the default Implementation.{helper}()", f"define {helper}()")
        )
        raise LayoutUnavailable(
            f"the suite cannot make {layout} views of {impl.name}'s {impl.family} arrays: {how} "
            f"raised {type(exc).__name__}: {exc}. To have it checked, {remedy}, or inherit the "
            "family's mixin (impls.torch_arrays.TorchArrays, impls.jax_arrays.JaxArrays, "
            "impls.cupy_arrays.CupyArrays)"
        ) from None


def laid_out(impl, arrays: tuple[InputArray, ...], layout: str) -> list:
    """The inputs as native arrays in ``layout`` (impls.capabilities.LAYOUTS, or a mixed layout
    of impls.capabilities.operand_layouts): q, k and v as views into larger arrays made by the
    implementation's own conversion, anything after them dense."""
    if layout == "contiguous":
        return [impl.from_numpy(a.array, a.dtype) for a in arrays]
    natives = [impl.from_numpy(a.array, a.dtype) for a in arrays[3:]]
    q, k, v = (a.array for a in arrays[:3])
    dtype = arrays[0].dtype
    view = functools.partial(suite_view, impl, layout=layout)
    if layout == "packed_qkv":
        if not q.shape == k.shape == v.shape:
            raise ValueError(f"packed_qkv needs one shape: q {q.shape}, k {k.shape}, v {v.shape}")
        projection = impl.from_numpy(
            np.stack([x.transpose(0, 2, 1, 3) for x in (q, k, v)], axis=2), dtype
        )  # (B, T, 3, H, D)
        parts = [view("slicing", make=lambda i=i: projection[:, :, i]) for i in range(3)]
        views = [
            view("permuted", make=functools.partial(impl.permuted, x, (0, 2, 1, 3))) for x in parts
        ]
        return views + natives
    views = [
        operand_view(impl, x, dtype, operand_layout, view)
        for x, operand_layout in zip((q, k, v), operand_layouts(layout).values(), strict=True)
    ]
    return views + natives


def operand_view(impl, x: np.ndarray, dtype: str, operand_layout: str, view) -> Any:
    """One operand as a native array in its own layout; ``view`` makes a view with the suite's
    or the implementation's helper (suite_view)."""
    if operand_layout == "contiguous":
        return impl.from_numpy(x, dtype)
    if operand_layout == "heads_last":
        stored = impl.from_numpy(x.transpose(0, 2, 1, 3), dtype)  # (B, T, H, D)
        return view("permuted", make=functools.partial(impl.permuted, stored, (0, 2, 1, 3)))
    if operand_layout == "row_gaps":
        wide = np.full((*x.shape[:-1], x.shape[-1] + ROW_GAP), np.nan)  # NaN: a read shows
        wide[..., : x.shape[-1]] = x
        native = impl.from_numpy(wide, dtype)
        return view("slicing", make=lambda: native[..., : x.shape[-1]])
    if operand_layout == "broadcast_kv":
        if not np.array_equal(x, np.broadcast_to(x[:, :1], x.shape)):
            raise ValueError("broadcast_kv needs k and v whose heads are all the same")
        one_head = impl.from_numpy(np.ascontiguousarray(x[:, :1]), dtype)
        # (B, 1, T, D) seen as (B, H, T, D), stride 0 along H
        return view("broadcast", make=functools.partial(impl.broadcast, one_head, x.shape))
    raise ValueError(f"unknown layout {operand_layout!r}")


ROW_GAP = 8  # elements between one row's end and the next row's start in the row_gaps layout


def paged(call: Call) -> Call:
    """The call with k and v laid out as page pools of ``page_size`` (spec.formula.page_pool),
    a block-scaled cache's scales with them, its block table and key lengths (every key, where the
    test gave none) among its keywords. The pages' order is drawn from the keys' own bytes: the
    same inputs, the same pool."""
    q, k, v = call.arrays[:3]
    keywords = dict(call.keywords)
    page_size = keywords["page_size"]
    key_lengths = keywords.get("key_lengths") or (k.shape[-2],) * k.shape[0]
    # a block-scaled cache's bytes: what reads as NaN in its format where no key is
    cache = cache_format(keywords)
    unread = unread_bytes(*cache) if cache else {}

    order = zlib.crc32(k.array.tobytes())  # one order of the pages for every pool

    def pool_of(name: str, array: np.ndarray):
        rng = np.random.default_rng(order)
        return page_pool(array, key_lengths, page_size, rng, unowned=unread.get(name, np.nan),
                         past=unread.get(name, np.inf))  # fmt: skip

    (k_pool, table), (v_pool, _) = pool_of("k", k.array), pool_of("v", v.array)
    for name in PAGED_SCALES:  # an FP4 cache's scales, token by token as its elements
        if cache and name in keywords:
            keywords[name] = pool_of(name, np.asarray(keywords[name]))[0]
    keywords |= {"block_table": table, "key_lengths": tuple(key_lengths)}
    arrays = (q, InputArray(k_pool, k.dtype), InputArray(v_pool, v.dtype), *call.arrays[3:])
    return dataclasses.replace(call, arrays=arrays, keywords=keywords)


def handle(impl, call: Call) -> Answer:
    """One call's answer: :class:`Raised` when the implementation raised anything at all,
    :class:`Broke` when what it returned, or how it converted its inputs, breaks the contract,
    :class:`NotChecked` when the suite's own helpers cannot lay its inputs out as asked. With
    ``call.poison`` the call runs inside the implementation's poisoned_allocations(): memory it
    never writes reads as NaN."""
    if call.op not in OPS:
        return Broke(f"unknown operation {call.op!r}")
    if call.op == "bench_call":  # it draws its own inputs, and lays them out as this does
        return bench_call(impl, **call.keywords)
    if "page_size" in call.keywords:
        call = paged(call)
    try:
        natives = laid_out(impl, call.arrays, call.layout)
    except LayoutUnavailable as exc:
        return NotChecked(str(exc))
    except BaseException as exc:
        return Broke(f"converting its inputs raised {type(exc).__name__}: {exc}")
    before = snapshot(impl, natives)
    try:
        with impl.poisoned_allocations() if call.poison else contextlib.nullcontext():
            arguments, keywords = arguments_of(call, natives)
            out = getattr(impl, call.op)(*arguments, **keywords)
    except BaseException as exc:  # SystemExit, KeyboardInterrupt, pytest's outcomes: all failures
        return raised(exc)
    changed = changed_inputs(impl, natives, before)
    if changed:
        return Broke(changed)
    try:
        input_device = impl.device_of(natives[0])
        outputs = outputs_of(call, out)
        return Answered(tuple(returned(impl, output, input_device) for output in outputs))
    except BaseException as exc:
        return Broke(str(exc))


def arguments_of(call: Call, natives: list) -> tuple[list, dict]:
    """The positional and keyword arguments of ``call``'s op: a vjp's fifth array is the lse's
    gradient, a keyword of Implementation.vjp."""
    if call.op == "vjp" and len(natives) == 5:
        return natives[:4], {**call.keywords, "grad_lse": natives[4]}
    return natives, call.keywords


def outputs_of(call: Call, out) -> tuple:
    """The arrays a call returned: one, or as many as its op (or return_lse) asks for; a
    TypeError names what came back instead."""
    count = SEVERAL_OUTPUTS.get(call.op, 2 if call.keywords.get("return_lse") else 1)
    if call.op == "vjp" and call.keywords.get("sinks") is not None:
        count += 1  # dsinks
    if count == 1:
        return (out,)
    if not isinstance(out, tuple | list) or len(out) != count:
        what = f"{type(out).__qualname__}" + (
            f" of {len(out)}" if isinstance(out, tuple | list) else ""
        )
        asked = "return_lse=True" if call.op == "attention" else f"{call.op}()"
        raise TypeError(f"{asked} returned a {what}, but should return a tuple of {count} arrays")
    return tuple(out)


def raised(exc: BaseException) -> Raised:
    kind = type(exc)
    return Raised(
        f"{kind.__module__}.{kind.__qualname__}"
        if kind.__module__ != "builtins"
        else kind.__qualname__,
        str(exc) + bound_reached(exc),
        "".join(traceback.format_exception(exc)[-12:]),
    )


# What this worker was confined to (run() sets it): a failure at one of its bounds names it.
CONFINED_TO: dict[str, Any] = {"bounds": WorkerBounds(), "scratch": None}
TASK_REFUSALS = ("can't start new thread", "Resource temporarily unavailable")


def bound_reached(exc: BaseException) -> str:
    """Words naming the worker's bound that ``exc``, or an error it was raised from, ran into
    (a write past its disk, a fork or thread past its tasks); empty where none."""
    bounds, scratch = CONFINED_TO["bounds"], CONFINED_TO["scratch"]
    seen: list[BaseException] = []
    while exc is not None and exc not in seen and len(seen) < 16:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    for error in seen:
        full = isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)
        if full and bounds.disk_bytes and scratch:
            with contextlib.suppress(OSError):
                disk = os.statvfs(scratch)
                written = (disk.f_blocks - disk.f_bfree) * disk.f_frsize
                return (
                    f" [the worker's disk bound: its scratch holds at most "
                    f"{bounds.disk_bytes / 2**20:.0f} MiB (--worker-disk), and held "
                    f"{written / 2**20:.0f} MiB]"
                )
        refused = isinstance(error, OSError) and error.errno == errno.EAGAIN
        if bounds.tasks and (refused or any(text in str(error) for text in TASK_REFUSALS)):
            return (
                f" [the worker's bound on tasks: at most {bounds.tasks} processes and threads, "
                "its whole tree together (--worker-processes)]"
            )
    return ""


def bench_call(
    impl, *, seed: int, dims: tuple, dtype: str, echo: bool = False, flush_cache: bool = True,
    backward: bool = False, query_dtype: str | None = None, value_dim: int | None = None,
    **keywords,
) -> Answer:  # fmt: skip
    """One timed call of attention on inputs drawn from ``seed`` (impls.bench_inputs), laid out
    as a plain call of the same keywords is (page pools where ``page_size`` is among them).

    The timed window ends when the answer can be read: on the CPU after to_numpy (an answer
    computed lazily is computed inside it), on a GPU at a CUDA event after the kernel, the
    device then synchronised, with the L2 cache flushed before it unless ``flush_cache`` is
    False. ``echo``: no call, the inputs come back as its outputs (q; q, k and v for a vjp),
    which measures everything but the call for the judge: the line, the draw, the layout, the
    clock's own work (on a GPU the L2 flush, the synchronisations, the answer's fingerprints)
    and the way back. ``backward``: the call is vjp, forward and backward, on a dO drawn from
    the same seed; its gradients come back. ``dtype`` an FP8 format: the FP8 call of
    impls.bench_inputs.fresh_fp8_inputs (q in ``query_dtype`` where given), its scales among the
    call's keywords; a block-scaled format (spec.block_scaled), the call of
    impls.bench_inputs.fresh_block_call (an FP4 cache's q in ``query_dtype`` where given), its
    scales among the keywords."""
    if dtype in BLOCK_FORMATS:
        block_call = fresh_block_call(seed, dims, dtype, query_dtype, value_dim)
        stored = (block_call.q, block_call.k, block_call.v)
        dtypes = stored_dtypes(block_call.convention, dtype, query_dtype or BLOCK_QUERY_DTYPE)
        arrays = tuple(InputArray(x, d) for x, d in zip(stored, dtypes, strict=True))
        keywords = {**keywords, **block_call.keywords}
    elif dtype in FP8_FORMATS:
        *drawn, scales = fresh_fp8_inputs(seed, dims, dtype, query_dtype)
        dtypes = (query_dtype or dtype, dtype, dtype)
        arrays = tuple(InputArray(x, d) for x, d in zip(drawn, dtypes, strict=True))
        keywords = {**keywords, **scales.keywords}
    else:
        drawn = fresh_inputs(seed, dims, dtype, grad_out=backward, value_dim=value_dim)
        arrays = tuple(InputArray(x, dtype) for x in drawn)
    call = Call("vjp" if backward else "attention", arrays, keywords)
    if "page_size" in keywords:
        call = paged(call)
    try:
        natives = laid_out(impl, call.arrays, "contiguous")
        input_device = impl.device_of(natives[0])
        clock = DeviceClock.of(impl, flush_cache)
        clock.start()
        if echo:  # the inputs, as many as the call's outputs, in the call's place
            out = tuple(natives[:3]) if backward else natives[0]
        else:
            out = getattr(impl, call.op)(*natives, **call.keywords)
        readable = clock.stop(lambda: [impl.to_numpy(x) for x in outputs_of(call, out)])
        outputs = tuple(returned(impl, x, input_device) for x in outputs_of(call, out))
    except AnswerStillWritten as exc:
        return Broke(str(exc))
    except BaseException as exc:
        return raised(exc)
    return Timed((readable,), outputs)


def serve(conn: Connection, selector: str) -> None:
    from impls.registry import RegistryError, resolve

    try:
        impl = resolve(selector)
        description = describe(impl)
    except RegistryError as exc:
        send(conn, NotResolved(str(exc)))
        return
    except BaseException as exc:
        send(conn, NotResolved(f"{selector!r}: {type(exc).__name__}: {exc}"))
        return
    send(conn, Ready(description))
    while True:
        try:
            request = receive(conn, (Call, Close))
        except EOFError:
            return
        if isinstance(request, Close):
            return
        answer = handle(impl, request)
        sys.stdout.flush()
        sys.stderr.flush()
        send(conn, answer)


def run(
    fd: int,
    paths: list[str],
    selector: str,
    scratch: str | None,
    bounds: WorkerBounds | None = None,
    report_fd: int | None = None,
) -> None:
    """The worker's life, in a process started for it or forked for it by :mod:`impls.fork_server`;
    it never returns. With a ``scratch`` directory, it is confined (:mod:`impls.sandbox`) before
    ``paths`` become its ``sys.path`` and the selector is resolved, so nothing of the
    implementation, nor a module beside it named like one of the standard library's, runs
    unconfined. How far it was confined goes down ``report_fd`` (the fork server's pipe) first."""
    faulthandler.enable()  # a segfault's traceback goes to stderr, which the judge shows
    with contextlib.suppress(PermissionError):  # already a group leader where started so
        os.setsid()  # its own process group, which the judge ends with it
    if sys.platform == "linux":
        become_subreaper()
    if scratch is None:
        confinement = Confinement("none", "--no-sandbox")
    else:
        CONFINED_TO.update(bounds=bounds or WorkerBounds(), scratch=scratch)
        try:
            confinement = confine(Path(scratch), paths, bounds)
        except OSError as exc:
            confinement = Confinement("none", f"confining failed: {exc}")
    if report_fd is not None:
        os.write(report_fd, confinement.describe().encode())
        os.close(report_fd)
    sys.path[:] = paths  # the candidate's directory among them, now that it is confined
    serve(Connection(fd), selector)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # threads the implementation left running must not keep its worker alive


if __name__ == "__main__":
    bounds = WorkerBounds.from_text(sys.argv[5] if len(sys.argv) > 5 else "")
    run(int(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], sys.argv[4] or None, bounds)
