// A probe of the emulation's race check (host_cuda.h): two warps share one tile through cp.async
// and ldmatrix, with or without the barriers that order them. tests/test_cuda_emulation.py holds
// the check to reporting a race exactly when a barrier is left out.
#include "host_cuda.h"

// missing: 0 leaves out no barrier, 1 the one between the copy's wait and the reads, 2 the one
// between the reads and the next copy into the same tile. Returns the race reported, or "".
extern "C" const char* run_race_probe(int missing) {
    static unsigned short source[32][8];  // global memory: 32 rows of 16 bytes
    launch({1, 1, 1}, 64, [&] {
        __shared__ __align__(16) unsigned short tile[32][8];  // four 8x8 matrices
        const unsigned t = threadIdx.x;
        for (int round = 0; round < 2; ++round) {
            if (t < 32) copy_async(tile[t], source[t], true);  // warp 0 copies, one row a lane
            commit_copies();
            wait_copies<0>();
            if (missing != 1) __syncthreads();
            unsigned fragments[4];
            load_matrices<false>(fragments, tile[t % 32]);  // both warps read every row
            if (missing != 2) __syncthreads();
        }
    });
    return race.c_str();
}
