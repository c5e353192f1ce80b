// cupy_naive: the document's kernel, literally, in three launches.
//
//   1. attention_scores: one thread per score, dot(Q[i], K[j]) * (1.0f / sqrtf(d_k)), and the
//      causal mask, into a (B*H, Tq, Tk) float32 buffer: the score matrix is materialised.
//   2. softmax_rows: one block per row, max-subtracted, normalised in place.
//   3. weighted_values: one thread per output element, the weighted sum of V's rows.
//
// Slow by design: it reads next to the document, line for line. Arrays are contiguous float32,
// (B*H, T, D) for Q, K, V and the output; impls/cupy_backend.py launches and validates.

#define SOFTMAX_THREADS 256

__device__ __forceinline__ float negative_infinity() { return __int_as_float(0xff800000); }

extern "C" __global__ void attention_scores(const float* __restrict__ Q,
                                            const float* __restrict__ K, float* __restrict__ S,
                                            int tq, int tk, int d_k, float scale,
                                            int document_scale, int causal) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;  // key
    const int i = blockIdx.y;                             // query
    const int bh = blockIdx.z;                            // batch x head
    if (j >= tk) return;
    const float* q = Q + ((size_t)bh * tq + i) * d_k;
    const float* k = K + ((size_t)bh * tk + j) * d_k;
    float dot = 0.0f;
    for (int c = 0; c < d_k; ++c) dot += q[c] * k[c];
    // The document's line, when no explicit scale was given.
    const float score = document_scale ? dot * (1.0f / sqrtf((float)d_k)) : dot * scale;
    // Query i sits at absolute position i + tk - tq (bottom-right alignment) and must not see a
    // later key. The score is overwritten, never added to, so a NaN or inf there cannot leak.
    const bool future = causal && j > i + (tk - tq);
    S[((size_t)bh * tq + i) * tk + j] = future ? negative_infinity() : score;
}

extern "C" __global__ void __launch_bounds__(SOFTMAX_THREADS)
    softmax_rows(float* __restrict__ S, int tk) {
    __shared__ float partial[SOFTMAX_THREADS];
    float* row = S + (size_t)blockIdx.x * tk;

    float row_max = negative_infinity();
    for (int j = threadIdx.x; j < tk; j += SOFTMAX_THREADS) row_max = fmaxf(row_max, row[j]);
    partial[threadIdx.x] = row_max;
    __syncthreads();
    for (int stride = SOFTMAX_THREADS / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride)
            partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + stride]);
        __syncthreads();
    }
    row_max = partial[0];
    __syncthreads();  // every thread has read the max before partial[] is reused for the sum

    float row_sum = 0.0f;
    for (int j = threadIdx.x; j < tk; j += SOFTMAX_THREADS) {
        const float e = expf(row[j] - row_max);  // a masked score gives exp(-inf) = 0
        row[j] = e;
        row_sum += e;
    }
    partial[threadIdx.x] = row_sum;
    __syncthreads();
    for (int stride = SOFTMAX_THREADS / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    row_sum = partial[0];
    for (int j = threadIdx.x; j < tk; j += SOFTMAX_THREADS) row[j] = row[j] / row_sum;
}

extern "C" __global__ void weighted_values(const float* __restrict__ P,
                                           const float* __restrict__ V, float* __restrict__ O,
                                           int tq, int tk, int d_v, int causal) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;  // value column
    const int i = blockIdx.y;                             // query
    const int bh = blockIdx.z;
    if (c >= d_v) return;
    const float* p = P + ((size_t)bh * tq + i) * tk;
    const float* v = V + (size_t)bh * tk * d_v + c;
    // Weights after row i's last visible key are exactly 0 and are not summed: 0 * inf is NaN,
    // and an inf in a future value must not reach row i.
    const int visible = causal ? min(tk, i + (tk - tq) + 1) : tk;
    float acc = 0.0f;
    for (int j = 0; j < visible; ++j) acc += p[j] * v[(size_t)j * d_v];
    O[((size_t)bh * tq + i) * d_v + c] = acc;
}
