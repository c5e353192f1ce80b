"""GPU kernels that try to look fast to ``attnspec bench`` (perf/test_gpu.py judges them on a
CUDA runner; impls/device_clock.py says what defeats each, tests/test_bench.py shows each
defence with stand-in events where no GPU is)."""

from __future__ import annotations

from impls.torch_sdpa import TorchSdpa


class AnswerOnASideStream(TorchSdpa):
    """Computes the right answer, but on a stream of its own that it does not wait for: the
    events of the default stream time nothing, and the answer is written after the call
    returned."""

    def __init__(self):
        super().__init__("cuda")
        self.name = "answer_on_a_side_stream"

    def attention(self, q, k, v, **keywords):
        import torch

        out = torch.empty(q.shape[:-1] + v.shape[-1:], dtype=q.dtype, device=q.device)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(50_000_000)  # tens of ms of cycles: the answer comes late
            out.copy_(super().attention(q, k, v, **keywords))
        return out


answer_on_a_side_stream = AnswerOnASideStream()


class LeavesAKernelRunning(TorchSdpa):
    """Right, and honest about its own time; but after each call returns, a thread of its worker
    queues a long kernel on the device, which runs on while the judge pauses, freezes this worker
    and times the baseline: the GPU's crowding of a rival."""

    def __init__(self):
        super().__init__("cuda")
        self.name = "leaves_a_kernel_running"

    def attention(self, q, k, v, **keywords):
        import threading

        import torch

        out = super().attention(q, k, v, **keywords)

        def crowd():
            with torch.cuda.stream(torch.cuda.Stream()):
                torch.cuda._sleep(2_000_000_000)  # about a second of cycles, not waited for

        threading.Timer(0.05, crowd).start()
        return out


leaves_a_kernel_running = LeavesAKernelRunning()
