"""A CUDA source's NVRTC compile, once per test session: the resource check and the SASS
estimate both read cupy_flash for sm_90 (about 20 s a compile here), and under xdist each
worker holding one of their tests would compile it again."""

from __future__ import annotations

from impls.cuda_kernels import compile_to_cubin
from tests.made_once import made_once, session_directory


def compiled_once(tmp_path_factory, name: str, arch: str) -> tuple[str, bytes]:
    """``compile_to_cubin(name, arch)``'s (ptxas log, cubin), compiled by the first process of
    the session to ask. Raises as it does (NvrtcUnavailable, CompileError), leaving nothing."""

    def compile_into(scratch):
        log, cubin = compile_to_cubin(name, arch)
        scratch.mkdir()
        (scratch / "ptxas.log").write_text(log, encoding="utf-8")
        (scratch / "kernels.cubin").write_bytes(cubin)

    compiled = made_once(session_directory(tmp_path_factory) / f"nvrtc-{name}-{arch}", compile_into)
    log = (compiled / "ptxas.log").read_text(encoding="utf-8")
    return log, (compiled / "kernels.cubin").read_bytes()
