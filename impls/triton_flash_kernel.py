"""The Triton kernels of ``triton_flash`` and their launches; imported only when triton is
present. In the order a reader follows them: the forward, then the backward.

Forward: one program per (block of BLOCK_M queries, batch x head). It streams BLOCK_N keys at a
time with an online softmax (running max m, running sum l, accumulator rescaled by
exp(m_old - m_new)), stops at the last key tile its queries may see (tile skipping under the
bottom-right causal mask), normalises once at the end, and stores each row's log-sum-exp
m + log(l) for the backward. Head dims are padded to a power of two of at least 16, as tl.arange
and tl.dot require; the padding is masked out of every load and store.

Backward (FlashAttention 2's): P recomputed from the lse, dS = P (dP - delta), delta =
rowsum(dO * O). Two kernels, neither with atomics, so that repeated calls are bit-identical:
one program per (key tile, batch x head) accumulates dK and dV over the query blocks that see
its keys; one per (query block, batch x head) accumulates dQ over the key tiles it sees.
"""

from __future__ import annotations

import triton
import triton.language as tl

BLOCK_M = 64
BLOCK_N = 64


@triton.jit
def attention_forward(
    Q, K, V, Out, Lse,
    scale, TQ, TK, OFFSET,
    stride_q_bh, stride_q_t, stride_k_bh, stride_k_t, stride_v_bh, stride_v_t, stride_o_bh,
    stride_o_t,
    D, DV,
    D_PAD: tl.constexpr, DV_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
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
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION).to(tl.float32) * scale
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
        acc = acc * correction[:, None] + tl.dot(
            probs.to(v.dtype), v, input_precision=PRECISION
        ).to(tl.float32)
        running_max = new_max
    out = acc / running_sum[:, None]
    tl.store(
        Out + bh * stride_o_bh + rows[:, None] * stride_o_t + dv[None, :],
        out.to(Out.dtype.element_ty),
        mask=(rows[:, None] < TQ) & (dv[None, :] < DV),
    )
    tl.store(Lse + bh * TQ + rows, running_max + tl.log(running_sum), mask=rows < TQ)


@triton.jit
def recomputed_probs(
    q, k, lse, rows, cols, scale, TQ, TK, OFFSET, CAUSAL: tl.constexpr, PRECISION: tl.constexpr
):
    """(BLOCK_M, BLOCK_N) P = exp(q k^T scale - lse) of one query block and key tile, 0 where
    the forward hid the key and on the block's padded rows."""
    scores = tl.dot(q, tl.trans(k), input_precision=PRECISION).to(tl.float32) * scale
    visible = (cols[None, :] < TK) & (rows[:, None] < TQ)
    if CAUSAL:
        visible = visible & (cols[None, :] <= rows[:, None] + OFFSET)
    return tl.where(visible, tl.exp(scores - lse[:, None]), 0.0)


@triton.jit
def attention_backward_dk_dv(
    Q, K, V, GradOut, Lse, Delta, GradK, GradV,
    scale, TQ, TK, OFFSET,
    stride_q_bh, stride_q_t, stride_k_bh, stride_k_t, stride_v_bh, stride_v_t, stride_o_bh,
    stride_o_t,
    D, DV,
    D_PAD: tl.constexpr, DV_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    tile = tl.program_id(0)
    bh = tl.program_id(1)
    cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    d = tl.arange(0, D_PAD)
    dv = tl.arange(0, DV_PAD)
    k = tl.load(K + bh * stride_k_bh + cols[:, None] * stride_k_t + d[None, :],
                mask=(cols[:, None] < TK) & (d[None, :] < D), other=0.0)  # fmt: skip
    v = tl.load(V + bh * stride_v_bh + cols[:, None] * stride_v_t + dv[None, :],
                mask=(cols[:, None] < TK) & (dv[None, :] < DV), other=0.0)  # fmt: skip
    grad_k = tl.zeros([BLOCK_N, D_PAD], tl.float32)
    grad_v = tl.zeros([BLOCK_N, DV_PAD], tl.float32)
    # The first query block with a row at or after the tile's first key (absolute position).
    first = tl.maximum(tile * BLOCK_N - OFFSET, 0) // BLOCK_M if CAUSAL else 0
    for block_start in range(first * BLOCK_M, TQ, BLOCK_M):
        rows = block_start + tl.arange(0, BLOCK_M)
        q = tl.load(Q + bh * stride_q_bh + rows[:, None] * stride_q_t + d[None, :],
                    mask=(rows[:, None] < TQ) & (d[None, :] < D), other=0.0)  # fmt: skip
        grad_out = tl.load(
            GradOut + bh * stride_o_bh + rows[:, None] * stride_o_t + dv[None, :],
            mask=(rows[:, None] < TQ) & (dv[None, :] < DV), other=0.0,
        )  # fmt: skip
        lse = tl.load(Lse + bh * TQ + rows, mask=rows < TQ, other=0.0)
        delta = tl.load(Delta + bh * TQ + rows, mask=rows < TQ, other=0.0)
        probs = recomputed_probs(q, k, lse, rows, cols, scale, TQ, TK, OFFSET, CAUSAL, PRECISION)
        grad_v += tl.dot(
            tl.trans(probs).to(grad_out.dtype), grad_out, input_precision=PRECISION
        ).to(tl.float32)
        grad_probs = tl.dot(grad_out, tl.trans(v), input_precision=PRECISION).to(tl.float32)
        grad_scores = probs * (grad_probs - delta[:, None])
        grad_k += (
            tl.dot(tl.trans(grad_scores).to(q.dtype), q, input_precision=PRECISION).to(tl.float32)
            * scale
        )
    tl.store(
        GradK + bh * stride_k_bh + cols[:, None] * stride_k_t + d[None, :],
        grad_k.to(GradK.dtype.element_ty),
        mask=(cols[:, None] < TK) & (d[None, :] < D),
    )
    tl.store(
        GradV + bh * stride_v_bh + cols[:, None] * stride_v_t + dv[None, :],
        grad_v.to(GradV.dtype.element_ty),
        mask=(cols[:, None] < TK) & (dv[None, :] < DV),
    )


@triton.jit
def attention_backward_dq(
    Q, K, V, GradOut, Lse, Delta, GradQ,
    scale, TQ, TK, OFFSET,
    stride_q_bh, stride_q_t, stride_k_bh, stride_k_t, stride_v_bh, stride_v_t, stride_o_bh,
    stride_o_t,
    D, DV,
    D_PAD: tl.constexpr, DV_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    bh = tl.program_id(1)
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, D_PAD)
    dv = tl.arange(0, DV_PAD)
    q = tl.load(Q + bh * stride_q_bh + rows[:, None] * stride_q_t + d[None, :],
                mask=(rows[:, None] < TQ) & (d[None, :] < D), other=0.0)  # fmt: skip
    grad_out = tl.load(GradOut + bh * stride_o_bh + rows[:, None] * stride_o_t + dv[None, :],
                       mask=(rows[:, None] < TQ) & (dv[None, :] < DV), other=0.0)  # fmt: skip
    lse = tl.load(Lse + bh * TQ + rows, mask=rows < TQ, other=0.0)
    delta = tl.load(Delta + bh * TQ + rows, mask=rows < TQ, other=0.0)
    grad_q = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    end = tl.minimum(TK, (block + 1) * BLOCK_M + OFFSET) if CAUSAL else TK
    for start in range(0, end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k = tl.load(K + bh * stride_k_bh + cols[:, None] * stride_k_t + d[None, :],
                    mask=(cols[:, None] < TK) & (d[None, :] < D), other=0.0)  # fmt: skip
        v = tl.load(V + bh * stride_v_bh + cols[:, None] * stride_v_t + dv[None, :],
                    mask=(cols[:, None] < TK) & (dv[None, :] < DV), other=0.0)  # fmt: skip
        probs = recomputed_probs(q, k, lse, rows, cols, scale, TQ, TK, OFFSET, CAUSAL, PRECISION)
        grad_probs = tl.dot(grad_out, tl.trans(v), input_precision=PRECISION).to(tl.float32)
        grad_scores = probs * (grad_probs - delta[:, None])
        grad_q += (
            tl.dot(grad_scores.to(k.dtype), k, input_precision=PRECISION).to(tl.float32) * scale
        )
    tl.store(
        GradQ + bh * stride_q_bh + rows[:, None] * stride_q_t + d[None, :],
        grad_q.to(GradQ.dtype.element_ty),
        mask=(rows[:, None] < TQ) & (d[None, :] < D),
    )


def precision(q) -> str:
    """tl.dot's input precision: float32 multiplied as float32 ("ieee"), where the default on a
    GPU rounds its operands to TF32 (10 mantissa bits: 2e-3 relative, hundreds of times the
    budget); 16-bit inputs as they are."""
    return "ieee" if q.dtype.itemsize == 4 else "tf32"


def padded(dim: int) -> int:
    return max(16, triton.next_power_of_2(dim))


def as_rows(*tensors):
    """Contiguous (B, H, T, D) tensors as (B x H, T, D) views, one program's rows each."""
    return [x.view(x.shape[0] * x.shape[1], x.shape[-2], x.shape[-1]) for x in tensors]


def launch(q, k, v, out, lse, *, scale: float, causal: bool) -> None:
    """Run the forward on contiguous (B, H, T, D) tensors, writing ``out`` (B, H, Tq, Dv) and
    ``lse`` (B, H, Tq), float32."""
    batch, heads, tq, d = q.shape
    tk, dv = k.shape[-2], v.shape[-1]
    q3, k3, v3, o3 = as_rows(q, k, v, out)
    grid = (triton.cdiv(tq, BLOCK_M), batch * heads)
    attention_forward[grid](
        q3, k3, v3, o3, lse,
        scale, tq, tk, tk - tq,
        q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), v3.stride(0), v3.stride(1),
        o3.stride(0), o3.stride(1),
        d, dv,
        D_PAD=padded(d), DV_PAD=padded(dv), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=causal,
        PRECISION=precision(q),
    )  # fmt: skip


def launch_backward(q, k, v, grad_out, lse, delta, grads, *, scale: float, causal: bool) -> None:
    """Run the backward on contiguous (B, H, T, D) tensors: ``grads`` (dq, dk, dv) written, from
    the forward's ``lse`` and ``delta`` = rowsum(dO * O), (B, H, Tq) float32."""
    batch, heads, tq, d = q.shape
    tk, dv = k.shape[-2], v.shape[-1]
    q3, k3, v3, o3, dq3, dk3, dv3 = as_rows(q, k, v, grad_out, *grads)
    shared = dict(D_PAD=padded(d), DV_PAD=padded(dv), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                  CAUSAL=causal, PRECISION=precision(q))  # fmt: skip
    strides = (q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), v3.stride(0),
               v3.stride(1), o3.stride(0), o3.stride(1))  # fmt: skip
    attention_backward_dk_dv[(triton.cdiv(tk, BLOCK_N), batch * heads)](
        q3, k3, v3, o3, lse, delta, dk3, dv3, scale, tq, tk, tk - tq, *strides, d, dv, **shared
    )
    attention_backward_dq[(triton.cdiv(tq, BLOCK_M), batch * heads)](
        q3, k3, v3, o3, lse, delta, dq3, scale, tq, tk, tk - tq, *strides, d, dv, **shared
    )
