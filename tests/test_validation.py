"""validate_inputs refuses the score modifiers' bad values with an error naming the argument, and
lets every good one through."""

from __future__ import annotations

import numpy as np
import pytest

from impls.validation import AttentionInputError, validate_inputs
from tests.suite_process import run_suite

Q = K = V = np.zeros((1, 4, 6, 8))  # (B, H, T, D): four heads, one value each below


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(softcap=0.0), "softcap=0.0, but should be finite and > 0"),
        (dict(softcap=-1.0), "softcap=-1.0, but should be finite and > 0"),
        (dict(softcap=np.inf), "softcap=inf, but should be finite and > 0"),
        (dict(softcap="2"), "softcap='2', but should be a positive number"),
        (dict(softcap=True), "softcap=True, but should be a positive number"),
        (dict(alibi_slopes=(1.0, 0.5)), r"alibi_slopes has shape \(2,\), but should be \(4,\)"),
        (dict(alibi_slopes=(1.0, 0.5, np.inf, 0.1)), "alibi_slopes=.*, but each should be finite$"),
        (dict(alibi_slopes=(1.0, -np.inf, 0, 0)), "alibi_slopes=.*, but each should be finite$"),
        (dict(sinks=(0.0, np.nan, 0.0, 0.0)), "sinks=.*, but each should be finite or -inf"),
        (dict(sinks=(0.0, np.inf, 0.0, 0.0)), "sinks=.*, but each should be finite or -inf"),
        (dict(sinks="abcd"), "sinks='abcd', but should be 4 numbers"),
        (dict(chunk=0), "chunk=0, but should be an integer >= 1"),
        (dict(chunk=2.5), "chunk=2.5, but should be an integer >= 1"),
        (dict(chunk=4, causal=False), "chunk=4 with causal=False"),
    ],
)
def test_a_bad_modifier_is_refused_by_name(options, message):
    causal = options.pop("causal", True)
    with pytest.raises(AttentionInputError, match=message):
        validate_inputs(Q, K, V, causal=causal, scale=None, **options)


@pytest.mark.parametrize(
    "options",
    [
        dict(softcap=30.0),
        dict(softcap=1),
        dict(alibi_slopes=(0.5, 0.25, 0.125, 0.0625)),
        dict(alibi_slopes=np.zeros(4)),
        dict(sinks=(0.0, -np.inf, 3.0, -2.0)),
        dict(chunk=1),
        dict(chunk=np.int64(8192)),
    ],
)
def test_a_good_modifier_passes(options):
    validate_inputs(Q, K, V, causal=True, scale=None, **options)


class DeviceOnly:
    """An array on a device this machine does not have, as the checks see it: shape, dtype and
    ``tolist()`` (every array library's copy of a few values), and a refusal of NumPy's
    conversion, as a CUDA tensor, a CuPy array or a tensor that requires grad refuses it."""

    def __init__(self, values, dtype=None):
        self.values = np.asarray(values)
        self.shape, self.ndim = self.values.shape, self.values.ndim
        self.dtype = self.values.dtype if dtype is None else dtype

    def tolist(self):
        return self.values.tolist()

    def __array__(self, *args, **kwargs):
        raise TypeError("can't convert a device array to NumPy: copy it to the host first")


def device_only(values):
    return DeviceOnly(values)


def torch_on_a_device(values):
    torch = pytest.importorskip("torch")
    return DeviceOnly(values, dtype=torch.tensor(np.asarray(values)).dtype)


def torch_requiring_grad(values):
    torch = pytest.importorskip("torch")
    tensor = torch.tensor(np.asarray(values))
    return tensor.requires_grad_(True) if tensor.is_floating_point() else tensor


def jax_array(values):
    jnp = pytest.importorskip("jax.numpy")
    return jnp.asarray(np.asarray(values))


def strided_view(values):
    doubled = np.repeat(np.asarray(values)[..., None], 2, axis=-1)
    return doubled[..., 0]  # every other element: a view with a stride of two


ARRAY_FAMILIES = {
    "cupy-like-device": device_only,
    "torch-cuda-like-device": torch_on_a_device,
    "torch-requires-grad": torch_requiring_grad,
    "jax": jax_array,
    "numpy-view": strided_view,
}

# Each keyword validate_inputs reads the values of, good and bad; shapes of Q (B=1, H=4, T=6).
READ_VALUES = {
    "sinks": ((0.5, -np.inf, 0.0, 1.0), (0.0, np.nan, 0.0, 0.0), "but each should be finite or"),
    "alibi_slopes": ((1.0, 0.5, 0.25, 0.125), (1.0, np.inf, 0, 0), "but each should be finite"),
    "key_lengths": ((6,), (7,), "but each should be between 0 and 6"),
    "query_lengths": ((5,), (0,), "but each should be between 1 and 6"),
}


@pytest.mark.optional_libraries
@pytest.mark.parametrize("family", list(ARRAY_FAMILIES))
@pytest.mark.parametrize("keyword", list(READ_VALUES))
def test_values_are_read_from_any_array(family, keyword):
    """validate_inputs reads the few values it checks from whatever array a kernel was given,
    without NumPy's conversion, which a device array or a tensor in autograd refuses."""
    good, bad, message = READ_VALUES[keyword]
    make = ARRAY_FAMILIES[family]
    validate_inputs(Q, K, V, causal=True, scale=None, **{keyword: make(np.array(good))})
    with pytest.raises(AttentionInputError, match=message):
        validate_inputs(Q, K, V, causal=True, scale=None, **{keyword: make(np.array(bad))})


@pytest.mark.optional_libraries
@pytest.mark.parametrize("family", list(ARRAY_FAMILIES))
def test_offsets_and_block_tables_are_read_from_any_array(family):
    make = ARRAY_FAMILIES[family]
    packed = np.zeros((1, 4, 6, 8))
    offsets = make(np.array([0, 2, 6]))
    validate_inputs(*[packed] * 3, causal=True, scale=None, cu_seqlens_q=offsets,
                    cu_seqlens_k=offsets)  # fmt: skip
    with pytest.raises(AttentionInputError, match="but should rise from 0 to 6"):
        validate_inputs(*[packed] * 3, causal=True, scale=None, cu_seqlens_k=offsets,
                        cu_seqlens_q=make(np.array([0, 4, 2, 6])))  # fmt: skip
    pool = np.zeros((3, 4, 4, 8))  # (pages, page_size, Hkv, D)
    paging = dict(key_lengths=make(np.array([6])), page_size=4)
    validate_inputs(Q, pool, pool, causal=True, scale=None, block_table=make(np.array([[2, 0]])),
                    **paging)  # fmt: skip
    with pytest.raises(AttentionInputError, match="but the pool has 3"):
        validate_inputs(Q, pool, pool, causal=True, scale=None,
                        block_table=make(np.array([[3, 0]])), **paging)  # fmt: skip


@pytest.mark.optional_libraries
def test_a_torch_kernel_with_sinks_that_follows_the_readme_meets_grad_sink():
    """Its vjp hands attention() the sinks as a tensor that requires grad, and its first line,
    validate_inputs, reads them (it refused once with "Can't call numpy() on Tensor that
    requires grad")."""
    pytest.importorskip("torch")
    result = run_suite(
        "--impl", "tests.planted.torch_sinks:SinksKernel", "--claims", "GRAD-SINK,SINK-LOGIT",
        "-q", "-p", "no:randomly",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in result.stdout, result.stdout[-2000:]
    assert "failed" not in result.stdout, result.stdout[-2000:]


# A packed call of two sequences, (2 x 3) and (4 x 3) blocks: one byte and two bytes of bits.
PACKED = np.zeros((1, 4, 6, 8))
SEQUENCES = dict(cu_seqlens_q=np.array([0, 2, 6]), cu_seqlens_k=np.array([0, 3, 6]))
BITS = np.array([0b101101, 0xFF, 0b1], np.uint8)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(packed_mask=BITS[:2], mask_indptr=np.array([0, 1, 3])),
         r"packed_mask has 2 bytes, but mask_indptr ends at 3"),
        (dict(packed_mask=BITS, mask_indptr=np.array([0, 1, 2])),
         r"mask_indptr\[1:3\] = \[1, 2\], 1 bytes, but 1's \(4 x 3\) block needs 2"),
        (dict(packed_mask=BITS, mask_indptr=np.array([0, 8, 24])),
         r"packed_mask has 3 bytes, but mask_indptr ends at 24"),
        (dict(packed_mask=BITS, mask_indptr=np.array([0, 3])),
         r"mask_indptr has 2 offsets, but should have 3: one per sequence"),
        (dict(packed_mask=BITS.astype(bool), mask_indptr=np.array([0, 1, 3])),
         r"packed_mask is ndarray bool .*, but should be a 1-D uint8 array"),
        (dict(packed_mask=BITS), r"packed_mask and mask_indptr come together"),
        (dict(packed_mask=BITS, mask_indptr=np.array([0, 1, 3]), attn_mask=np.ones((6, 6), bool)),
         r"attn_mask with packed sequences"),
    ],
)  # fmt: skip
def test_a_bad_packed_mask_is_refused_by_name(options, message):
    with pytest.raises(AttentionInputError, match=message):
        validate_inputs(PACKED, PACKED, PACKED, causal=False, scale=None, **SEQUENCES, **options)


@pytest.mark.optional_libraries
@pytest.mark.parametrize("family", list(ARRAY_FAMILIES))
def test_mask_offsets_and_indices_are_read_from_any_array(family):
    make = ARRAY_FAMILIES[family]
    validate_inputs(PACKED, PACKED, PACKED, causal=False, scale=None, **SEQUENCES,
                    packed_mask=BITS, mask_indptr=make(np.array([0, 1, 3])))  # fmt: skip
    with pytest.raises(AttentionInputError, match="but mask_indptr ends at 4"):
        validate_inputs(PACKED, PACKED, PACKED, causal=False, scale=None, **SEQUENCES,
                        packed_mask=BITS, mask_indptr=make(np.array([0, 1, 4])))  # fmt: skip
    indices = np.zeros((1, 4, 6, 2), np.int32)
    validate_inputs(Q, K, V, causal=True, scale=None, kv_indices=make(indices))
    with pytest.raises(AttentionInputError, match=r"kv_indices\[0, 0, 0, 1\] = 6, but"):
        validate_inputs(Q, K, V, causal=True, scale=None,
                        kv_indices=make(np.where(np.arange(2) == 1, 6, indices)))  # fmt: skip


BLOCKS = np.zeros((1, 4, 6, 2), np.int32)  # two slots a row, each naming a block


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(kv_indices=BLOCKS, kv_block_size=0),
         "kv_block_size=0, but should be a positive integer"),
        (dict(kv_indices=BLOCKS, kv_block_size=2.0),
         "kv_block_size=2.0, but should be a positive integer"),
        (dict(kv_block_size=4), "kv_block_size without kv_indices: it sizes the blocks"),
        # six keys in blocks of 4 make two blocks, 0 and 1
        (dict(kv_indices=BLOCKS + 2, kv_block_size=4),
         r"kv_indices\[0, 0, 0, 0\] = 2, but an index names a block of 4 keys 0..1 \(Tk = 6\)"),
        (dict(kv_indices=BLOCKS - 2, kv_block_size=4), r"kv_indices\[0, 0, 0, 0\] = -2, but"),
    ],
)  # fmt: skip
def test_bad_block_indices_are_refused_by_name(options, message):
    validate_inputs(Q, K, V, causal=True, scale=None, kv_indices=BLOCKS + 1, kv_block_size=4)
    with pytest.raises(AttentionInputError, match=message):
        validate_inputs(Q, K, V, causal=True, scale=None, **options)
