// impls/cupy_flash.cu on the host (see host_cuda.h): one C entry point for every kernel.
#include "host_cuda.h"

#include "../../impls/cupy_flash.cu"

#define RUN_IF(NAME, THREADS, ELEMENT)                                                  \
    if (std::strcmp(name, #NAME) == 0) {                                                \
        launch(grid, THREADS, [&] {                                                     \
            NAME(static_cast<const ELEMENT*>(q), static_cast<const ELEMENT*>(k),        \
                 static_cast<const ELEMENT*>(v), static_cast<ELEMENT*>(o), lse, tq, tk, \
                 scale, causal, heads_per_kv, window, softcap, sinks, heads);           \
        });                                                                             \
        return 0;                                                                       \
    }

// Launches kernel `name` as impls/cupy_flash.py does; returns 1 for an unknown name.
extern "C" int run_flash(const char* name, const void* q, const void* k, const void* v, void* o,
                         float* lse, int batch_heads, int tq, int tk, float scale, int causal,
                         int heads_per_kv, int window, float softcap, const float* sinks,
                         int heads) {
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

// The first race the last launch saw (host_cuda.h), or an empty string.
extern "C" const char* emulation_race() { return race.c_str(); }
