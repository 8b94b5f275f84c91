// Device probes for the CUDA backend: the ceilings reports divide by (copy
// bandwidth; the dense tensor rates of mma.sync bf16, wgmma bf16 and wgmma
// e4m3), the read bandwidth of pool rows gathered in random order (what a
// page-size-1 KV cache can stream), the cold-L2 flush used between timed
// samples, and an empty kernel for launch overhead.
//
// Compiled by NVRTC with the backend's standard options and no -D defines,
// for whatever the device is (sm_90a on Hopper): the wgmma probes are empty
// elsewhere and the host does not launch them there.
// All entry points are extern "C" so their names are unmangled.

#include <cuda_bf16.h>

#include "common/ptx.cuh"

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

// What the host counts the tensor probes' FLOP with: ceilings.rs mirrors
// each (MMA_CHAINS, MMA_BLOCK, WGMMA_BLOCK, WGMMA_PER_GROUP) and must match.
// Macros, not constants: NVRTC emits every namespace-scope constant as a
// device global.
//   mlab_mma_bf16: FLOP = (threads / 32) * iters * MLAB_MMA_CHAINS * 2*16*8*16
//   mlab_wgmma_*:  FLOP = (threads / 128) * iters * MLAB_WGMMA_PER_GROUP * (2*64*256*16 | 2*64*256*32)
#define MLAB_MMA_THREADS 256
#define MLAB_MMA_CHAINS 8
#define MLAB_WGMMA_THREADS 384
#define MLAB_WGMMA_PER_GROUP 16

// Register-resident mma.sync m16n8k16 bf16 x bf16 -> f32 loop: the dense
// rate of kernels built on mma.sync.
// Each thread writes the sum of its accumulators to out[thread] so that
// nothing is dead code.
extern "C" __global__ void __launch_bounds__(MLAB_MMA_THREADS)
    mlab_mma_bf16(float* __restrict__ out, int iters, unsigned seed) {
    // Independent accumulator chains per warp: enough mma.sync in flight to
    // cover the instruction's latency with 8 warps per block.
    constexpr int MMA_CHAINS = MLAB_MMA_CHAINS;
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

// Four e4m3 values from random bits, none of them NaN (S.1111.111; e4m3
// has no infinities): such a byte becomes 0x7e / 0xfe, +-448.
__device__ __forceinline__ unsigned mlab_rand_e4m3x4(unsigned seed) {
    unsigned x = mlab_hash(seed);
#pragma unroll
    for (int i = 0; i < 32; i += 8) {
        if (((x >> i) & 0x7fu) == 0x7fu) x ^= 1u << i;
    }
    return x;
}

// The 128 accumulators of an m64n256 wgmma: asm operands 0-127 ...
#define MLAB_WGMMA_D "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}"
#define MLAB_ACC8(d, i) \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define MLAB_ACC32(d, i) MLAB_ACC8(d, i), MLAB_ACC8(d, i + 8), MLAB_ACC8(d, i + 16), MLAB_ACC8(d, i + 24)
#define MLAB_ACC128(d) MLAB_ACC32(d, 0), MLAB_ACC32(d, 32), MLAB_ACC32(d, 64), MLAB_ACC32(d, 96)
// ... then A (four b32 per thread, K-major, operands 128-131) and B's
// shared-memory descriptor (132); expanded where `d`, `a` and `desc_b` are
// those. scale-d is 1: always accumulate.
#define MLAB_WGMMA_RS(shape_types, tail)                                                             \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                          \
                 "wgmma.mma_async.sync.aligned." shape_types " " MLAB_WGMMA_D                        \
                 ", {%128, %129, %130, %131}, %132, p, 1, 1" tail ";\n}\n"                           \
                 : MLAB_ACC128(d)                                                                    \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b))

// d[64 x 256] += A[64 x 16] . B[256 x 16]^T, bf16, B K-major (trans-b 0).
__device__ __forceinline__ void mlab_wgmma_bf16_rs(float (&d)[128], const unsigned (&a)[4],
                                                   unsigned long long desc_b) {
    MLAB_WGMMA_RS("m64n256k16.f32.bf16.bf16", ", 0");
}
// d[64 x 256] += A[64 x 32] . B[256 x 32]^T, e4m3 (K-major only).
__device__ __forceinline__ void mlab_wgmma_e4m3_rs(float (&d)[128], const unsigned (&a)[4],
                                                   unsigned long long desc_b) {
    MLAB_WGMMA_RS("m64n256k32.f32.e4m3.e4m3", "");
}

// The dense wgmma rate: every warpgroup of the block chains m64n256 wgmma
// with A in registers and B from one shared 256-row tile into its 128
// accumulators, MLAB_WGMMA_PER_GROUP per commit group with one group left in
// flight at each wait, so the tensor pipe never drains. B is 256 rows of
// 128 bytes (64 bf16 / 128 e4m3 of K) in the 128-byte swizzle layout of
// gmma_desc_sw128 (8-row atoms of 1024 bytes, 32 KiB); each wgmma reads one
// 32-byte K slice of it, the start address 32 bytes further per step, as the
// MLA kernels' k-steps do. Random operands, as for mma.sync; every byte of
// the tile is written before use, so any layout slip still reads valid data.
template <bool FP8>
__device__ __forceinline__ void mlab_wgmma_loop(float* __restrict__ out, int iters, unsigned seed) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int TILE_WORDS = 256 * 128 / 4;
    // One atom of slack: the tile starts at the first 1024-byte boundary.
    __shared__ __align__(16) unsigned raw[TILE_WORDS + 256];
    const unsigned raw_addr = mla::smem_u32(raw);
    const unsigned tile_addr = (raw_addr + 1023u) & ~1023u;
    unsigned* tile = raw + (tile_addr - raw_addr) / 4;
    const unsigned tid = blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned base = mlab_hash(seed ^ (tid * 0x9e3779b9U));
    const unsigned block = mlab_hash(seed ^ 0xb5297a4dU ^ blockIdx.x);
    unsigned a[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) a[j] = FP8 ? mlab_rand_e4m3x4(base + 1 + j) : mlab_rand_bf16x2(base + 1 + j);
    for (int i = threadIdx.x; i < TILE_WORDS; i += blockDim.x) {
        tile[i] = FP8 ? mlab_rand_e4m3x4(block + i) : mlab_rand_bf16x2(block + i);
    }
    mla::fence_proxy_async();
    __syncthreads();
    const unsigned long long desc = mla::gmma_desc_sw128(tile_addr);
    float d[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) d[i] = 0.0f;
    mla::fence_regs(d);
    for (int it = 0; it < iters; ++it) {
        mla::wgmma_fence();
#pragma unroll
        for (int j = 0; j < MLAB_WGMMA_PER_GROUP; ++j) {
            // K slice j % 4 of the 128-byte rows: +32 bytes = +2 in the
            // descriptor's 16-byte address units.
            const unsigned long long desc_b = desc + 2 * (j % 4);
            if constexpr (FP8) {
                mlab_wgmma_e4m3_rs(d, a, desc_b);
            } else {
                mlab_wgmma_bf16_rs(d, a, desc_b);
            }
        }
        mla::wgmma_commit();
        mla::wgmma_wait<1>();
    }
    mla::wgmma_wait<0>();
    mla::fence_regs(d);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 128; ++i) s += d[i];
    out[tid] = s;
#else
    // No wgmma on this target; the host launches these probes on sm_90a only.
    (void)out, (void)iters, (void)seed;
#endif
}

extern "C" __global__ void __launch_bounds__(MLAB_WGMMA_THREADS, 1)
    mlab_wgmma_bf16(float* __restrict__ out, int iters, unsigned seed) {
    mlab_wgmma_loop<false>(out, iters, seed);
}

extern "C" __global__ void __launch_bounds__(MLAB_WGMMA_THREADS, 1)
    mlab_wgmma_e4m3(float* __restrict__ out, int iters, unsigned seed) {
    mlab_wgmma_loop<true>(out, iters, seed);
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
