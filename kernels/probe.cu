// Device probes for the CUDA backend: the two ceilings reports divide by
// (copy bandwidth, mma.sync tensor rate), the read bandwidth of pool rows
// gathered in random order (what a page-size-1 KV cache can stream), the
// cold-L2 flush used between timed samples, and an empty kernel for launch
// overhead.
//
// Compiled by NVRTC with the backend's standard options and no -D defines.
// All entry points are extern "C" so their names are unmangled.

#include <cuda_bf16.h>

typedef unsigned long long u64;

// Grid-stride 16-byte copy; four loads in flight per thread before the stores.
extern "C" __global__ void __launch_bounds__(256)
    mlab_copy_u128(const uint4* __restrict__ src, uint4* __restrict__ dst, u64 n) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 a = src[i];
        const uint4 b = src[i + stride];
        const uint4 c = src[i + 2 * stride];
        const uint4 d = src[i + 3 * stride];
        dst[i] = a;
        dst[i + stride] = b;
        dst[i + 2 * stride] = c;
        dst[i + 3 * stride] = d;
    }
    for (; i < n; i += stride) dst[i] = src[i];
}

// Reads `n` 16-byte words so that the L2 holds only clean lines of `buf`
// afterwards (a memset would leave dirty lines that the next timed kernel
// pays to write back). The store never happens for a buffer of zeros and a
// nonzero `magic`, but the compiler cannot know that, so the loads stay.
extern "C" __global__ void __launch_bounds__(256)
    mlab_l2_flush(const uint4* __restrict__ buf, u64 n, unsigned magic, unsigned* sink) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    unsigned x = 0;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const uint4 v = buf[i];
        x ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (x == magic) sink[0] = x;
}

// Reads rows idx[0..n_rows) of a pool of rows of `row_words` 16-byte words
// (row r at pool + r * row_words), four loads in flight per thread; with idx
// the identity it is a contiguous read. Read-only like mlab_l2_flush: the
// XOR reaches memory only if it equals magic.
extern "C" __global__ void __launch_bounds__(256)
    mlab_gather_rows(const uint4* __restrict__ pool, const int* __restrict__ idx, u64 n_rows, int row_words,
                     unsigned magic, unsigned* sink) {
    const u64 n = n_rows * (u64)row_words;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    auto at = [&](u64 i) -> const uint4* {
        const u64 r = i / (u64)row_words;
        return pool + (u64)__ldg(idx + r) * row_words + (i - r * row_words);
    };
    unsigned x = 0;
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 a = *at(i), b = *at(i + stride), c = *at(i + 2 * stride), d = *at(i + 3 * stride);
        x ^= a.x ^ b.y ^ c.z ^ d.w;
    }
    for (; i < n; i += stride) x ^= at(i)->x;
    if (x == magic) sink[0] = x;
}

// Launch-overhead probe.
extern "C" __global__ void mlab_empty() {}

// Keeps the GPU busy for `ns` nanoseconds. The timer queues it before each
// sample's start event so the host has enqueued the whole timed region by
// the time the GPU reaches that event: host launch latency stays out of the
// measurement.
extern "C" __global__ void mlab_spin(u64 ns) {
    u64 t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(500);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

__device__ __forceinline__ unsigned mlab_hash(unsigned x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

// Two bf16 values uniform in [-1, 1): random operands, never zeros (the
// tensor cores run measurably faster on zeros).
__device__ __forceinline__ unsigned mlab_rand_bf16x2(unsigned seed) {
    const unsigned h = mlab_hash(seed);
    const float lo = (float)(h & 0xFFFFu) * (2.0f / 65536.0f) - 1.0f;
    const float hi = (float)(h >> 16) * (2.0f / 65536.0f) - 1.0f;
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&v);
}

// Register-resident mma.sync m16n8k16 bf16 x bf16 -> f32 loop: the dense
// tensor rate our kernels (which use mma.sync, not wgmma) can reach.
// FLOP per launch = (threads / 32) * iters * MMA_CHAINS * 4096.
// Each thread writes the sum of its accumulators to out[thread] so that
// nothing is dead code.
extern "C" __global__ void __launch_bounds__(256)
    mlab_mma_bf16(float* __restrict__ out, int iters, unsigned seed) {
    // Independent accumulator chains per warp: enough mma.sync in flight to
    // cover the instruction's latency with 8 warps per block. The host counts
    // the FLOP with it: MMA_CHAINS in src/backend/cuda/ceilings.rs must match.
    // (A function-local constant: NVRTC emits every namespace-scope one as a
    // device global.)
    constexpr int MMA_CHAINS = 8;
    const unsigned tid = blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned base = mlab_hash(seed ^ (tid * 0x9e3779b9U));
    const unsigned a0 = mlab_rand_bf16x2(base + 1), a1 = mlab_rand_bf16x2(base + 2);
    const unsigned a2 = mlab_rand_bf16x2(base + 3), a3 = mlab_rand_bf16x2(base + 4);
    const unsigned b0 = mlab_rand_bf16x2(base + 5), b1 = mlab_rand_bf16x2(base + 6);
    float acc[MMA_CHAINS][4];
#pragma unroll
    for (int c = 0; c < MMA_CHAINS; ++c) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[c][j] = 0.0f;
    }
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int c = 0; c < MMA_CHAINS; ++c) {
            asm volatile(
                "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                : "+f"(acc[c][0]), "+f"(acc[c][1]), "+f"(acc[c][2]), "+f"(acc[c][3])
                : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
        }
    }
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < MMA_CHAINS; ++c) {
#pragma unroll
        for (int j = 0; j < 4; ++j) s += acc[c][j];
    }
    out[tid] = s;
}

// Backend self-checks (examples/cuda_smoke.rs), not measurements.

// Sums n words through dynamic shared memory: exercises the opt-in above
// 48 KiB (the launch must raise MAX_DYNAMIC_SHARED_SIZE_BYTES). One block.
extern "C" __global__ void __launch_bounds__(256)
    mlab_smem_sum(const unsigned* __restrict__ in, unsigned* __restrict__ out, int n) {
    extern __shared__ unsigned mlab_smem[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) mlab_smem[i] = in[i];
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned s = 0;
        for (int i = 0; i < n; ++i) s += mlab_smem[n - 1 - i];
        out[0] = s;
    }
}

// Faults on purpose, so the smoke test can check that a sticky error turns
// into "device lost".
extern "C" __global__ void mlab_trap() { __trap(); }
