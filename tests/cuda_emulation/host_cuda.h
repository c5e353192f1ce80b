// Enough of CUDA, on the host, to run the kernels of impls/*.cu unchanged on the CPU.
//
// Each CUDA thread of a block is a fiber; blocks run one after another. __syncthreads() is a
// barrier of the block, and the warp-collective operations the kernels use (__shfl_xor_sync,
// ldmatrix and mma.sync m16n8k16) exchange values through per-warp staging arrays between two warp
// barriers. cp.async poisons its destination when issued and copies at the wait that covers it, so
// a tile read before its wait shows as NaN; and every 16-byte chunk that cp.async writes or
// ldmatrix reads remembers which warps touched it since the last __syncthreads(), so that a write
// and a read by different warps with no barrier between them is reported as a race
// (emulation_error()), whichever the fibers happened to run first.
// __shared__ variables become static locals: one per kernel instantiation, shared by the block's
// threads, reused by the next block. mma follows the PTX ISA's fragment layouts for m16n8k16
// (A row-major 16x16, B column-major 16x8, C/D 16x8 float32) and for the FP8 m16n8k32, and sums
// each dot product in double.
//
// Slow (thousands of fiber switches per key tile) and only as faithful as this file, but it runs
// the kernels' own indexing, masking, tiling and fragment choreography where no GPU is at hand.

#pragma once

#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <unordered_map>
#include <functional>
#include <memory>
#include <vector>

#define ATTNSPEC_HOST_EMULATION 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(threads)
#define __shared__ static
#define __align__(bytes) __attribute__((aligned(bytes)))
#define __restrict__ __restrict

using std::max;
using std::min;

struct Index3 {
    unsigned x = 0, y = 0, z = 0;
};

struct uint4 {
    unsigned x, y, z, w;
};

inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

inline float __int_as_float(unsigned bits) {
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
}

inline float __uint_as_float(unsigned bits) { return __int_as_float(bits); }

inline unsigned float_bits(float value) {
    unsigned bits;
    std::memcpy(&bits, &value, sizeof bits);
    return bits;
}

// --- one block's threads, as fibers -------------------------------------------------------------
//
// The threads of a block are fibers on the calling OS thread, switched round-robin whenever one
// waits at a barrier: no data races, and a barrier costs one switch per thread. A fiber starts on
// its own stack through ucontext; after that, switches are _setjmp/_longjmp, which save no signal
// mask: swapcontext makes a system call per switch, and a tensor-core tile takes thousands.

struct FiberBarrier {
    int expected = 0, arrived = 0;
    unsigned generation = 0;
    void arrive_and_wait();
    void arrive_and_drop() {
        --expected;
        if (arrived > 0 && arrived == expected) release();
    }
    void release() {
        arrived = 0;
        ++generation;
    }
};

struct WarpState {
    FiberBarrier barrier;
    float exchange[32];
    unsigned a[32][4], b[32][2];
    const unsigned short* rows[32];  // ldmatrix: each lane's row address
};

// One thread's cp.async copies: those not yet committed, then the committed groups, oldest first.
struct AsyncCopy {
    void* destination;
    const void* source;
    bool inside;
};
struct CopyQueue {
    std::vector<AsyncCopy> open;
    std::deque<std::vector<AsyncCopy>> committed;
};

// Who last wrote a 16-byte chunk of shared memory, and which warps read it, in barrier epochs
// (the block barrier's generation).
struct ChunkAccess {
    unsigned write_epoch = ~0u, writer = 0;
    unsigned read_epoch = ~0u, readers = 0;  // a bit per warp
};

struct BlockState {
    FiberBarrier barrier;
    std::vector<WarpState> warps;
    std::vector<CopyQueue> copies;  // per thread
    std::unordered_map<const void*, ChunkAccess> chunks;

    // As new for the next block, keeping the memory: allocating a deque per thread for every
    // block cost more than many a kernel's own work.
    void reset(unsigned threads) {
        barrier = FiberBarrier{};
        barrier.expected = int(threads);
        const unsigned warp_count = (threads + 31) / 32;
        warps.assign(warp_count, WarpState{});
        for (unsigned w = 0; w < warp_count; ++w)
            warps[w].barrier.expected = int(std::min(32u, threads - 32 * w));
        copies.resize(threads);
        for (CopyQueue& queue : copies) {
            queue.open.clear();
            queue.committed.clear();
        }
        chunks.clear();
    }
};

// The first race the emulation saw since the last launch, or empty.
inline std::string race;

struct JumpPoint {
    jmp_buf buffer;
};

struct Scheduler {
    static constexpr std::size_t STACK_BYTES = 256 * 1024;
    std::vector<ucontext_t> fibers;  // each fiber's first entry, in the launch's first block
    std::vector<JumpPoint> restart;   // where each fiber starts the kernel again, in later blocks
    std::vector<JumpPoint> resume;    // where each started fiber continues
    std::vector<std::unique_ptr<char[]>> stacks;
    std::vector<bool> entered, started, finished;  // entered: in any block of the launch
    jmp_buf caller;
    int current = 0;
    std::function<void()> kernel;
    BlockState block;
};

inline Index3 threadIdx, blockIdx, blockDim;
inline Scheduler* scheduler = nullptr;
inline unsigned warp_index = 0, lane_index = 0;

inline void become(int fiber) {
    scheduler->current = fiber;
    threadIdx = {unsigned(fiber), 0, 0};
    warp_index = unsigned(fiber) / 32;
    lane_index = unsigned(fiber) % 32;
}

// Continues fiber `next` where it stopped, or starts it.
[[noreturn]] inline void enter(int next) {
    Scheduler& s = *scheduler;
    become(next);
    if (s.started[next]) _longjmp(s.resume[next].buffer, 1);
    s.started[next] = true;
    if (s.entered[next]) _longjmp(s.restart[next].buffer, 1);
    s.entered[next] = true;
    setcontext(&s.fibers[next]);
    __builtin_unreachable();
}

// Switches to the next unfinished fiber; back in the caller's context when none is left.
inline void switch_away() {
    Scheduler& s = *scheduler;
    const int from = s.current, count = int(s.fibers.size());
    for (int step = 1; step <= count; ++step) {
        const int next = (from + step) % count;
        if (!s.finished[next]) {
            if (next == from) return;
            if (_setjmp(s.resume[from].buffer) == 0) enter(next);
            become(from);
            return;
        }
    }
    _longjmp(s.caller, 1);
}

inline void FiberBarrier::arrive_and_wait() {
    const unsigned waiting_for = generation;
    if (++arrived == expected) {
        release();
        return;
    }
    while (generation == waiting_for) switch_away();
}

inline void __syncthreads() { scheduler->block.barrier.arrive_and_wait(); }

inline WarpState& current_warp() { return scheduler->block.warps[warp_index]; }

inline float __shfl_xor_sync(unsigned, float value, int lane_mask) {
    WarpState& warp = current_warp();
    warp.exchange[lane_index] = value;
    warp.barrier.arrive_and_wait();
    const float partner = warp.exchange[lane_index ^ lane_mask];
    warp.barrier.arrive_and_wait();  // nobody overwrites exchange[] before every lane has read
    return partner;
}

inline void run_fiber() {
    Scheduler& s = *scheduler;
    // This frame is never left (a finished thread switches away for good), so each later block
    // starts its thread by jumping back here: no getcontext/setcontext, which make a system call
    // each (two per thread and block: most of the naive kernel's emulated time before).
    _setjmp(s.restart[s.current].buffer);
    s.kernel();
    const int self = s.current;
    s.finished[self] = true;
    // A thread that has returned takes no part in later barriers.
    s.block.barrier.arrive_and_drop();
    s.block.warps[warp_index].barrier.arrive_and_drop();
    switch_away();  // never resumed
}

// Runs kernel() on every thread of every block of grid, blocks one at a time.
template <class Kernel>
void launch(Index3 grid, unsigned threads_per_block, Kernel kernel) {
    Scheduler s;
    s.kernel = kernel;
    race.clear();
    s.fibers.resize(threads_per_block);
    s.restart.resize(threads_per_block);
    s.resume.resize(threads_per_block);
    s.entered.resize(threads_per_block);
    s.started.resize(threads_per_block);
    s.finished.resize(threads_per_block);
    for (unsigned t = 0; t < threads_per_block; ++t) {
        s.stacks.emplace_back(new char[Scheduler::STACK_BYTES]);
        getcontext(&s.fibers[t]);
        s.fibers[t].uc_stack.ss_sp = s.stacks[t].get();
        s.fibers[t].uc_stack.ss_size = Scheduler::STACK_BYTES;
        s.fibers[t].uc_link = nullptr;  // run_fiber never returns
        makecontext(&s.fibers[t], run_fiber, 0);
    }
    scheduler = &s;
    blockDim = {threads_per_block, 1, 1};
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                blockIdx = {x, y, z};
                s.block.reset(threads_per_block);
                for (unsigned t = 0; t < threads_per_block; ++t)
                    s.started[t] = s.finished[t] = false;
                if (_setjmp(s.caller) == 0) enter(0);
            }
    scheduler = nullptr;
}

// --- 16-bit formats and mma.sync m16n8k16 ---------------------------------------------------------

inline float float16_value(unsigned short bits) {
    // From a table of the same conversions: without F16C the compiler converts _Float16 by a
    // library call, and mma converts every element of both fragments (over half of the float16
    // kernel's emulated time before).
    static const std::vector<float> values = [] {
        std::vector<float> table(1u << 16);
        for (unsigned pattern = 0; pattern < table.size(); ++pattern) {
            const auto half_bits = static_cast<unsigned short>(pattern);
            _Float16 half;
            std::memcpy(&half, &half_bits, sizeof half);
            table[pattern] = static_cast<float>(half);
        }
        return table;
    }();
    return values[bits];
}

inline unsigned short float16_bits(float value) {
    const _Float16 half = static_cast<_Float16>(value);  // round to nearest even
    unsigned short bits;
    std::memcpy(&bits, &half, sizeof bits);
    return bits;
}

inline float bfloat16_value(unsigned short bits) { return __uint_as_float(unsigned(bits) << 16); }

inline unsigned short bfloat16_bits(float value) {
    const unsigned bits = float_bits(value);
    if (std::isnan(value)) return 0x7fc0;
    return static_cast<unsigned short>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// mma.sync of m16n8k(8 PER_REGISTER) on the warp's fragments (PTX ISA, "Matrix fragments for
// mma.m16n8k16" and "for mma.m16n8k32"), PER_REGISTER elements to a register, element k % PER_REGISTER
// of it at that position (the first in the lowest bits), decoded by a_value(register, position)
// and b_value(register, position); each dot product summed in double:
//   A element (row, k): lane 4 (row % 8) + (k % (4 PER_REGISTER)) / PER_REGISTER,
//                       register (row >= 8) + 2 (k >= 4 PER_REGISTER)
//   B element (k, n):   lane 4 n + (k % (4 PER_REGISTER)) / PER_REGISTER, register (k >= 4 PER_REGISTER)
//   C element ci:       row group + 8 (i >= 2), column 2 tig + (i % 2)
template <int PER_REGISTER, typename AValue, typename BValue>
void warp_mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1, AValue a_value,
              BValue b_value) {
    constexpr int K = 8 * PER_REGISTER, HALF = 4 * PER_REGISTER;
    WarpState& warp = current_warp();
    std::memcpy(warp.a[lane_index], a, sizeof a);
    warp.b[lane_index][0] = b0;
    warp.b[lane_index][1] = b1;
    warp.barrier.arrive_and_wait();
    const int group = lane_index / 4, tig = lane_index % 4;
    for (int i = 0; i < 4; ++i) {
        const int row = group + 8 * (i / 2), col = 2 * tig + (i % 2);
        double sum = c[i];
        for (int k = 0; k < K; ++k) {
            const int lane_of_k = (k % HALF) / PER_REGISTER, position = k % PER_REGISTER;
            const unsigned a_reg = warp.a[4 * (row % 8) + lane_of_k][(row >= 8) + 2 * (k >= HALF)];
            const unsigned b_reg = warp.b[4 * col + lane_of_k][k >= HALF];
            sum += double(a_value(a_reg, position)) * double(b_value(b_reg, position));
        }
        c[i] = static_cast<float>(sum);
    }
    warp.barrier.arrive_and_wait();
}

template <bool BF16>
struct HostFormat {
    static float value(unsigned short bits) {
        return BF16 ? bfloat16_value(bits) : float16_value(bits);
    }
    static unsigned pack(float low, float high) {
        const unsigned short lo = BF16 ? bfloat16_bits(low) : float16_bits(low);
        const unsigned short hi = BF16 ? bfloat16_bits(high) : float16_bits(high);
        return unsigned(lo) | (unsigned(hi) << 16);
    }
    static float element(unsigned reg, int half) {
        return value(static_cast<unsigned short>(half ? reg >> 16 : reg & 0xffffu));
    }
    static void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
        // lambdas, not function pointers: each its own type, so the compiler inlines them
        const auto value_of = [](unsigned reg, int half) { return element(reg, half); };
        warp_mma<2>(c, a, b0, b1, value_of, value_of);
    }
};

constexpr bool is_bfloat16(const char* ptx_type) { return ptx_type[0] == 'b'; }

#define SIXTEEN_BIT_FORMAT(NAME, PTX_TYPE) \
    struct NAME : HostFormat<is_bfloat16(PTX_TYPE)> {};

// --- FP8 formats and mma.sync m16n8k32 ------------------------------------------------------------

// The value of an e4m3 (OCP E4M3, no infinity, 0x7f and 0xff NaN) or e5m2 (IEEE-like) byte,
// decoded from its fields.
inline float fp8_decoded(unsigned char byte, bool e5m2) {
    const float sign = byte & 0x80 ? -1.0f : 1.0f;
    const int mantissa_bits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
    const int exponent = (byte & 0x7f) >> mantissa_bits, mantissa = byte & ((1 << mantissa_bits) - 1);
    const int top = (1 << (7 - mantissa_bits)) - 1;
    if (e5m2 && exponent == top) return mantissa == 0 ? sign * INFINITY : NAN;
    if (!e5m2 && (byte & 0x7f) == 0x7f) return NAN;
    if (exponent == 0) return sign * std::ldexp(float(mantissa), 1 - bias - mantissa_bits);
    return sign * std::ldexp(float((1 << mantissa_bits) + mantissa), exponent - bias - mantissa_bits);
}

inline float fp8_value(unsigned char byte, bool e5m2) {
    static const std::vector<float> tables[2] = {
        [] {
            std::vector<float> table(256);
            for (unsigned b = 0; b < 256; ++b) table[b] = fp8_decoded((unsigned char)b, false);
            return table;
        }(),
        [] {
            std::vector<float> table(256);
            for (unsigned b = 0; b < 256; ++b) table[b] = fp8_decoded((unsigned char)b, true);
            return table;
        }(),
    };
    return tables[e5m2][byte];
}

// cvt.rn.satfinite.e4m3x2.f32 for one value: to nearest, ties to even; past 448 (infinities too)
// saturated to +-448; NaN stays NaN.
inline unsigned char e4m3_bits(float value) {
    const unsigned char sign = std::signbit(value) ? 0x80 : 0;
    if (std::isnan(value)) return sign | 0x7f;
    const double magnitude = std::min(std::fabs(double(value)), 448.0);
    if (magnitude < 0x1p-6) return sign | (unsigned char)std::nearbyint(magnitude * 0x1p9);
    int exponent;
    std::frexp(magnitude, &exponent);  // magnitude = f 2^exponent, f in [0.5, 1)
    --exponent;
    int mantissa = int(std::nearbyint(std::ldexp(magnitude, 3 - exponent)));  // in [8, 16]
    if (mantissa == 16) ++exponent, mantissa = 8;
    return sign | (unsigned char)(((exponent + 7) << 3) | (mantissa - 8));
}

inline unsigned short pack_e4m3(float low, float high) {
    return (unsigned short)(e4m3_bits(low) | (unsigned(e4m3_bits(high)) << 8));
}

// The FP8 mma (m16n8k32), A and B each in its format, a byte to an element.
template <bool A_E5M2, bool B_E5M2>
struct HostFp8Mma {
    template <bool E5M2>
    static float element(unsigned reg, int byte) {
        return fp8_value((unsigned char)(reg >> (8 * byte)), E5M2);
    }
    static void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
        warp_mma<4>(c, a, b0, b1, [](unsigned reg, int byte) { return element<A_E5M2>(reg, byte); },
                    [](unsigned reg, int byte) { return element<B_E5M2>(reg, byte); });
    }
};

constexpr bool is_e5m2(const char* ptx_type) { return ptx_type[1] == '5'; }

#define EIGHT_BIT_MMA(NAME, A_TYPE, B_TYPE) \
    struct NAME : HostFp8Mma<is_e5m2(A_TYPE), is_e5m2(B_TYPE)> {};

// --- ldmatrix and cp.async ------------------------------------------------------------------------

// Records a read or a write of the 16-byte chunk at `address`; a race if another warp did the other
// since the last barrier.
inline void note_access(const void* address, bool write) {
    ChunkAccess& chunk = scheduler->block.chunks[address];
    const unsigned epoch = scheduler->block.barrier.generation, self = 1u << warp_index;
    const bool raced = write ? chunk.read_epoch == epoch && (chunk.readers & ~self)
                             : chunk.write_epoch == epoch && chunk.writer != self;
    if (raced && race.empty())
        race = std::string("block (") + std::to_string(blockIdx.x) + ", " +
               std::to_string(blockIdx.y) + "): warp " + std::to_string(warp_index) +
               (write ? " writes a shared-memory chunk another warp read"
                      : " reads a shared-memory chunk another warp wrote") +
               " with no __syncthreads() between them";
    if (write) {
        chunk.write_epoch = epoch;
        chunk.writer = self;
    } else {
        if (chunk.read_epoch != epoch) chunk.readers = 0;
        chunk.read_epoch = epoch;
        chunk.readers |= self;
    }
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (PTX ISA, "Warp-level matrix load instruction:
// ldmatrix"): lane i gives row i % 8 of matrix i / 8; lane l's register j holds matrix j's
// elements (l / 4, 2 (l % 4) + h) for h = 0, 1 (lower half first), or with .trans
// (2 (l % 4) + h, l / 4).
template <bool TRANSPOSE>
inline void load_matrices(unsigned (&r)[4], const unsigned short* row) {
    WarpState& warp = current_warp();
    note_access(row, false);
    warp.rows[lane_index] = row;
    warp.barrier.arrive_and_wait();
    const int l = int(lane_index);
    for (int j = 0; j < 4; ++j) {
        const unsigned short* const* matrix = &warp.rows[8 * j];
        unsigned short element[2];
        for (int h = 0; h < 2; ++h)
            element[h] = TRANSPOSE ? matrix[2 * (l % 4) + h][l / 4] : matrix[l / 4][2 * (l % 4) + h];
        r[j] = unsigned(element[0]) | (unsigned(element[1]) << 16);
    }
    warp.barrier.arrive_and_wait();
}

inline CopyQueue& current_copies() { return scheduler->block.copies[scheduler->current]; }

// cp.async.cg.shared.global [destination], [source], 16, inside ? 16 : 0
inline void copy_async(void* destination, const void* source, bool inside) {
    note_access(destination, true);
    std::memset(destination, 0xff, 16);  // NaN in float16 and bfloat16 until the wait
    current_copies().open.push_back({destination, source, inside});
}

inline void commit_copies() {
    CopyQueue& queue = current_copies();
    queue.committed.push_back(std::move(queue.open));
    queue.open.clear();
}

template <int PENDING>
inline void wait_copies() {
    CopyQueue& queue = current_copies();
    while (queue.committed.size() > std::size_t(PENDING)) {
        for (const AsyncCopy& copy : queue.committed.front()) {
            note_access(copy.destination, true);
            if (copy.inside) std::memcpy(copy.destination, copy.source, 16);
            else std::memset(copy.destination, 0, 16);
        }
        queue.committed.pop_front();
    }
}
