// impls/cupy_naive.cu on the host (see host_cuda.h): its three launches, as impls/cupy_backend.py
// makes them.
#include "host_cuda.h"

#include "../../impls/cupy_naive.cu"

extern "C" void run_naive(const float* q, const float* k, const float* v, float* scores,
                          float* out, int batch_heads, int tq, int tk, int d, int dv, float scale,
                          int document_scale, int causal) {
    const unsigned bh = unsigned(batch_heads);
    launch({unsigned((tk + 127) / 128), unsigned(tq), bh}, 128, [&] {
        attention_scores(q, k, scores, tq, tk, d, scale, document_scale, causal);
    });
    launch({bh * unsigned(tq), 1, 1}, SOFTMAX_THREADS, [&] { softmax_rows(scores, tk); });
    launch({unsigned((dv + 63) / 64), unsigned(tq), bh}, 64,
           [&] { weighted_values(scores, v, out, tq, tk, dv, causal); });
}
