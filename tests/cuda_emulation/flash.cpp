// impls/cupy_flash.cu on the host (see host_cuda.h): one C entry point for every kernel.
#include "host_cuda.h"

#include "../../impls/cupy_flash.cu"

#define RUN_IF(NAME, THREADS, ELEMENT)                                                  \
    if (std::strcmp(name, #NAME) == 0) {                                                \
        launch(grid, THREADS, [&] {                                                     \
            NAME(static_cast<const ELEMENT*>(q), static_cast<const ELEMENT*>(k),        \
                 static_cast<const ELEMENT*>(v), static_cast<ELEMENT*>(o), lse, tq, tk, \
                 scale, causal, heads_per_kv, window, softcap, sinks, heads, k_scales,  \
                 v_scales);                                                             \
        });                                                                             \
        return 0;                                                                       \
    }

// Launches kernel `name` as impls/cupy_flash.py does; returns 1 for an unknown name.
extern "C" int run_flash(const char* name, const void* q, const void* k, const void* v, void* o,
                         float* lse, int batch_heads, int tq, int tk, float scale, int causal,
                         int heads_per_kv, int window, float softcap, const float* sinks,
                         int heads, const float* k_scales, const float* v_scales) {
    const Index3 grid{unsigned((tq + BLOCK_M - 1) / BLOCK_M), unsigned(batch_heads), 1};
    RUN_IF(flash_f16_d32, TENSOR_CORE_THREADS, bits16)
    RUN_IF(flash_f16_d32_softcap, TENSOR_CORE_THREADS, bits16)
    RUN_IF(flash_f16_d64, TENSOR_CORE_THREADS, bits16)
    RUN_IF(flash_f16_d64_softcap, TENSOR_CORE_THREADS, bits16)
    RUN_IF(flash_f16_d128, TENSOR_CORE_THREADS, bits16)
    RUN_IF(flash_f16_d128_softcap, TENSOR_CORE_THREADS, bits16)
    RUN_IF(flash_bf16_d32, TENSOR_CORE_THREADS, bits16)
    RUN_IF(flash_bf16_d32_softcap, TENSOR_CORE_THREADS, bits16)
    RUN_IF(flash_bf16_d64, TENSOR_CORE_THREADS, bits16)
    RUN_IF(flash_bf16_d64_softcap, TENSOR_CORE_THREADS, bits16)
    RUN_IF(flash_bf16_d128, TENSOR_CORE_THREADS, bits16)
    RUN_IF(flash_bf16_d128_softcap, TENSOR_CORE_THREADS, bits16)
    RUN_IF(flash_f32_d32, F32_THREADS, float)
    RUN_IF(flash_f32_d32_softcap, F32_THREADS, float)
    RUN_IF(flash_f32_d64, F32_THREADS, float)
    RUN_IF(flash_f32_d64_softcap, F32_THREADS, float)
    RUN_IF(flash_f32_d128, F32_THREADS, float)
    RUN_IF(flash_f32_d128_softcap, F32_THREADS, float)
    return 1;
}

#define RUN_BACKWARD_IF(NAME)                                                                \
    if (std::strcmp(name, #NAME) == 0) {                                                     \
        launch(key_tiles, BACKWARD_THREADS, [&] {                                            \
            NAME##_dk_dv(q, k, v, grad_out, lse, delta, grad_lse, tq, tk, scale, causal,     \
                         heads_per_kv, window, softcap, sinks, heads, counts, grad_k,        \
                         grad_v);                                                            \
        });                                                                                  \
        launch(query_blocks, BACKWARD_THREADS, [&] {                                         \
            NAME##_dq(q, k, v, grad_out, lse, delta, grad_lse, tq, tk, scale, causal,        \
                      heads_per_kv, window, softcap, sinks, heads, counts, grad_q);          \
        });                                                                                  \
        return 0;                                                                            \
    }

// Launches the backward's two kernels `name`_dk_dv and `name`_dq as impls/cupy_flash.py does;
// returns 1 for an unknown name.
extern "C" int run_flash_backward(const char* name, const float* q, const float* k,
                                  const float* v, const float* grad_out, const float* lse,
                                  const float* delta, const float* grad_lse, int batch, int heads,
                                  int kv_heads, int tq, int tk, float scale, int causal,
                                  int window, float softcap, const float* sinks,
                                  const int* counts, float* grad_q, float* grad_k,
                                  float* grad_v) {
    const int heads_per_kv = heads / kv_heads;
    const Index3 key_tiles{unsigned((tk + BLOCK_M - 1) / BLOCK_M), unsigned(batch * kv_heads), 1};
    const Index3 query_blocks{unsigned((tq + BLOCK_M - 1) / BLOCK_M), unsigned(batch * heads), 1};
    RUN_BACKWARD_IF(flash_backward_d32)
    RUN_BACKWARD_IF(flash_backward_d32_softcap)
    RUN_BACKWARD_IF(flash_backward_d64)
    RUN_BACKWARD_IF(flash_backward_d64_softcap)
    RUN_BACKWARD_IF(flash_backward_d128)
    RUN_BACKWARD_IF(flash_backward_d128_softcap)
    return 1;
}

#define RUN_SPARSE_IF(NAME)                                                                   \
    if (std::strcmp(name, #NAME) == 0) {                                                      \
        launch(grid, BACKWARD_THREADS, [&] {                                                  \
            NAME(q, k, v, o, lse, tq, tk, scale, causal, heads_per_kv, window, softcap, sinks, \
                 heads, indices, slots, topk_length);                                         \
        });                                                                                   \
        return 0;                                                                             \
    }

// Launches the index-sparse forward `name` as impls/cupy_flash.py does; returns 1 for an unknown
// name.
extern "C" int run_flash_sparse(const char* name, const float* q, const float* k, const float* v,
                                float* o, float* lse, int batch_heads, int tq, int tk,
                                float scale, int causal, int heads_per_kv, int window,
                                float softcap, const float* sinks, int heads, const int* indices,
                                int slots, const int* topk_length) {
    const Index3 grid{unsigned((tq + BLOCK_M - 1) / BLOCK_M), unsigned(batch_heads), 1};
    RUN_SPARSE_IF(flash_sparse_d32)
    RUN_SPARSE_IF(flash_sparse_d32_softcap)
    RUN_SPARSE_IF(flash_sparse_d64)
    RUN_SPARSE_IF(flash_sparse_d64_softcap)
    RUN_SPARSE_IF(flash_sparse_d128)
    RUN_SPARSE_IF(flash_sparse_d128_softcap)
    return 1;
}

// The first race the last launch saw (host_cuda.h), or an empty string.
extern "C" const char* emulation_race() { return race.c_str(); }

#define RUN_FP8_IF(NAME)                                                                       \
    if (std::strcmp(name, #NAME) == 0) {                                                       \
        launch(grid, TENSOR_CORE_THREADS, [&] {                                                \
            NAME(static_cast<const bits8*>(q), static_cast<const bits8*>(k),                   \
                 static_cast<const bits8*>(v), static_cast<bits16*>(o), lse, tq, tk, scale,    \
                 causal, heads_per_kv, q_descale, k_descale, v_descale);                       \
        });                                                                                    \
        return 0;                                                                              \
    }

// Launches FP8 kernel `name` as impls/cupy_flash.py does; returns 1 for an unknown name.
extern "C" int run_flash_fp8(const char* name, const void* q, const void* k, const void* v,
                             void* o, float* lse, int batch_heads, int tq, int tk, float scale,
                             int causal, int heads_per_kv, const float* q_descale,
                             const float* k_descale, const float* v_descale) {
    const Index3 grid{unsigned((tq + BLOCK_M - 1) / BLOCK_M), unsigned(batch_heads), 1};
    RUN_FP8_IF(flash_e4m3_d32)
    RUN_FP8_IF(flash_e4m3_d64)
    RUN_FP8_IF(flash_e4m3_d128)
    RUN_FP8_IF(flash_e5m2_d32)
    RUN_FP8_IF(flash_e5m2_d64)
    RUN_FP8_IF(flash_e5m2_d128)
    return 1;
}

#define RUN_MX_IF(NAME)                                                                        \
    if (std::strcmp(name, #NAME) == 0) {                                                       \
        launch(grid, TENSOR_CORE_THREADS, [&] {                                                \
            NAME(static_cast<const bits8*>(q), static_cast<const bits8*>(k),                   \
                 static_cast<const bits8*>(v), static_cast<bits16*>(o), lse, tq, tk, scale,    \
                 causal, heads_per_kv, q_scales, k_scales, v_scales);                          \
        });                                                                                    \
        return 0;                                                                              \
    }

// Launches MXFP8 kernel `name` as impls/cupy_flash.py does; returns 1 for an unknown name.
extern "C" int run_flash_mx(const char* name, const void* q, const void* k, const void* v,
                            void* o, float* lse, int batch_heads, int tq, int tk, float scale,
                            int causal, int heads_per_kv, const bits8* q_scales,
                            const bits8* k_scales, const bits8* v_scales) {
    const Index3 grid{unsigned((tq + BLOCK_M - 1) / BLOCK_M), unsigned(batch_heads), 1};
    RUN_MX_IF(flash_mx_e4m3_d32)
    RUN_MX_IF(flash_mx_e4m3_d64)
    RUN_MX_IF(flash_mx_e4m3_d128)
    RUN_MX_IF(flash_mx_e5m2_d32)
    RUN_MX_IF(flash_mx_e5m2_d64)
    RUN_MX_IF(flash_mx_e5m2_d128)
    return 1;
}

#define RUN_FP4_IF(NAME)                                                                      \
    if (std::strcmp(name, #NAME) == 0) {                                                      \
        launch(grid, TENSOR_CORE_THREADS, [&] {                                               \
            NAME(static_cast<const bits16*>(q), static_cast<const bits8*>(k),                 \
                 static_cast<const bits8*>(v), static_cast<bits16*>(o), lse, tq, tk, scale,   \
                 causal, heads_per_kv, k_global, v_global, k_block_scales, v_block_scales);   \
        });                                                                                   \
        return 0;                                                                             \
    }

// Launches FP4 cache kernel `name` as impls/cupy_flash.py does; returns 1 for an unknown name.
extern "C" int run_flash_fp4(const char* name, const void* q, const void* k, const void* v,
                             void* o, float* lse, int batch_heads, int tq, int tk, float scale,
                             int causal, int heads_per_kv, const float* k_global,
                             const float* v_global, const bits8* k_block_scales,
                             const bits8* v_block_scales) {
    const Index3 grid{unsigned((tq + BLOCK_M - 1) / BLOCK_M), unsigned(batch_heads), 1};
    RUN_FP4_IF(flash_f16_nvfp4_d32)
    RUN_FP4_IF(flash_f16_nvfp4_d64)
    RUN_FP4_IF(flash_f16_nvfp4_d128)
    RUN_FP4_IF(flash_f16_mxfp4_d32)
    RUN_FP4_IF(flash_f16_mxfp4_d64)
    RUN_FP4_IF(flash_f16_mxfp4_d128)
    RUN_FP4_IF(flash_bf16_nvfp4_d32)
    RUN_FP4_IF(flash_bf16_nvfp4_d64)
    RUN_FP4_IF(flash_bf16_nvfp4_d128)
    RUN_FP4_IF(flash_bf16_mxfp4_d32)
    RUN_FP4_IF(flash_bf16_mxfp4_d64)
    RUN_FP4_IF(flash_bf16_mxfp4_d128)
    return 1;
}

// The emulation's own FP8 conversions, for tests/test_cuda_emulation.py to hold to spec.fp8.
extern "C" unsigned short emulated_pack_e4m3(float low, float high) { return pack_e4m3(low, high); }
extern "C" float emulated_fp8_value(unsigned char byte, int e5m2) { return fp8_value(byte, e5m2); }
extern "C" float emulated_e8m0_value(unsigned char code) { return e8m0_value(code); }
