// cupy_flash: fused attention in the manner of FlashAttention-2, one kernel per (dtype, head dim).
//
// One block per (BLOCK_M query rows, batch x head). It streams BLOCK_N keys at a time through
// shared memory with an online softmax (running max m, running sum l, the accumulator rescaled
// by exp(m_old - m_new)), stops after the last key tile its rows may see (bottom-right causal
// alignment: query i sits at absolute position i + Tk - Tq), and never materialises the (Tq, Tk)
// score matrix. The tiles, the skipping and the rescaling are those of impls/numpy_flash.py, the
// NumPy mirror the suite validates on every CPU run; BLOCK_M and BLOCK_N come from there as -D
// options (impls/cuda_kernels.py).
//
// Kernel versions side by side:
//   flash_{f16,bf16}_d{32,64,128}  tensor cores (mma.sync m16n8k16), float32 accumulation;
//                                  4 warps x 16 query rows, Q kept in registers as A fragments;
//                                  K and V fragments by ldmatrix, tiles copied by cp.async while
//                                  the previous step computes, the mask only on partial tiles.
//   flash_f32_d{32,64,128}         float32 on the CUDA cores; 2 threads per query row.
//   ..._softcap                    each of the above with the softcap compiled in.
//   flash_{e4m3,e5m2}_d{32,64,128} FP8 q, k, v with FlashAttention 3's descales: tensor cores
//                                  (mma.sync m16n8k32, sm_89 and up), P rounded to e4m3 with
//                                  its 2^8 offset, the output in bfloat16; tiles loaded by plain
//                                  loads, V transposed on the way.
//   flash_mx_{e4m3,e5m2}_d{32,64,128}  MXFP8 (spec.block_scaled's mx_attention): the FP8 kernel with
//                                  an e8m0 scale per 32 elements, q's and k's along D, v's along
//                                  the keys; each 32-wide k-step of both products (one block)
//                                  summed by its own mma and scaled by its blocks' scales.
//   flash_{f16,bf16}_{nvfp4,mxfp4}_d{32,64,128}  the tensor-core kernel over an FP4 cache (spec.
//                                  block_scaled's fp4_cache): each key and value tile decoded into
//                                  shared memory as it comes in (Fp4Tiles), q's 16 bits.
//   flash_sparse_d{32,64,128}      index-sparse: each row walks its own list of keys (kv_indices),
//                                  float32 on the CUDA cores, 4 threads per row (below).
//
// 16-bit values travel as raw bits (unsigned short) and are converted with PTX cvt, so the source
// needs no cuda_fp16.h / cuda_bf16.h and NVRTC compiles it with no include path (sm_80 and up).
// All arrays are contiguous (B*H, T, D), K and V with B*Hkv heads; LSE, when not null, receives
// each row's natural log-sum-exp of its scaled, capped, masked scores as float32 (the sink's
// logit not included, as FlashAttention's softmax_lse).
//
// The extensions: query head h reads key/value head h / heads_per_kv (Hq / Hkv, grouped-query
// attention; 1 is plain multi-head); a left window (-1: none) keeps keys from a row's
// position - window on, its block skipping the tiles before its first row's window too; the
// _softcap kernels map each scaled score x to c tanh(x / c) before the mask; SINKS, when not null,
// holds one logit per query head (h = bh % heads), unscaled, that joins each row's denominator
// after the last tile as one more step of the online softmax. K_SCALES and V_SCALES, when not
// null, hold an FP8 key/value cache's multipliers per kv head (b * Hkv + h_kv): k's multiplies the
// scores, v's the output (impls/cupy_flash.py widens the cache's bytes to q's dtype, exactly).

#ifndef BLOCK_M
#error "compile with -DBLOCK_M=... -DBLOCK_N=... (impls/cuda_kernels.py passes numpy_flash's tiles)"
#endif

#define WARPS (BLOCK_M / 16)
#define TENSOR_CORE_THREADS (WARPS * 32)
#define F32_THREADS (BLOCK_M * 2)
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
// Shared-memory rows padded by 8 halves (16 bytes): the 8 row groups of a fragment load fall
// on different banks, and every row stays 16-byte aligned for vector copies.
#define ROW_PAD 8

static_assert(BLOCK_M % 16 == 0, "a warp owns 16 query rows");
static_assert(BLOCK_N % 16 == 0, "a key tile is a whole number of mma k-steps");

typedef unsigned char bits8;
typedef unsigned short bits16;
typedef unsigned int bits32;

__device__ __forceinline__ float negative_infinity() { return __int_as_float(0xff800000); }

// --- 16-bit formats ---------------------------------------------------------------------------

// One struct per format, differing only in the PTX type name: pack() rounds two floats into one
// register (cvt.rn.{f16,bf16}x2.f32 d, a, b puts a in the upper half and b in the lower), and
// mma() is D = A B + D on the tensor cores with float32 accumulation.
#ifndef ATTNSPEC_HOST_EMULATION  // tests/cuda_emulation/host_cuda.h has its own
#define SIXTEEN_BIT_FORMAT(NAME, PTX_TYPE)                                                     \
    struct NAME {                                                                              \
        static __device__ __forceinline__ bits32 pack(float low, float high) {                 \
            bits32 packed;                                                                     \
            asm("cvt.rn." PTX_TYPE "x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(high), "f"(low)); \
            return packed;                                                                     \
        }                                                                                      \
        static __device__ __forceinline__ void mma(float (&c)[4], const bits32 (&a)[4],        \
                                                   bits32 b0, bits32 b1) {                     \
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PTX_TYPE "." PTX_TYPE        \
                         ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};" \
                         : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                      \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));      \
        }                                                                                      \
    };
#endif

SIXTEEN_BIT_FORMAT(Float16, "f16")
SIXTEEN_BIT_FORMAT(BFloat16, "bf16")

// --- FP8 formats (sm_89 and up) ----------------------------------------------------------------

// An 8-bit mma: D = A B + D, m16n8k32, A and B in the FP8 formats named by their PTX types,
// float32 accumulation; pack_e4m3 rounds two floats to e4m3 (to nearest, saturating at +-448, NaN
// kept), `low` in the lower byte. Before sm_89 there is no FP8 instruction: the kernels compile
// (one module serves every architecture) and trap, and impls/cupy_flash.py refuses FP8 calls there.
#ifndef ATTNSPEC_HOST_EMULATION  // tests/cuda_emulation/host_cuda.h has its own
#define EIGHT_BIT_MMA(NAME, A_TYPE, B_TYPE)                                                    \
    struct NAME {                                                                              \
        static __device__ __forceinline__ void mma(float (&c)[4], const bits32 (&a)[4],        \
                                                   bits32 b0, bits32 b1) {                     \
            FP8_ONLY(asm volatile("mma.sync.aligned.m16n8k32.row.col.f32." A_TYPE "." B_TYPE   \
                                  ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "        \
                                  "{%0, %1, %2, %3};"                                          \
                                  : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])             \
                                  : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0),       \
                                    "r"(b1)));                                                 \
        }                                                                                      \
    };
#if __CUDA_ARCH__ >= 890
#define FP8_ONLY(STATEMENT) STATEMENT
#else
#define FP8_ONLY(STATEMENT) asm volatile("trap;")
#endif

__device__ __forceinline__ bits16 pack_e4m3(float low, float high) {
    unsigned short packed = 0;
    FP8_ONLY(asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(packed) : "f"(high), "f"(low)));
    return packed;
}
#endif

EIGHT_BIT_MMA(MmaE4m3E4m3, "e4m3", "e4m3")  // q k^T in e4m3, and P v with v in e4m3
EIGHT_BIT_MMA(MmaE5m2E5m2, "e5m2", "e5m2")  // q k^T in e5m2
EIGHT_BIT_MMA(MmaE4m3E5m2, "e4m3", "e5m2")  // P (e4m3) v with v in e5m2

__device__ __forceinline__ bits32 join(bits16 low, bits16 high) {
    return (bits32)low | ((bits32)high << 16);
}

// An FP8 key/value cache's scale of kv head `kv` (b * Hkv + h_kv), or 1 without one: k's multiplies
// the scores, v's the output.
__device__ __forceinline__ float kv_multiplier(const float* scales, int kv) {
    return scales == nullptr ? 1.0f : scales[kv];
}

// An e8m0 block scale's value, 2^(code - 127): 0xFF is NaN, and code 0, 2^-127, a float32
// subnormal (the exponent field alone would read it as 0).
__device__ __forceinline__ float e8m0_value(bits8 code) {
    return code == 0xFF ? __int_as_float(0x7fc00000)
                        : __int_as_float(code == 0 ? 0x00400000 : (int)code << 23);
}

// A dot product q.k to the score the softmax exponentiates, times `unit` (LOG2E for exp2f, 1 for
// expf): scaled, and with SOFTCAP capped as c tanh(x / c). A compile-time choice, so that the
// kernels without a cap hold no tanh (and no select of it) in their key-tile loops.
template <bool SOFTCAP>
struct ScoreMap {
    float multiplier;  // scale * unit, or scale / c with a cap
    float cap;         // c * unit

    __device__ __forceinline__ ScoreMap(float scale, float softcap, float unit)
        : multiplier(SOFTCAP ? scale / softcap : scale * unit), cap(softcap * unit) {}

    __device__ __forceinline__ float operator()(float dot) const {
        if constexpr (SOFTCAP) return cap * tanhf(dot * multiplier);
        else return dot * multiplier;
    }
};

struct Exp2 {
    static __device__ __forceinline__ float of(float x) { return exp2f(x); }
};
struct Exp {
    static __device__ __forceinline__ float of(float x) { return expf(x); }
};

// After the last tile: a sink logit (in the scores' units, EXP their exponential) joins a row's
// denominator alone. The running sum and max take it as one more online-softmax step; the returned
// factor rescales the accumulator. A -inf sink (no sink for this head) leaves the row as it was.
template <typename EXP>
__device__ __forceinline__ float join_sink(float& running_max, float& running_sum, float sink) {
    const float new_max = fmaxf(running_max, sink);
    const float shift = new_max == negative_infinity() ? 0.0f : new_max;
    const float correction = EXP::of(running_max - shift);
    running_sum = running_sum * correction + EXP::of(sink - shift);
    running_max = new_max;
    return correction;
}

// The first key tile a block whose first row sits at absolute position `position` visits: with a
// left window, no row of the block sees a key before position - window.
__device__ __forceinline__ int first_tile(int position, int window) {
    return window < 0 ? 0 : max(position - window, 0) / BLOCK_N * BLOCK_N;
}

// Two adjacent 16-bit elements (row, col), (row, col + 1) as one register; zero past the end.
template <int HEAD_DIM>
__device__ __forceinline__ bits32 load_pair(const bits16* base, int row, int rows, int col) {
    return row < rows ? *reinterpret_cast<const bits32*>(base + (size_t)row * HEAD_DIM + col) : 0u;
}

// --- data movement: ldmatrix and cp.async -----------------------------------------------------

#ifndef ATTNSPEC_HOST_EMULATION  // tests/cuda_emulation/host_cuda.h has its own
__device__ __forceinline__ unsigned shared_address(const void* pointer) {
    return static_cast<unsigned>(__cvta_generic_to_shared(pointer));
}

// ldmatrix.x4: four 8x8 matrices of 16-bit elements from shared memory in one instruction. Lane i
// gives the address of row i % 8 of matrix i / 8; register j of lane l receives matrix j's
// elements (l / 4, 2 (l % 4)) and (l / 4, 2 (l % 4) + 1), or with TRANSPOSE (2 (l % 4), l / 4)
// and (2 (l % 4) + 1, l / 4), the first in the lower half.
template <bool TRANSPOSE>
__device__ __forceinline__ void load_matrices(bits32 (&r)[4], const bits16* row) {
    if (TRANSPOSE)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(shared_address(row))
                     : "memory");
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(shared_address(row))
                     : "memory");
}

// cp.async: 16 bytes from global to shared memory without passing through registers, or 16 zero
// bytes where `inside` is false (a source size of 0). Copies are committed in groups, and
// wait_copies<N> returns once all but the N most recently committed groups have landed.
__device__ __forceinline__ void copy_async(void* destination, const void* source, bool inside) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(shared_address(destination)),
                 "l"(source), "r"(inside ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int PENDING>
__device__ __forceinline__ void wait_copies() {
    asm volatile("cp.async.wait_group %0;" ::"n"(PENDING) : "memory");
}
#endif

// Starts copying rows [start, start + BLOCK_N) of a (rows, HEAD_DIM) array into a shared tile,
// zeros past the end, and commits the copies as one group.
template <int HEAD_DIM, int THREADS>
__device__ __forceinline__ void start_tile_copy(bits16 (*tile)[HEAD_DIM + ROW_PAD],
                                                const bits16* src, int start, int rows) {
    constexpr int CHUNKS = HEAD_DIM / 8;  // 16-byte chunks per row
    static_assert(BLOCK_N * CHUNKS % THREADS == 0, "every thread copies as many chunks");
#pragma unroll
    for (int i = 0; i < BLOCK_N * CHUNKS / THREADS; ++i) {
        const int idx = threadIdx.x + i * THREADS;
        const int r = idx / CHUNKS, c = (idx % CHUNKS) * 8;
        const bool inside = start + r < rows;
        // Past the end the copy reads nothing, but its source must still be a valid address.
        copy_async(&tile[r][c], src + (inside ? (size_t)(start + r) * HEAD_DIM + c : 0), inside);
    }
    commit_copies();
}

template <bool VALUE>
struct Flag {
    static constexpr bool value = VALUE;
};

// How the tensor-core kernel's key and value tiles reach shared memory, rows [start, start +
// BLOCK_N) of kv head `kv` (b * Hkv + h_kv), zeros past `rows`, as one committed group of copies.
// DenseTiles copies 16-bit rows by cp.async.
template <int HEAD_DIM>
struct DenseTiles {
    const bits16* k;
    const bits16* v;
    __device__ __forceinline__ void start_k(bits16 (*tile)[HEAD_DIM + ROW_PAD], int kv, int start,
                                            int rows) const {
        start_tile_copy<HEAD_DIM, TENSOR_CORE_THREADS>(tile, k + (size_t)kv * rows * HEAD_DIM,
                                                       start, rows);
    }
    __device__ __forceinline__ void start_v(bits16 (*tile)[HEAD_DIM + ROW_PAD], int kv, int start,
                                            int rows) const {
        start_tile_copy<HEAD_DIM, TENSOR_CORE_THREADS>(tile, v + (size_t)kv * rows * HEAD_DIM,
                                                       start, rows);
    }
};

// An e2m1 code's value (spec.block_scaled): sign, 2 exponent bits (bias 1), 1 mantissa bit;
// 0, 0.5, 1, 1.5, 2, 3, 4, 6.
__device__ __forceinline__ float e2m1_value(unsigned code) {
    const unsigned exponent = (code >> 1) & 3u, mantissa = code & 1u;
    const float magnitude = exponent == 0 ? 0.5f * mantissa
                                          : __int_as_float(((exponent + 126u) << 23) | (mantissa << 22));
    return code & 8u ? -magnitude : magnitude;
}

// An e4m3fn byte's value: bias 7, subnormals below 2^-6, S.1111.111 NaN, no infinity.
__device__ __forceinline__ float e4m3_value(bits8 byte) {
    const unsigned exponent = (byte >> 3) & 15u, mantissa = byte & 7u;
    const float magnitude = (byte & 0x7Fu) == 0x7Fu ? __int_as_float(0x7fc00000)
                            : exponent == 0        ? mantissa * 0.001953125f  // m 2^-9
                                                   : __int_as_float(((exponent + 120u) << 23) | (mantissa << 20));
    return byte & 0x80u ? -magnitude : magnitude;
}

// Fp4Tiles decodes an FP4 cache's rows as it brings them in (spec.block_scaled's fp4_cache): two
// e2m1 codes a byte, the first in the low nibble, each times its block's scale (BLOCK elements
// along D; e4m3fn for NVFP4, e8m0 for MXFP4), rounded to Format (exact: at most 6 significant
// bits, within the scales' range of a 16-bit q); plain stores, which the barrier before the tile's
// first read publishes. NVFP4's global scales are the kernel's K_SCALES and V_SCALES.
template <int HEAD_DIM, typename Format, int BLOCK, bool E8M0>
struct Fp4Tiles {
    const bits8* k;
    const bits8* v;
    const bits8* k_block_scales;
    const bits8* v_block_scales;
    __device__ __forceinline__ void decode(bits16 (*tile)[HEAD_DIM + ROW_PAD], const bits8* packed,
                                           const bits8* scales, int kv, int start, int rows) const {
        constexpr int BYTES = HEAD_DIM / 2, BLOCKS = HEAD_DIM / BLOCK;
        for (int idx = threadIdx.x; idx < BLOCK_N * BYTES; idx += TENSOR_CORE_THREADS) {
            const int r = idx / BYTES, byte = idx % BYTES;
            bits32 pair = 0u;
            if (start + r < rows) {
                const size_t token = (size_t)kv * rows + start + r;
                const bits8 codes = packed[token * BYTES + byte];
                const bits8 code = scales[token * BLOCKS + 2 * byte / BLOCK];
                const float scale = E8M0 ? e8m0_value(code) : e4m3_value(code);
                pair = Format::pack(e2m1_value(codes & 15u) * scale, e2m1_value(codes >> 4) * scale);
            }
            *reinterpret_cast<bits32*>(&tile[r][2 * byte]) = pair;
        }
        commit_copies();  // none made: an empty group keeps wait_copies counting right
    }
    __device__ __forceinline__ void start_k(bits16 (*tile)[HEAD_DIM + ROW_PAD], int kv, int start,
                                            int rows) const {
        decode(tile, k, k_block_scales, kv, start, rows);
    }
    __device__ __forceinline__ void start_v(bits16 (*tile)[HEAD_DIM + ROW_PAD], int kv, int start,
                                            int rows) const {
        decode(tile, v, v_block_scales, kv, start, rows);
    }
};

// --- a C fragment's rows (the tensor-core kernels') ---------------------------------------------
//
// A thread holds two rows of each 16x8 C fragment, row0 and row0 + 8 (r = 0, 1), two columns each;
// the 4 threads of a group hold a row's 8 columns between them.

// One online-softmax step after a tile's scores: each row's tile maximum over its group, the new
// running maximum, the shift this tile's exponentials take and the correction of what came before.
__device__ __forceinline__ void next_row_maxima(float (&tile_max)[2], float (&running_max)[2],
                                                float (&shift)[2], float (&correction)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
        const float new_max = fmaxf(running_max[r], tile_max[r]);
        // A row that has seen only masked keys shifts by 0, not -inf (-inf - -inf is NaN).
        shift[r] = new_max == negative_infinity() ? 0.0f : new_max;
        correction[r] = exp2f(running_max[r] - shift[r]);
        running_max[r] = new_max;
    }
}

// What came before scaled by each row's correction, and this tile's share of the sums added.
template <int HEAD_DIM>
__device__ __forceinline__ void rescale_rows(float (&acc)[HEAD_DIM / 8][4], float (&running_sum)[2],
                                             const float (&tile_sum)[2],
                                             const float (&correction)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) running_sum[r] = running_sum[r] * correction[r] + tile_sum[r];
#pragma unroll
    for (int t = 0; t < HEAD_DIM / 8; ++t) {
        acc[t][0] *= correction[0];
        acc[t][1] *= correction[0];
        acc[t][2] *= correction[1];
        acc[t][3] *= correction[1];
    }
}

// A row's sum after the last tile: its group's shares added (every lane must take part).
__device__ __forceinline__ float row_total(float share) {
    share += __shfl_xor_sync(0xffffffffu, share, 1);
    return share + __shfl_xor_sync(0xffffffffu, share, 2);
}

// Row r of this thread's accumulator, times `factor`, as Format's pairs at `row` of o.
template <int HEAD_DIM, typename Format>
__device__ __forceinline__ void store_row(bits16* o, int row, const float (&acc)[HEAD_DIM / 8][4],
                                          int r, float factor, int tig) {
#pragma unroll
    for (int t = 0; t < HEAD_DIM / 8; ++t) {
        const bits32 pair = Format::pack(acc[t][2 * r] * factor, acc[t][2 * r + 1] * factor);
        *reinterpret_cast<bits32*>(o + (size_t)row * HEAD_DIM + t * 8 + 2 * tig) = pair;
    }
}

// --- tensor-core kernel (float16, bfloat16) ---------------------------------------------------
//
// mma.m16n8k16 fragments (PTX ISA, "Matrix fragments for mma.m16n8k16"): lane = 4 * group + tig.
//   A (16x16, row-major): a0 = (group, 2tig..+1), a1 = (group+8, 2tig..), a2 = (group, 2tig+8..),
//                         a3 = (group+8, 2tig+8..)
//   B (16x8, col-major):  b0 = (k 2tig..+1, n group), b1 = (k 2tig+8..+9, n group)
//   C (16x8, float32):    c0, c1 = (group, 2tig..+1), c2, c3 = (group+8, 2tig..+1)
// So the B fragments of S = Q K^T are ldmatrix's registers for 8x8 blocks of K's rows as they lie
// in shared memory, those of P V the transposed ones for V's, and the probabilities of two
// adjacent 8-key C tiles are exactly the A fragment of one 16-key k-step of P V.
//
// Per key tile, four barriers: K has landed; every warp has read K (the next tile's K may be
// copied in while this tile's softmax runs); V has landed; every warp has read V. Only the tiles
// that some row of the block sees in part (the diagonal, a window's edge, past Tk) compute a mask.

template <int HEAD_DIM, typename Format, bool SOFTCAP, typename Tiles>
__device__ __forceinline__ void flash_forward_tensor_cores(
    const bits16* __restrict__ Q, const Tiles tiles, bits16* __restrict__ O, float* __restrict__ LSE, int tq, int tk, float scale, int causal,
    int heads_per_kv, int window, float softcap, const float* __restrict__ sinks, int heads,
    const float* __restrict__ k_scales, const float* __restrict__ v_scales) {
    static_assert(HEAD_DIM % 16 == 0, "head dim must be a multiple of 16");
    __shared__ __align__(16) bits16 k_tile[BLOCK_N][HEAD_DIM + ROW_PAD];
    __shared__ __align__(16) bits16 v_tile[BLOCK_N][HEAD_DIM + ROW_PAD];

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int group = lane / 4, tig = lane % 4;
    const int matrix = lane / 8, matrix_row = lane % 8;  // the row this lane addresses for ldmatrix
    const int bh = blockIdx.y;
    const int block_start = blockIdx.x * BLOCK_M;
    const int offset = tk - tq;
    const bits16* q = Q + (size_t)bh * tq * HEAD_DIM;
    // (b * Hq + h) / g = b * Hkv + h / g, since Hq = g * Hkv (g = heads_per_kv)
    const int kv = bh / heads_per_kv;
    const int row0 = block_start + warp * 16 + group;  // this thread's rows: row0 and row0 + 8

    bits32 q_frag[HEAD_DIM / 16][4];
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
        q_frag[kk][0] = load_pair<HEAD_DIM>(q, row0, tq, kk * 16 + 2 * tig);
        q_frag[kk][1] = load_pair<HEAD_DIM>(q, row0 + 8, tq, kk * 16 + 2 * tig);
        q_frag[kk][2] = load_pair<HEAD_DIM>(q, row0, tq, kk * 16 + 8 + 2 * tig);
        q_frag[kk][3] = load_pair<HEAD_DIM>(q, row0 + 8, tq, kk * 16 + 8 + 2 * tig);
    }

    // Scores are kept in the log2 domain (times log2 e) so that exp2f does the exponentials.
    const ScoreMap<SOFTCAP> score_of(scale * kv_multiplier(k_scales, kv), softcap, LOG2E);
    float running_max[2] = {negative_infinity(), negative_infinity()};
    float running_sum[2] = {0.0f, 0.0f};  // this thread's columns only; summed over tig at the end
    float acc[HEAD_DIM / 8][4];
#pragma unroll
    for (int t = 0; t < HEAD_DIM / 8; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;

    const int end = causal ? min(tk, block_start + BLOCK_M + offset) : tk;
    const int first = first_tile(block_start + offset, window);
    // Whether some row of the block sees only part of the tile at tile_start.
    auto seen_in_part = [&](int tile_start) {
        return tile_start + BLOCK_N > tk ||
               (causal && tile_start + BLOCK_N - 1 > block_start + offset) ||
               (window >= 0 && tile_start < block_start + BLOCK_M - 1 + offset - window);
    };

    auto key_tile = [&](int tile_start, auto masked) {
        constexpr bool MASKED = decltype(masked)::value;
        const int next = tile_start + BLOCK_N;
        wait_copies<1>();  // this thread's copies of K (V's may still be on their way)
        __syncthreads();   // everyone's

        float s[BLOCK_N / 8][4];
#pragma unroll
        for (int t = 0; t < BLOCK_N / 8; ++t) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
#pragma unroll
            for (int t = 0; t < BLOCK_N / 8; t += 2) {
                // matrix j: keys (t + j / 2) * 8 .., head dims kk * 16 + (j % 2) * 8 ..
                bits32 b[4];
                load_matrices<false>(
                    b, &k_tile[(t + matrix / 2) * 8 + matrix_row][kk * 16 + (matrix % 2) * 8]);
                Format::mma(s[t], q_frag[kk], b[0], b[1]);
                Format::mma(s[t + 1], q_frag[kk], b[2], b[3]);
            }
        }
        __syncthreads();  // K is no longer read: the next tile's may come in
        if (next < end) tiles.start_k(k_tile, kv, next, tk);
        else commit_copies();  // an empty group keeps wait_copies<1> counting right

        float tile_max[2] = {negative_infinity(), negative_infinity()};
#pragma unroll
        for (int t = 0; t < BLOCK_N / 8; ++t) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if (MASKED) {
                    const int row = row0 + 8 * (e / 2);
                    const int col = tile_start + t * 8 + 2 * tig + (e % 2);
                    const bool visible = col < tk && (!causal || col <= row + offset) &&
                                         (window < 0 || col >= row + offset - window);
                    // Overwritten, not added to: a NaN or inf future score must not survive.
                    s[t][e] = visible ? score_of(s[t][e]) : negative_infinity();
                } else {
                    s[t][e] = score_of(s[t][e]);
                }
                tile_max[e / 2] = fmaxf(tile_max[e / 2], s[t][e]);
            }
        }
        float shift[2], correction[2];
        next_row_maxima(tile_max, running_max, shift, correction);

        bits32 p_frag[BLOCK_N / 16][4];
        float tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int t = 0; t < BLOCK_N / 8; ++t) {
            const float p0 = exp2f(s[t][0] - shift[0]), p1 = exp2f(s[t][1] - shift[0]);
            const float p2 = exp2f(s[t][2] - shift[1]), p3 = exp2f(s[t][3] - shift[1]);
            tile_sum[0] += p0 + p1;
            tile_sum[1] += p2 + p3;
            // C tile t is half of k-step t / 2: columns 0..7 are a0/a1, columns 8..15 a2/a3.
            p_frag[t / 2][(t % 2) * 2 + 0] = Format::pack(p0, p1);
            p_frag[t / 2][(t % 2) * 2 + 1] = Format::pack(p2, p3);
        }
        rescale_rows<HEAD_DIM>(acc, running_sum, tile_sum, correction);

        wait_copies<1>();  // this tile's V (the next tile's K may still be on its way)
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
#pragma unroll
            for (int t = 0; t < HEAD_DIM / 8; t += 2) {
                // matrix j, transposed: keys kk * 16 + (j % 2) * 8 .., head dims (t + j / 2) * 8 ..
                bits32 b[4];
                load_matrices<true>(
                    b, &v_tile[kk * 16 + (matrix % 2) * 8 + matrix_row][(t + matrix / 2) * 8]);
                Format::mma(acc[t], p_frag[kk], b[0], b[1]);
                Format::mma(acc[t + 1], p_frag[kk], b[2], b[3]);
            }
        }
        __syncthreads();  // V is no longer read
        if (next < end) tiles.start_v(v_tile, kv, next, tk);
        else commit_copies();
    };

    if (first < end) {
        tiles.start_k(k_tile, kv, first, tk);
        tiles.start_v(v_tile, kv, first, tk);
    }
    // Masked tiles, whole tiles, masked tiles: a window's edge, the tiles every row sees whole,
    // then the diagonal and the tile past Tk (any of the three may be empty).
    int tile_start = first;
    for (; tile_start < end && seen_in_part(tile_start); tile_start += BLOCK_N)
        key_tile(tile_start, Flag<true>());
    for (; tile_start < end && !seen_in_part(tile_start); tile_start += BLOCK_N)
        key_tile(tile_start, Flag<false>());
    for (; tile_start < end; tile_start += BLOCK_N) key_tile(tile_start, Flag<true>());

    bits16* o = O + (size_t)bh * tq * HEAD_DIM;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        running_sum[r] = row_total(running_sum[r]);
        const int row = row0 + 8 * r;
        if (row >= tq) continue;
        if (LSE != nullptr && tig == 0)
            LSE[(size_t)bh * tq + row] = (running_max[r] + log2f(running_sum[r])) * LN2;
        const float correction =
            sinks == nullptr
                ? 1.0f
                : join_sink<Exp2>(running_max[r], running_sum[r], sinks[bh % heads] * LOG2E);
        const float factor = correction * kv_multiplier(v_scales, kv) / running_sum[r];
        store_row<HEAD_DIM, Format>(o, row, acc, r, factor, tig);
    }
}

// --- FP8 tensor-core kernel (FlashAttention 3's convention; sm_89 and up) ----------------------
//
// q, k and v in one FP8 format as bytes, with float32 descales per (b, h_kv) that multiply the
// scores (q's and k's) and the output (v's). Per key tile: S = q k^T by mma.sync m16n8k32 on the
// stored bytes, float32 sums; the online softmax as in the 16-bit kernel; P rounded as
// FlashAttention 3 rounds it, P * 2^8 to e4m3 (so that small weights stay normal), and P v by
// the same mma with v's bytes, the 2^8 divided out with the row's sum at the end; the output in
// bfloat16. The row sums are of P before its rounding.
//
// mma.m16n8k32 fragments for 8-bit types (PTX ISA, "Matrix fragments for mma.m16n8k32"), four
// elements to a register, the first in the lowest byte:
//   A (16x32, row-major): a0 = (group, 4tig..+3), a1 = (group+8, 4tig..), a2 = (group, 16+4tig..),
//                         a3 = (group+8, 16+4tig..)
//   B (32x8, col-major):  b0 = (k 4tig..+3, n group), b1 = (k 16+4tig..+3, n group)
//   C (16x8, float32):    as m16n8k16's
// q's and k's fragments are 4 adjacent bytes of a row. P v sums over keys in any order, so P's A
// fragment is S's C fragments as they lie, keys (2tig, 2tig+1, 8+2tig, 9+2tig) of each 16, and
// v's B fragment takes the same keys: v is stored transposed in shared memory (a head dim's keys
// adjacent) by the plain loads that bring each tile in (no cp.async: the bytes are transposed on
// the way), between two barriers.

#define FP8_ROW_PAD 16  // bytes: every shared row 16-byte aligned, fragment rows on other banks
#define FP8_OFFSET 256.0f  // P's 2^8 (spec.fp8.P_OFFSET_EXPONENT)

static_assert(BLOCK_N % 32 == 0, "a key tile is a whole number of 8-bit mma k-steps");

// Rows [start, start + BLOCK_N) of k (as they lie) and of v (transposed) into shared tiles, zeros
// past the end.
template <int HEAD_DIM>
__device__ __forceinline__ void load_fp8_tiles(bits8 (*k_tile)[HEAD_DIM + FP8_ROW_PAD],
                                               bits8 (*v_tile)[BLOCK_N + FP8_ROW_PAD],
                                               const bits8* k, const bits8* v, int start,
                                               int rows) {
    constexpr int CHUNKS = HEAD_DIM / 16;  // 16-byte chunks per row of k
    for (int idx = threadIdx.x; idx < BLOCK_N * CHUNKS; idx += TENSOR_CORE_THREADS) {
        const int r = idx / CHUNKS, c = (idx % CHUNKS) * 16;
        *reinterpret_cast<uint4*>(&k_tile[r][c]) =
            start + r < rows ? *reinterpret_cast<const uint4*>(k + (size_t)(start + r) * HEAD_DIM + c)
                             : make_uint4(0u, 0u, 0u, 0u);
    }
    constexpr int QUADS = HEAD_DIM / 4;  // 4-byte words per row of v
    for (int idx = threadIdx.x; idx < BLOCK_N * QUADS; idx += TENSOR_CORE_THREADS) {
        const int r = idx / QUADS, c = (idx % QUADS) * 4;
        const bits32 quad =
            start + r < rows ? *reinterpret_cast<const bits32*>(v + (size_t)(start + r) * HEAD_DIM + c)
                             : 0u;
#pragma unroll
        for (int j = 0; j < 4; ++j) v_tile[c + j][r] = (bits8)(quad >> (8 * j));
    }
}

// MXFP8's block scales of rows [start, start + BLOCK_N) as floats into shared tiles: k's, a key's
// D / 32 along D, and v's, the tile's BLOCK_N / 32 blocks of keys along D (the keys are a whole
// number of blocks: impls/block_scaled_calls.py refuses others); 0 past the end, where the
// elements are 0 too.
template <int HEAD_DIM>
__device__ __forceinline__ void load_block_scales(float (*k_scale)[HEAD_DIM / 32],
                                                  float (*v_scale)[HEAD_DIM], const bits8* k_scales,
                                                  const bits8* v_scales, int start, int rows) {
    constexpr int K_BLOCKS = HEAD_DIM / 32;
    for (int idx = threadIdx.x; idx < BLOCK_N * K_BLOCKS; idx += TENSOR_CORE_THREADS) {
        const int r = idx / K_BLOCKS, c = idx % K_BLOCKS;
        k_scale[r][c] = start + r < rows ? e8m0_value(k_scales[(size_t)(start + r) * K_BLOCKS + c])
                                         : 0.0f;
    }
    for (int idx = threadIdx.x; idx < BLOCK_N / 32 * HEAD_DIM; idx += TENSOR_CORE_THREADS) {
        const int b = idx / HEAD_DIM, c = idx % HEAD_DIM;
        const int block = start / 32 + b;
        v_scale[b][c] = block * 32 < rows ? e8m0_value(v_scales[(size_t)block * HEAD_DIM + c]) : 0.0f;
    }
}

// Four adjacent bytes (row, col..col+3) as one register; zero past the end.
template <int HEAD_DIM>
__device__ __forceinline__ bits32 load_quad(const bits8* base, int row, int rows, int col) {
    return row < rows ? *reinterpret_cast<const bits32*>(base + (size_t)row * HEAD_DIM + col) : 0u;
}

// BLOCK_SCALED (MXFP8): Q_SCALES (B*H, Tq, D/32), K_SCALES (B*Hkv, Tk, D/32) and V_SCALES
// (B*Hkv, Tk/32, D), e8m0 bytes. A k-step of 32 is one block of q's row and of k's key, and one
// block of 32 keys of v's column: each k-step's mma sums into zeros, and its sums, times the
// blocks' scales, join the scores or the accumulator in float32 (as a block-scaled MMA applies
// them), with the descales 1.
template <int HEAD_DIM, typename ScoreMma, typename ValueMma, bool BLOCK_SCALED = false>
__device__ __forceinline__ void flash_forward_fp8(
    const bits8* __restrict__ Q, const bits8* __restrict__ K, const bits8* __restrict__ V,
    bits16* __restrict__ O, float* __restrict__ LSE, int tq, int tk, float scale, int causal,
    int heads_per_kv, const float* __restrict__ q_descale, const float* __restrict__ k_descale,
    const float* __restrict__ v_descale, const bits8* __restrict__ Q_SCALES = nullptr,
    const bits8* __restrict__ K_SCALES = nullptr, const bits8* __restrict__ V_SCALES = nullptr) {
    static_assert(HEAD_DIM % 32 == 0, "head dim must be a multiple of 32");
    constexpr int SCALED_KEYS = BLOCK_SCALED ? BLOCK_N : 1;  // no scale tiles without blocks
    __shared__ __align__(16) bits8 k_tile[BLOCK_N][HEAD_DIM + FP8_ROW_PAD];
    __shared__ __align__(16) bits8 v_tile[HEAD_DIM][BLOCK_N + FP8_ROW_PAD];  // transposed
    __shared__ float k_scale_tile[SCALED_KEYS][HEAD_DIM / 32];
    __shared__ float v_scale_tile[(SCALED_KEYS + 31) / 32][HEAD_DIM];

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int group = lane / 4, tig = lane % 4;
    const int bh = blockIdx.y;
    const int kv = bh / heads_per_kv;  // b * Hkv + h / g: the kv head, and its descales' index
    const int block_start = blockIdx.x * BLOCK_M;
    const int offset = tk - tq;
    const bits8* q = Q + (size_t)bh * tq * HEAD_DIM;
    const bits8* k = K + (size_t)kv * tk * HEAD_DIM;
    const bits8* v = V + (size_t)kv * tk * HEAD_DIM;
    const int row0 = block_start + warp * 16 + group;  // this thread's rows: row0 and row0 + 8

    bits32 q_frag[HEAD_DIM / 32][4];
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 32; ++kk) {
        q_frag[kk][0] = load_quad<HEAD_DIM>(q, row0, tq, kk * 32 + 4 * tig);
        q_frag[kk][1] = load_quad<HEAD_DIM>(q, row0 + 8, tq, kk * 32 + 4 * tig);
        q_frag[kk][2] = load_quad<HEAD_DIM>(q, row0, tq, kk * 32 + 16 + 4 * tig);
        q_frag[kk][3] = load_quad<HEAD_DIM>(q, row0 + 8, tq, kk * 32 + 16 + 4 * tig);
    }
    float q_scale[2][HEAD_DIM / 32];  // rows row0 and row0 + 8, a scale per k-step
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = row0 + 8 * r;
#pragma unroll
        for (int kk = 0; kk < HEAD_DIM / 32; ++kk)
            q_scale[r][kk] = BLOCK_SCALED && row < tq
                                 ? e8m0_value(Q_SCALES[((size_t)bh * tq + row) * (HEAD_DIM / 32) + kk])
                                 : 1.0f;
    }

    const ScoreMap<false> score_of(scale * kv_multiplier(q_descale, kv) * kv_multiplier(k_descale, kv),
                                   0.0f, LOG2E);
    float running_max[2] = {negative_infinity(), negative_infinity()};
    float running_sum[2] = {0.0f, 0.0f};  // this thread's columns only; summed over tig at the end
    float acc[HEAD_DIM / 8][4];
#pragma unroll
    for (int t = 0; t < HEAD_DIM / 8; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;

    const int end = causal ? min(tk, block_start + BLOCK_M + offset) : tk;
    for (int tile_start = 0; tile_start < end; tile_start += BLOCK_N) {
        __syncthreads();  // every warp is done with the previous tile
        load_fp8_tiles<HEAD_DIM>(k_tile, v_tile, k, v, tile_start, tk);
        if constexpr (BLOCK_SCALED)
            load_block_scales<HEAD_DIM>(k_scale_tile, v_scale_tile,
                                        K_SCALES + (size_t)kv * tk * (HEAD_DIM / 32),
                                        V_SCALES + (size_t)kv * (tk / 32) * HEAD_DIM, tile_start, tk);
        __syncthreads();

        float s[BLOCK_N / 8][4];
#pragma unroll
        for (int t = 0; t < BLOCK_N / 8; ++t) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HEAD_DIM / 32; ++kk) {
#pragma unroll
            for (int t = 0; t < BLOCK_N / 8; ++t) {
                const bits8* key = &k_tile[t * 8 + group][kk * 32 + 4 * tig];
                const bits32 b0 = *reinterpret_cast<const bits32*>(key);
                const bits32 b1 = *reinterpret_cast<const bits32*>(key + 16);
                if constexpr (BLOCK_SCALED) {
                    float block[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    ScoreMma::mma(block, q_frag[kk], b0, b1);
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        s[t][e] += block[e] * q_scale[e / 2][kk] *
                                   k_scale_tile[t * 8 + 2 * tig + (e % 2)][kk];
                } else {
                    ScoreMma::mma(s[t], q_frag[kk], b0, b1);
                }
            }
        }

        float tile_max[2] = {negative_infinity(), negative_infinity()};
#pragma unroll
        for (int t = 0; t < BLOCK_N / 8; ++t) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = row0 + 8 * (e / 2);
                const int col = tile_start + t * 8 + 2 * tig + (e % 2);
                // Overwritten, not added to: a NaN or inf future score must not survive.
                s[t][e] = col < tk && (!causal || col <= row + offset) ? score_of(s[t][e])
                                                                       : negative_infinity();
                tile_max[e / 2] = fmaxf(tile_max[e / 2], s[t][e]);
            }
        }
        float shift[2], correction[2];
        next_row_maxima(tile_max, running_max, shift, correction);

        // P's A fragments: 32 keys per k-step, C tiles 4c .. 4c + 3; a register holds a row's
        // keys (2tig, 2tig+1) of C tile t and of C tile t + 1.
        bits32 p_frag[BLOCK_N / 32][4];
        float tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int t = 0; t < BLOCK_N / 8; t += 2) {
            float p[2][4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                p[0][e] = exp2f(s[t][e] - shift[e / 2]);
                p[1][e] = exp2f(s[t + 1][e] - shift[e / 2]);
                tile_sum[e / 2] += p[0][e] + p[1][e];
            }
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const bits16 low = pack_e4m3(p[0][2 * r] * FP8_OFFSET, p[0][2 * r + 1] * FP8_OFFSET);
                const bits16 high = pack_e4m3(p[1][2 * r] * FP8_OFFSET, p[1][2 * r + 1] * FP8_OFFSET);
                p_frag[t / 4][(t / 2) % 2 * 2 + r] = join(low, high);
            }
        }
        rescale_rows<HEAD_DIM>(acc, running_sum, tile_sum, correction);

#pragma unroll
        for (int c = 0; c < BLOCK_N / 32; ++c) {
#pragma unroll
            for (int t = 0; t < HEAD_DIM / 8; ++t) {
                // head dim t * 8 + group, keys c * 32 + (2tig, 2tig+1, 8+2tig, 9+2tig) and 16 on
                const bits8* keys = &v_tile[t * 8 + group][c * 32 + 2 * tig];
                const bits32 b0 = join(*reinterpret_cast<const bits16*>(keys),
                                       *reinterpret_cast<const bits16*>(keys + 8));
                const bits32 b1 = join(*reinterpret_cast<const bits16*>(keys + 16),
                                       *reinterpret_cast<const bits16*>(keys + 24));
                if constexpr (BLOCK_SCALED) {
                    float block[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    ValueMma::mma(block, p_frag[c], b0, b1);
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        acc[t][e] += block[e] * v_scale_tile[c][t * 8 + 2 * tig + (e % 2)];
                } else {
                    ValueMma::mma(acc[t], p_frag[c], b0, b1);
                }
            }
        }
    }

    bits16* o = O + (size_t)bh * tq * HEAD_DIM;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        running_sum[r] = row_total(running_sum[r]);
        const int row = row0 + 8 * r;
        if (row >= tq) continue;
        if (LSE != nullptr && tig == 0)
            LSE[(size_t)bh * tq + row] = (running_max[r] + log2f(running_sum[r])) * LN2;
        store_row<HEAD_DIM, BFloat16>(
            o, row, acc, r, kv_multiplier(v_descale, kv) / (FP8_OFFSET * running_sum[r]), tig);
    }
}

// --- float32 kernel ---------------------------------------------------------------------------
//
// Two threads per query row, each holding half of q and of the accumulator (interleaved columns
// 2c + half, so the pair reads adjacent shared-memory words). Per key tile: the scores go to
// shared memory (key-major, so a warp's 16 rows hit 16 banks), then V replaces K in the same
// buffer and is accumulated with the tile's rescaling. 48 KiB of shared memory at D = 128.

template <int HEAD_DIM, bool SOFTCAP>
__device__ __forceinline__ void flash_forward_float32(const float* __restrict__ Q,
                                                      const float* __restrict__ K,
                                                      const float* __restrict__ V,
                                                      float* __restrict__ O,
                                                      float* __restrict__ LSE, int tq, int tk,
                                                      float scale, int causal, int heads_per_kv,
                                                      int window, float softcap,
                                                      const float* __restrict__ sinks, int heads,
                                                      const float* __restrict__ k_scales,
                                                      const float* __restrict__ v_scales) {
    constexpr int HALF = HEAD_DIM / 2;
    __shared__ float kv_tile[BLOCK_N][HEAD_DIM];
    __shared__ float scores[BLOCK_N][BLOCK_M];

    const int local_row = threadIdx.x / 2, half = threadIdx.x % 2;
    const int bh = blockIdx.y;
    const int block_start = blockIdx.x * BLOCK_M;
    const int row = block_start + local_row;
    const int offset = tk - tq;
    const float* k = K + (size_t)(bh / heads_per_kv) * tk * HEAD_DIM;
    const float* v = V + (size_t)(bh / heads_per_kv) * tk * HEAD_DIM;

    float q[HALF], acc[HALF];
#pragma unroll
    for (int c = 0; c < HALF; ++c) {
        q[c] = row < tq ? Q[((size_t)bh * tq + row) * HEAD_DIM + 2 * c + half] : 0.0f;
        acc[c] = 0.0f;
    }
    float running_max = negative_infinity(), running_sum = 0.0f;
    const ScoreMap<SOFTCAP> score_of(scale * kv_multiplier(k_scales, bh / heads_per_kv), softcap,
                                     1.0f);

    const int end = causal ? min(tk, block_start + BLOCK_M + offset) : tk;
    const int first = first_tile(block_start + offset, window);
    for (int tile_start = first; tile_start < end; tile_start += BLOCK_N) {
        __syncthreads();
        for (int idx = threadIdx.x; idx < BLOCK_N * HEAD_DIM; idx += F32_THREADS) {
            const int r = idx / HEAD_DIM;
            kv_tile[r][idx % HEAD_DIM] =
                tile_start + r < tk ? k[(size_t)tile_start * HEAD_DIM + idx] : 0.0f;
        }
        __syncthreads();
        float tile_max = negative_infinity();
        for (int j = 0; j < BLOCK_N; ++j) {
            float partial = 0.0f;
#pragma unroll
            for (int c = 0; c < HALF; ++c) partial += q[c] * kv_tile[j][2 * c + half];
            const float dot = partial + __shfl_xor_sync(0xffffffffu, partial, 1);
            const int col = tile_start + j;
            const bool visible = col < tk && (!causal || col <= row + offset) &&
                                 (window < 0 || col >= row + offset - window);
            const float score = visible ? score_of(dot) : negative_infinity();
            if (half == 0) scores[j][local_row] = score;
            tile_max = fmaxf(tile_max, score);
        }
        __syncthreads();  // K is no longer read; its buffer takes V
        for (int idx = threadIdx.x; idx < BLOCK_N * HEAD_DIM; idx += F32_THREADS) {
            const int r = idx / HEAD_DIM;
            kv_tile[r][idx % HEAD_DIM] =
                tile_start + r < tk ? v[(size_t)tile_start * HEAD_DIM + idx] : 0.0f;
        }
        __syncthreads();
        const float new_max = fmaxf(running_max, tile_max);
        const float shift = new_max == negative_infinity() ? 0.0f : new_max;
        const float correction = expf(running_max - shift);
        running_max = new_max;
        running_sum *= correction;
#pragma unroll
        for (int c = 0; c < HALF; ++c) acc[c] *= correction;
        for (int j = 0; j < BLOCK_N; ++j) {
            const float p = expf(scores[j][local_row] - shift);
            running_sum += p;
#pragma unroll
            for (int c = 0; c < HALF; ++c) acc[c] += p * kv_tile[j][2 * c + half];
        }
    }
    if (row >= tq) return;
    if (LSE != nullptr && half == 0)
        LSE[(size_t)bh * tq + row] = running_max + logf(running_sum);
    const float correction =
        sinks == nullptr ? 1.0f : join_sink<Exp>(running_max, running_sum, sinks[bh % heads]);
    const float factor = correction * kv_multiplier(v_scales, bh / heads_per_kv) / running_sum;
#pragma unroll
    for (int c = 0; c < HALF; ++c)
        O[((size_t)bh * tq + row) * HEAD_DIM + 2 * c + half] = acc[c] * factor;
}

// --- the backward -------------------------------------------------------------------------------
//
// FlashAttention 2's backward in float32 (the 16-bit inputs widened by the caller, the gradients
// rounded back by it), from the forward's lse: P = exp(x - lse'), lse' the lse with the sink's
// logit joined, dS = P (dP - delta) + grad_lse exp(x - lse), delta = rowsum(dO * O), times dtanh
// under a softcap. Two kernels and no atomics, so that repeated calls are bit-identical:
//   flash_backward_dk_dv_d{32,64,128}[_softcap]  one block per (key tile, batch x key/value head):
//                                               4 threads per key, each a quarter of its columns;
//                                               dK and dV summed over every query row of the
//                                               group's heads that sees the key
//   flash_backward_dq_d{32,64,128}[_softcap]     one block per (query block, batch x head): 4
//                                               threads per row; dQ summed over the keys it sees
// A row that sees no key (lse -inf) gets P = 0. Q, K, V, dO are read from global memory in the
// innermost loop, through the cache: the kernels' aim is the arithmetic, not the speed.
#define LANES 4
#define BACKWARD_THREADS (BLOCK_M * LANES)

// The dot product of this thread's quarter of two rows, summed over the 4 lanes of its row.
__device__ __forceinline__ float lanes_sum(float partial) {
    partial += __shfl_xor_sync(0xffffffffu, partial, 1);
    return partial + __shfl_xor_sync(0xffffffffu, partial, 2);
}

struct BackwardArguments {
    const float* q;  // (B*H, Tq, D)
    const float* k;  // (B*Hkv, Tk, D)
    const float* v;
    const float* grad_out;  // (B*H, Tq, D)
    const float* lse;       // (B*H, Tq), the forward's, the sink not included
    const float* delta;     // (B*H, Tq)
    const float* grad_lse;  // (B*H, Tq) or null
    int tq, tk;
    float scale;
    int causal, heads_per_kv, window;
    float softcap;
    const float* sinks;  // (H,) or null
    int heads;
    // (B*Hkv, Tq, Tk) or null: how often each row of a key/value head lists each key, from an
    // index-sparse forward's kv_indices; a key listed m times weighs m (null: every key once)
    const int* counts;
};

// One (row, key) pair's dS / dx and P, for the query row at `row` of head `bh`: the pair's two
// dot products given. x the capped score; visibility as the forward's.
template <bool SOFTCAP>
__device__ __forceinline__ float grad_score(const BackwardArguments& a, int bh, int row, int key,
                                            float q_dot_k, float grad_dot_v, float& p) {
    const int position = row + a.tk - a.tq;
    const bool inside = row < a.tq && key < a.tk;
    const float listed =
        a.counts == nullptr || !inside
            ? 1.0f
            : (float)a.counts[((size_t)(bh / a.heads_per_kv) * a.tq + row) * a.tk + key];
    const bool visible = inside && listed > 0.0f && (!a.causal || key <= position) &&
                         (a.window < 0 || key >= position - a.window);
    const float lse = row < a.tq ? a.lse[(size_t)bh * a.tq + row] : negative_infinity();
    if (!visible || lse == negative_infinity()) {
        p = 0.0f;
        return 0.0f;
    }
    const float raw = q_dot_k * a.scale;
    const float x = SOFTCAP ? a.softcap * tanhf(raw / a.softcap) : raw;
    const float sink = a.sinks == nullptr ? negative_infinity() : a.sinks[bh % a.heads];
    const float top = fmaxf(lse, sink);
    const float with_sink = top + logf(expf(lse - top) + expf(sink - top));
    p = listed * expf(x - with_sink);
    float ds = p * (grad_dot_v - a.delta[(size_t)bh * a.tq + row]);
    if (a.grad_lse != nullptr) ds += a.grad_lse[(size_t)bh * a.tq + row] * listed * expf(x - lse);
    if (SOFTCAP) ds *= 1.0f - (x / a.softcap) * (x / a.softcap);
    return ds;
}

template <int HEAD_DIM, bool SOFTCAP>
__device__ __forceinline__ void flash_backward_dk_dv(const BackwardArguments& a,
                                                     float* __restrict__ grad_k,
                                                     float* __restrict__ grad_v) {
    constexpr int QUARTER = HEAD_DIM / LANES;
    const int local_key = threadIdx.x / LANES, lane = threadIdx.x % LANES;
    const int tile_start = blockIdx.x * BLOCK_M;
    const int key = tile_start + local_key;
    const int bkv = blockIdx.y;  // batch x key/value head
    const size_t key_base = ((size_t)bkv * a.tk + key) * HEAD_DIM;
    float k[QUARTER], v[QUARTER], dk[QUARTER], dv[QUARTER];
#pragma unroll
    for (int c = 0; c < QUARTER; ++c) {
        k[c] = key < a.tk ? a.k[key_base + LANES * c + lane] : 0.0f;
        v[c] = key < a.tk ? a.v[key_base + LANES * c + lane] : 0.0f;
        dk[c] = dv[c] = 0.0f;
    }
    // Rows before the tile's first key (absolute position) see none of it under the mask.
    const int first_row = a.causal ? max(tile_start - (a.tk - a.tq), 0) : 0;
    for (int member = 0; member < a.heads_per_kv; ++member) {
        const int bh = bkv * a.heads_per_kv + member;
        for (int row = first_row; row < a.tq; ++row) {
            const size_t row_base = ((size_t)bh * a.tq + row) * HEAD_DIM;
            float q_part = 0.0f, grad_part = 0.0f;
#pragma unroll
            for (int c = 0; c < QUARTER; ++c) {
                q_part += a.q[row_base + LANES * c + lane] * k[c];
                grad_part += a.grad_out[row_base + LANES * c + lane] * v[c];
            }
            float p;
            const float ds =
                grad_score<SOFTCAP>(a, bh, row, key, lanes_sum(q_part), lanes_sum(grad_part), p);
#pragma unroll
            for (int c = 0; c < QUARTER; ++c) {
                dv[c] += p * a.grad_out[row_base + LANES * c + lane];
                dk[c] += ds * a.q[row_base + LANES * c + lane];
            }
        }
    }
    if (key >= a.tk) return;
#pragma unroll
    for (int c = 0; c < QUARTER; ++c) {
        grad_k[key_base + LANES * c + lane] = dk[c] * a.scale;
        grad_v[key_base + LANES * c + lane] = dv[c];
    }
}

template <int HEAD_DIM, bool SOFTCAP>
__device__ __forceinline__ void flash_backward_dq(const BackwardArguments& a,
                                                  float* __restrict__ grad_q) {
    constexpr int QUARTER = HEAD_DIM / LANES;
    const int local_row = threadIdx.x / LANES, lane = threadIdx.x % LANES;
    const int block_start = blockIdx.x * BLOCK_M;
    const int row = block_start + local_row;
    const int bh = blockIdx.y;
    const size_t row_base = ((size_t)bh * a.tq + row) * HEAD_DIM;
    const size_t kv_base = (size_t)(bh / a.heads_per_kv) * a.tk * HEAD_DIM;
    float q[QUARTER], grad_out[QUARTER], dq[QUARTER];
#pragma unroll
    for (int c = 0; c < QUARTER; ++c) {
        q[c] = row < a.tq ? a.q[row_base + LANES * c + lane] : 0.0f;
        grad_out[c] = row < a.tq ? a.grad_out[row_base + LANES * c + lane] : 0.0f;
        dq[c] = 0.0f;
    }
    const int offset = a.tk - a.tq;
    const int end = a.causal ? min(a.tk, block_start + BLOCK_M + offset) : a.tk;
    for (int key = first_tile(block_start + offset, a.window); key < end; ++key) {
        const size_t key_base = kv_base + (size_t)key * HEAD_DIM;
        float q_part = 0.0f, grad_part = 0.0f;
#pragma unroll
        for (int c = 0; c < QUARTER; ++c) {
            q_part += q[c] * a.k[key_base + LANES * c + lane];
            grad_part += grad_out[c] * a.v[key_base + LANES * c + lane];
        }
        float p;
        const float ds =
            grad_score<SOFTCAP>(a, bh, row, key, lanes_sum(q_part), lanes_sum(grad_part), p);
#pragma unroll
        for (int c = 0; c < QUARTER; ++c) dq[c] += ds * a.k[key_base + LANES * c + lane];
    }
    if (row >= a.tq) return;
#pragma unroll
    for (int c = 0; c < QUARTER; ++c) grad_q[row_base + LANES * c + lane] = dq[c] * a.scale;
}

// --- the index-sparse forward ----------------------------------------------------------------
//
// INDICES (B*Hkv, Tq, SLOTS) int32: the keys each query row of a key/value head may see, -1 an
// empty slot (blocks of keys arrive as their keys: impls/cupy_flash.py lists them); TOPK_LENGTH
// (B,) or null: only each item's first slots count. One block per (BLOCK_M query rows, batch x
// head), 4 threads per row, each a quarter of its columns, as the backward's dq kernel: a row
// walks its own slots, reads each listed key's K and V rows from global memory once and takes
// it into its online softmax, key by key. A slot that is empty, past topk_length, or hidden by
// the causal mask or the window is never read, so NaN stored there cannot reach the row; a key
// listed twice weighs twice (sparse_duplicates "count", cuDNN's reference). Float32, the 16-bit
// inputs widened by the caller. Every thread of a block runs the same number of slot steps, so
// the lanes' shuffles always find their partners; a row that sees nothing is 0, its lse -inf.
template <int HEAD_DIM, bool SOFTCAP>
__device__ __forceinline__ void flash_sparse_forward(
    const float* __restrict__ Q, const float* __restrict__ K, const float* __restrict__ V,
    float* __restrict__ O, float* __restrict__ LSE, int tq, int tk, float scale, int causal,
    int heads_per_kv, int window, float softcap, const float* __restrict__ sinks, int heads,
    const int* __restrict__ indices, int slots, const int* __restrict__ topk_length) {
    constexpr int QUARTER = HEAD_DIM / LANES;
    const int local_row = threadIdx.x / LANES, lane = threadIdx.x % LANES;
    const int row = blockIdx.x * BLOCK_M + local_row;
    const int bh = blockIdx.y, bkv = bh / heads_per_kv;
    const int position = row + tk - tq;
    const size_t row_base = ((size_t)bh * tq + row) * HEAD_DIM;
    const float* k = K + (size_t)bkv * tk * HEAD_DIM;
    const float* v = V + (size_t)bkv * tk * HEAD_DIM;
    const int* listed = indices + ((size_t)bkv * tq + row) * slots;
    const int counted = topk_length == nullptr ? slots : min(slots, topk_length[bh / heads]);
    float q[QUARTER], acc[QUARTER];
#pragma unroll
    for (int c = 0; c < QUARTER; ++c) {
        q[c] = row < tq ? Q[row_base + LANES * c + lane] : 0.0f;
        acc[c] = 0.0f;
    }
    float running_max = negative_infinity(), running_sum = 0.0f;
    const ScoreMap<SOFTCAP> score_of(scale, softcap, 1.0f);
    for (int slot = 0; slot < slots; ++slot) {
        const int key = row < tq && slot < counted ? listed[slot] : -1;
        const bool seen = key >= 0 && key < tk && (!causal || key <= position) &&
                          (window < 0 || key >= position - window);
        float partial = 0.0f;
        if (seen) {
#pragma unroll
            for (int c = 0; c < QUARTER; ++c)
                partial += q[c] * k[(size_t)key * HEAD_DIM + LANES * c + lane];
        }
        const float dot = lanes_sum(partial);
        if (!seen) continue;
        const float score = score_of(dot);
        const float new_max = fmaxf(running_max, score);
        const float shift = new_max == negative_infinity() ? 0.0f : new_max;
        const float correction = expf(running_max - shift);
        const float p = expf(score - shift);
        running_max = new_max;
        running_sum = running_sum * correction + p;
#pragma unroll
        for (int c = 0; c < QUARTER; ++c)
            acc[c] = acc[c] * correction + p * v[(size_t)key * HEAD_DIM + LANES * c + lane];
    }
    if (row >= tq) return;
    if (LSE != nullptr && lane == 0)
        LSE[(size_t)bh * tq + row] = running_max + logf(running_sum);
    const float correction =
        sinks == nullptr ? 1.0f : join_sink<Exp>(running_max, running_sum, sinks[bh % heads]);
    const float factor = running_sum > 0.0f ? correction / running_sum : 0.0f;
#pragma unroll
    for (int c = 0; c < QUARTER; ++c) O[row_base + LANES * c + lane] = acc[c] * factor;
}

// --- entry points -----------------------------------------------------------------------------

// Each kernel twice: NAME without a softcap (the argument is ignored) and NAME_softcap with one.
#define TENSOR_CORE_ENTRY(NAME, HEAD_DIM, FORMAT, SOFTCAP)                                     \
    extern "C" __global__ void __launch_bounds__(TENSOR_CORE_THREADS)                          \
        NAME(const bits16* q, const bits16* k, const bits16* v, bits16* o, float* lse, int tq, \
             int tk, float scale, int causal, int heads_per_kv, int window, float softcap,     \
             const float* sinks, int heads, const float* k_scales, const float* v_scales) {    \
        flash_forward_tensor_cores<HEAD_DIM, FORMAT, SOFTCAP>(                                 \
            q, DenseTiles<HEAD_DIM>{k, v}, o, lse, tq, tk, scale, causal, heads_per_kv, window,  \
            softcap, sinks, heads, k_scales, v_scales);                                        \
    }
#define TENSOR_CORE_ENTRIES(NAME, HEAD_DIM, FORMAT)      \
    TENSOR_CORE_ENTRY(NAME, HEAD_DIM, FORMAT, false)     \
    TENSOR_CORE_ENTRY(NAME##_softcap, HEAD_DIM, FORMAT, true)

// An FP4 cache's (spec.block_scaled's fp4_cache), q in 16 bits: (q, k, v, o, lse, tq, tk, scale,
// causal, heads_per_kv, k_global, v_global, k_block_scales, v_block_scales), k and v packed e2m1
// (B*Hkv, Tk, D/2), their block scales' bytes (B*Hkv, Tk, D/BLOCK), NVFP4's global scales per kv
// head (null for MXFP4); no window, softcap or sinks (the entry point refuses them).
#define FP4_ENTRY(NAME, HEAD_DIM, FORMAT, BLOCK, E8M0)                                         \
    extern "C" __global__ void __launch_bounds__(TENSOR_CORE_THREADS)                          \
        NAME(const bits16* q, const bits8* k, const bits8* v, bits16* o, float* lse, int tq,   \
             int tk, float scale, int causal, int heads_per_kv, const float* k_global,         \
             const float* v_global, const bits8* k_block_scales,                               \
             const bits8* v_block_scales) {                                                    \
        flash_forward_tensor_cores<HEAD_DIM, FORMAT, false>(                                   \
            q, Fp4Tiles<HEAD_DIM, FORMAT, BLOCK, E8M0>{k, v, k_block_scales, v_block_scales},  \
            o, lse, tq, tk, scale, causal, heads_per_kv, -1, 0.0f, nullptr, 1, k_global,      \
            v_global);                                                                         \
    }
#define FP4_ENTRIES(NAME, HEAD_DIM, FORMAT)                 \
    FP4_ENTRY(NAME##_nvfp4_d##HEAD_DIM, HEAD_DIM, FORMAT, 16, false) \
    FP4_ENTRY(NAME##_mxfp4_d##HEAD_DIM, HEAD_DIM, FORMAT, 32, true)

#define FLOAT32_ENTRY(NAME, HEAD_DIM, SOFTCAP)                                                \
    extern "C" __global__ void __launch_bounds__(F32_THREADS)                                 \
        NAME(const float* q, const float* k, const float* v, float* o, float* lse, int tq,    \
             int tk, float scale, int causal, int heads_per_kv, int window, float softcap,    \
             const float* sinks, int heads, const float* k_scales, const float* v_scales) {   \
        flash_forward_float32<HEAD_DIM, SOFTCAP>(q, k, v, o, lse, tq, tk, scale, causal,      \
                                                 heads_per_kv, window, softcap, sinks, heads,  \
                                                 k_scales, v_scales);                          \
    }
#define FLOAT32_ENTRIES(NAME, HEAD_DIM)      \
    FLOAT32_ENTRY(NAME, HEAD_DIM, false)     \
    FLOAT32_ENTRY(NAME##_softcap, HEAD_DIM, true)

TENSOR_CORE_ENTRIES(flash_f16_d32, 32, Float16)
TENSOR_CORE_ENTRIES(flash_f16_d64, 64, Float16)
TENSOR_CORE_ENTRIES(flash_f16_d128, 128, Float16)
TENSOR_CORE_ENTRIES(flash_bf16_d32, 32, BFloat16)
TENSOR_CORE_ENTRIES(flash_bf16_d64, 64, BFloat16)
TENSOR_CORE_ENTRIES(flash_bf16_d128, 128, BFloat16)
FP4_ENTRIES(flash_f16, 32, Float16)
FP4_ENTRIES(flash_f16, 64, Float16)
FP4_ENTRIES(flash_f16, 128, Float16)
FP4_ENTRIES(flash_bf16, 32, BFloat16)
FP4_ENTRIES(flash_bf16, 64, BFloat16)
FP4_ENTRIES(flash_bf16, 128, BFloat16)
FLOAT32_ENTRIES(flash_f32_d32, 32)
FLOAT32_ENTRIES(flash_f32_d64, 64)
FLOAT32_ENTRIES(flash_f32_d128, 128)

// The FP8 kernels (FlashAttention 3's convention): (q, k, v, o, lse, tq, tk, scale, causal,
// heads_per_kv, q_descale, k_descale, v_descale), the output bfloat16.
#define FP8_ENTRY(NAME, HEAD_DIM, SCORE_MMA, VALUE_MMA)                                         \
    extern "C" __global__ void __launch_bounds__(TENSOR_CORE_THREADS)                          \
        NAME(const bits8* q, const bits8* k, const bits8* v, bits16* o, float* lse, int tq,    \
             int tk, float scale, int causal, int heads_per_kv, const float* q_descale,        \
             const float* k_descale, const float* v_descale) {                                 \
        flash_forward_fp8<HEAD_DIM, SCORE_MMA, VALUE_MMA>(q, k, v, o, lse, tq, tk, scale,      \
                                                          causal, heads_per_kv, q_descale,     \
                                                          k_descale, v_descale);               \
    }

FP8_ENTRY(flash_e4m3_d32, 32, MmaE4m3E4m3, MmaE4m3E4m3)
FP8_ENTRY(flash_e4m3_d64, 64, MmaE4m3E4m3, MmaE4m3E4m3)
FP8_ENTRY(flash_e4m3_d128, 128, MmaE4m3E4m3, MmaE4m3E4m3)
FP8_ENTRY(flash_e5m2_d32, 32, MmaE5m2E5m2, MmaE4m3E5m2)
FP8_ENTRY(flash_e5m2_d64, 64, MmaE5m2E5m2, MmaE4m3E5m2)
FP8_ENTRY(flash_e5m2_d128, 128, MmaE5m2E5m2, MmaE4m3E5m2)

// The MXFP8 kernels (spec.block_scaled's mx_attention): (q, k, v, o, lse, tq, tk, scale,
// causal, heads_per_kv, q_scales, k_scales, v_scales), e8m0 bytes, the output bfloat16.
#define MX_ENTRY(NAME, HEAD_DIM, SCORE_MMA, VALUE_MMA)                                          \
    extern "C" __global__ void __launch_bounds__(TENSOR_CORE_THREADS)                          \
        NAME(const bits8* q, const bits8* k, const bits8* v, bits16* o, float* lse, int tq,    \
             int tk, float scale, int causal, int heads_per_kv, const bits8* q_scales,         \
             const bits8* k_scales, const bits8* v_scales) {                                   \
        flash_forward_fp8<HEAD_DIM, SCORE_MMA, VALUE_MMA, true>(                               \
            q, k, v, o, lse, tq, tk, scale, causal, heads_per_kv, nullptr, nullptr, nullptr,   \
            q_scales, k_scales, v_scales);                                                     \
    }

MX_ENTRY(flash_mx_e4m3_d32, 32, MmaE4m3E4m3, MmaE4m3E4m3)
MX_ENTRY(flash_mx_e4m3_d64, 64, MmaE4m3E4m3, MmaE4m3E4m3)
MX_ENTRY(flash_mx_e4m3_d128, 128, MmaE4m3E4m3, MmaE4m3E4m3)
MX_ENTRY(flash_mx_e5m2_d32, 32, MmaE5m2E5m2, MmaE4m3E5m2)
MX_ENTRY(flash_mx_e5m2_d64, 64, MmaE5m2E5m2, MmaE4m3E5m2)
MX_ENTRY(flash_mx_e5m2_d128, 128, MmaE5m2E5m2, MmaE4m3E5m2)

// The backward's, each with and without a softcap: (q, k, v, grad_out, lse, delta, grad_lse,
// tq, tk, scale, causal, heads_per_kv, window, softcap, sinks, heads, counts, then the gradients).
#define BACKWARD_ENTRY(NAME, HEAD_DIM, SOFTCAP)                                                  \
    extern "C" __global__ void __launch_bounds__(BACKWARD_THREADS) NAME##_dk_dv(                 \
        const float* q, const float* k, const float* v, const float* grad_out, const float* lse, \
        const float* delta, const float* grad_lse, int tq, int tk, float scale, int causal,      \
        int heads_per_kv, int window, float softcap, const float* sinks, int heads,              \
        const int* counts, float* grad_k, float* grad_v) {                                       \
        const BackwardArguments a{q,      k,    v,            grad_out, lse,     delta,          \
                                  grad_lse, tq, tk,           scale,    causal,  heads_per_kv,   \
                                  window, softcap, sinks,     heads,    counts};                 \
        flash_backward_dk_dv<HEAD_DIM, SOFTCAP>(a, grad_k, grad_v);                              \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(BACKWARD_THREADS) NAME##_dq(                    \
        const float* q, const float* k, const float* v, const float* grad_out, const float* lse, \
        const float* delta, const float* grad_lse, int tq, int tk, float scale, int causal,      \
        int heads_per_kv, int window, float softcap, const float* sinks, int heads,              \
        const int* counts, float* grad_q) {                                                      \
        const BackwardArguments a{q,      k,    v,            grad_out, lse,     delta,          \
                                  grad_lse, tq, tk,           scale,    causal,  heads_per_kv,   \
                                  window, softcap, sinks,     heads,    counts};                 \
        flash_backward_dq<HEAD_DIM, SOFTCAP>(a, grad_q);                                         \
    }
#define BACKWARD_ENTRIES(NAME, HEAD_DIM)      \
    BACKWARD_ENTRY(NAME, HEAD_DIM, false)     \
    BACKWARD_ENTRY(NAME##_softcap, HEAD_DIM, true)

BACKWARD_ENTRIES(flash_backward_d32, 32)
BACKWARD_ENTRIES(flash_backward_d64, 64)
BACKWARD_ENTRIES(flash_backward_d128, 128)

// The index-sparse forward's, with and without a softcap: (q, k, v, o, lse, tq, tk, scale,
// causal, heads_per_kv, window, softcap, sinks, heads, indices, slots, topk_length), float32.
#define SPARSE_ENTRY(NAME, HEAD_DIM, SOFTCAP)                                                     \
    extern "C" __global__ void __launch_bounds__(BACKWARD_THREADS)                               \
        NAME(const float* q, const float* k, const float* v, float* o, float* lse, int tq,       \
             int tk, float scale, int causal, int heads_per_kv, int window, float softcap,       \
             const float* sinks, int heads, const int* indices, int slots,                       \
             const int* topk_length) {                                                           \
        flash_sparse_forward<HEAD_DIM, SOFTCAP>(q, k, v, o, lse, tq, tk, scale, causal,          \
                                                heads_per_kv, window, softcap, sinks, heads,     \
                                                indices, slots, topk_length);                    \
    }
#define SPARSE_ENTRIES(NAME, HEAD_DIM)      \
    SPARSE_ENTRY(NAME, HEAD_DIM, false)     \
    SPARSE_ENTRY(NAME##_softcap, HEAD_DIM, true)

SPARSE_ENTRIES(flash_sparse_d32, 32)
SPARSE_ENTRIES(flash_sparse_d64, 64)
SPARSE_ENTRIES(flash_sparse_d128, 128)
