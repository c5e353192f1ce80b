# mykernel.py: an attnspec Implementation with a Triton kernel. Judge it with
#   attnspec run --impl mykernel:MyKernel
# compiled on a CUDA device, or on a CPU through Triton's interpreter:
#   TRITON_INTERPRET=1 attnspec run --impl mykernel:MyKernel
import torch
import triton
import triton.language as tl

from impls.contract import LAYOUTS, RAISES_ON_ALL, Capabilities, Implementation, validate_inputs
from impls.torch_arrays import TorchArrays  # conversions, views, autograd for torch tensors
from impls.triton_host import device_properties, interpreted


@triton.jit
def attention_kernel(
    Q, K, V, Out, scale, TQ, TK, HEADS, D, DV,
    sqb, sqh, sqt, sqd, skb, skh, skt, skd, svb, svh, svt, svd, sob, soh, sot, sod,
    D_PAD: tl.constexpr, DV_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    # One program per (block of BLOCK_M query rows, batch item x head): BLOCK_N keys at a time,
    # an online softmax in float32. Every operand is read through its own four strides.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    b, h = tl.program_id(1) // HEADS, tl.program_id(1) % HEADS
    d, dv = tl.arange(0, D_PAD), tl.arange(0, DV_PAD)
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqt + d[None, :] * sqd,
                mask=(rows[:, None] < TQ) & (d[None, :] < D), other=0.0)  # fmt: skip
    row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DV_PAD], tl.float32)
    # Keys past the block's last row's (i + Tk - Tq) are in every row's future: not loaded.
    end = tl.minimum(TK, (tl.program_id(0) + 1) * BLOCK_M + TK - TQ) if CAUSAL else TK
    for start in range(0, end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k = tl.load(K + b * skb + h * skh + cols[:, None] * skt + d[None, :] * skd,
                    mask=(cols[:, None] < TK) & (d[None, :] < D), other=0.0)  # fmt: skip
        v = tl.load(V + b * svb + h * svh + cols[:, None] * svt + dv[None, :] * svd,
                    mask=(cols[:, None] < TK) & (dv[None, :] < DV), other=0.0)  # fmt: skip
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        visible = cols[None, :] < TK
        if CAUSAL:  # bottom-right aligned: row i sees keys j <= i + Tk - Tq
            visible = visible & (cols[None, :] <= rows[:, None] + TK - TQ)
        scores = tl.where(visible, scores, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, 1))
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)  # a row with no key yet
        probs = tl.exp(scores - shift[:, None])
        correction = tl.exp(row_max - shift)
        row_sum = row_sum * correction + tl.sum(probs, 1)
        acc = acc * correction[:, None] + tl.dot(probs, v.to(tl.float32), input_precision="ieee")
        row_max = new_max
    tl.store(Out + b * sob + h * soh + rows[:, None] * sot + dv[None, :] * sod,
             (acc / row_sum[:, None]).to(Out.dtype.element_ty),
             mask=(rows[:, None] < TQ) & (dv[None, :] < DV))  # fmt: skip


class MyKernel(TorchArrays, Implementation):
    name = "mykernel"
    call_timeout = 900.0  # seconds: the interpreter takes minutes for ANDREA's 12 heads of 1024

    def __init__(self):
        # Compiled on a GPU; on a CPU, the interpreter, whose tl.dot multiplies bfloat16 operands
        # as raw bits (triton-lang/triton#11584): bfloat16 is judged on a GPU only.
        self.device = "cpu" if interpreted() else "cuda"
        dtypes = ("float32", "float16") + (() if interpreted() else ("bfloat16",))
        self.capabilities = Capabilities(
            dtypes=dtypes, conventions=RAISES_ON_ALL, layouts=tuple(LAYOUTS)
        )

    def version(self) -> str:  # the device decides which paths of a kernel are judged
        return f"triton {triton.__version__} on {device_properties().describe()}"

    def attention(self, q, k, v, *, causal=True, scale=None):
        validate_inputs(q, k, v, causal=causal, scale=scale)  # a clear error on bad inputs
        (batch, heads, tq, d), (tk, dv) = q.shape, v.shape[-2:]
        out = torch.empty((batch, heads, tq, dv), dtype=q.dtype, device=q.device)
        scale = d**-0.5 if scale is None else scale
        grid = (triton.cdiv(tq, 64), batch * heads)
        attention_kernel[grid](
            q, k, v, out, scale, tq, tk, heads, d, dv,
            *q.stride(), *k.stride(), *v.stride(), *out.stride(),
            D_PAD=max(16, triton.next_power_of_2(d)), DV_PAD=max(16, triton.next_power_of_2(dv)),
            BLOCK_M=64, BLOCK_N=64, CAUSAL=causal,
            PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # never TF32 for float32
        )  # fmt: skip
        return out
