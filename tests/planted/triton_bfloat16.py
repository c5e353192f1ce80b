"""The Triton skeleton declaring bfloat16 under the interpreter too, whose tl.dot multiplies
bfloat16 operands as raw bits (triton-lang/triton#11584): its bfloat16 tests fail, and their
messages must say why (tests/test_triton_host.py)."""

from __future__ import annotations

from dataclasses import replace

from impls.templates.triton_kernel import MyKernel


class DeclaresBfloat16(MyKernel):
    name = "triton-bfloat16-interpreted"

    def __init__(self):
        super().__init__()
        dtypes = (*self.capabilities.dtypes, "bfloat16")
        self.capabilities = replace(self.capabilities, dtypes=tuple(dict.fromkeys(dtypes)))
