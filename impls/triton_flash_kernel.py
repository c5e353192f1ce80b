"""The Triton kernel of ``triton_flash`` and its launch; imported only when triton is present.

One program per (block of BLOCK_M queries, batch x head). It streams BLOCK_N keys at a time with
an online softmax (running max m, running sum l, accumulator rescaled by exp(m_old - m_new)),
stops at the last key tile its queries may see (tile skipping under the bottom-right causal
mask), and normalises once at the end. Head dims are padded to a power of two of at least 16,
as tl.arange and tl.dot require; the padding is masked out of every load and store.
"""

from __future__ import annotations

import triton
import triton.language as tl

BLOCK_M = 64
BLOCK_N = 64


@triton.jit
def attention_forward(
    Q, K, V, Out,
    scale, TQ, TK, OFFSET,
    stride_q_bh, stride_q_t, stride_k_bh, stride_k_t, stride_v_bh, stride_v_t, stride_o_bh,
    stride_o_t,
    D, DV,
    D_PAD: tl.constexpr, DV_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    bh = tl.program_id(1)
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, D_PAD)
    dv = tl.arange(0, DV_PAD)
    q = tl.load(
        Q + bh * stride_q_bh + rows[:, None] * stride_q_t + d[None, :],
        mask=(rows[:, None] < TQ) & (d[None, :] < D),
        other=0.0,
    )
    running_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    running_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DV_PAD], tl.float32)
    # Keys beyond the block's last row (absolute position + OFFSET) are in every row's future.
    end = tl.minimum(TK, (block + 1) * BLOCK_M + OFFSET) if CAUSAL else TK
    for start in range(0, end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k = tl.load(
            K + bh * stride_k_bh + cols[:, None] * stride_k_t + d[None, :],
            mask=(cols[:, None] < TK) & (d[None, :] < D),
            other=0.0,
        )
        scores = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
        visible = cols[None, :] < TK
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + OFFSET)
        scores = tl.where(visible, scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, 1))
        # Padded rows (>= TQ) see no key and keep max -inf; shift them by 0 (their exp is 0).
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        correction = tl.exp(running_max - shift)
        probs = tl.exp(scores - shift[:, None])
        running_sum = running_sum * correction + tl.sum(probs, 1)
        v = tl.load(
            V + bh * stride_v_bh + cols[:, None] * stride_v_t + dv[None, :],
            mask=(cols[:, None] < TK) & (dv[None, :] < DV),
            other=0.0,
        )
        acc = acc * correction[:, None] + tl.dot(probs.to(v.dtype), v).to(tl.float32)
        running_max = new_max
    out = acc / running_sum[:, None]
    tl.store(
        Out + bh * stride_o_bh + rows[:, None] * stride_o_t + dv[None, :],
        out.to(Out.dtype.element_ty),
        mask=(rows[:, None] < TQ) & (dv[None, :] < DV),
    )


def padded(dim: int) -> int:
    return max(16, triton.next_power_of_2(dim))


def launch(q, k, v, out, *, scale: float, causal: bool) -> None:
    """Run the kernel on contiguous (B, H, T, D) tensors, writing ``out`` (B, H, Tq, Dv)."""
    batch, heads, tq, d = q.shape
    tk, dv = k.shape[-2], v.shape[-1]
    q3, k3, v3, o3 = (x.view(batch * heads, x.shape[-2], x.shape[-1]) for x in (q, k, v, out))
    grid = (triton.cdiv(tq, BLOCK_M), batch * heads)
    attention_forward[grid](
        q3, k3, v3, o3,
        scale, tq, tk, tk - tq,
        q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), v3.stride(0), v3.stride(1),
        o3.stride(0), o3.stride(1),
        d, dv,
        D_PAD=padded(d), DV_PAD=padded(dv), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=causal,
    )  # fmt: skip
