// DeepSeek-V4 native FP8 rows on the compute-bound core (mla_wg.cuh with
// WG_V4=1): the producer that turns them into the core's bf16 tiles.
//
// A packed row is 448 e4m3 "nope" dims in 7 blocks of 64, each scaled by its
// own power of two (UE8M0 bytes at 448 + 2b), and a separate 64-dim bf16
// rope. A 64-dim column block of the core is one scale block, so the
// producer dequantizes blocks 0-6 and copies the rope into block 7 with
// cp.async, 128-byte swizzled as wgmma reads them.
//
// Why this dequantization: e4m3 times 2^k is exact in bf16. e4m3 -> f16
// (the hardware cvt, both halves of a word read in place), f16 -> f32 ->
// bf16 and a bf16 multiply by the tile's 2^k are each exact and keep NaN as
// NaN: five instructions a pair. Shifting the f16 into a bf16 times 2^-112
// and restoring it by FMA took nine (a shift for the upper pair, masks, a
// NaN term); v4_split's wgmma rows take 10-14% less time this way
// (docs/kernels.md).
#pragma once
#include "common/mla_wg.cuh"

#if !WG_V4
#error "wg_v4.cuh is the WG_V4=1 producer"
#endif

namespace mla {
namespace wg {

// The V4 operands (kernels/ABI.md): Q rows and pool rows alike are packed
// [*, 512] u8 plus a [*, 64] bf16 rope.
struct V4Src {
  const unsigned char* __restrict__ q;
  const __nv_bfloat16* __restrict__ q_rope;
  const unsigned char* __restrict__ kv;
  const __nv_bfloat16* __restrict__ kv_rope;
};

constexpr int V4_ROW = 512;         // packed row bytes
constexpr int V4_SCALES = 448;      // first scale byte
constexpr int V4_ROPE_ROW = 128;    // rope row bytes
constexpr int V4_PREFETCH = 464;    // nope and scales: the bytes of a packed row that are read

// The rows of a V4 pass (64 heads of one token row): every row sees the
// whole range (causality is in the list). `sink` null: an f32 partial,
// merged later with the sink; else the rows are whole and add it.
struct V4Rows {
  int t_end;
  long long out0;
  const float* sink;
  int h0;
  __device__ int lim(int) const { return t_end; }
  __device__ long long o_row(int r) const { return out0 + r; }
  __device__ float sink_log2(int r) const { return sink ? sink[h0 + r] * LOG2E : ninf(); }
};

// 2^(e-127) of UE8M0 byte e as bf16x2 (e = 0: 2^-127, a subnormal).
__device__ __forceinline__ unsigned ue8m0_bf16x2(unsigned e) {
  const unsigned b = e ? e << 7 : 0x40u;
  return b | (b << 16);
}

// An f16x2 from e4m3 times the tile scale s2, as bf16x2: f16 -> f32 ->
// bf16 is exact for an e4m3 value (3 mantissa bits), and so is the bf16
// multiply by 2^k; NaN stays NaN through every step.
__device__ __forceinline__ unsigned f16x2_bf16x2_scaled(unsigned h, unsigned s2) {
  unsigned r;
  asm("{\n"
      " .reg .f16 a, b;\n"
      " .reg .f32 fa, fb;\n"
      " mov.b32 {a, b}, %1;\n"
      " cvt.f32.f16 fa, a;\n"
      " cvt.f32.f16 fb, b;\n"
      " cvt.rn.bf16x2.f32 %0, fb, fa;\n"
      " mul.rn.bf16x2 %0, %0, %2;\n"
      "}\n"
      : "=r"(r)
      : "r"(h), "r"(s2));
  return r;
}

// One 16-byte e4m3 chunk (16 dims) times the tile scale of byte e, as 8
// bf16x2 words in dim order.
__device__ __forceinline__ void dq_chunk(uint4 v, unsigned e, unsigned (&h)[8]) {
  const unsigned s2 = ue8m0_bf16x2(e & 0xFFu);
  const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    unsigned lo, hi;
    e4m3x4_to_f16x2x2(w[i], lo, hi);
    h[2 * i] = f16x2_bf16x2_scaled(lo, s2);
    h[2 * i + 1] = f16x2_bf16x2_scaled(hi, s2);
  }
}

// One chunk with scale byte e as bf16 chunks ch and ch + 1 of row r's
// 128-byte line in the column block at `blk`.
__device__ __forceinline__ void st_v4_chunk(unsigned blk, int r, int ch, uint4 v, unsigned e) {
  unsigned h[8];
  dq_chunk(v, e, h);
  const unsigned row = blk + r * 128;
  sts_v4(row + ((ch ^ (r & 7)) << 4), h[0], h[1], h[2], h[3]);
  sts_v4(row + (((ch + 1) ^ (r & 7)) << 4), h[4], h[5], h[6], h[7]);
}

__device__ __forceinline__ uint2 ld_scales(const unsigned char* p, bool ok) {
  return ok ? __ldg(reinterpret_cast<const uint2*>(p)) : make_uint2(0u, 0u);
}

// Scale bytes are doubled (s0 s0 s1 s1 ...): block b's is byte 2b. Of the
// 8 bytes w of the lower (UP = false) or upper half, the two a thread of
// half hi (l8 / 4) uses: lower blocks hi and 2 + hi, upper 4 + hi and 6.
template <bool UP>
__device__ __forceinline__ unsigned pick_scales(uint2 w, int hi) {
  return ((w.x >> (16 * hi)) & 0xFFu) | (((UP ? w.y : w.y >> (16 * hi)) & 0xFFu) << 8);
}

// A group of packed rows held in registers, rows tg + 16k (source row e[k],
// e[k] < 0: zeros), chunk l8 of each 128-byte line, as the fp8 Lines of
// mla_wg.cuh. Lower (blocks 0-3): lines 0 and 1, scale bytes 448..455.
// Upper (blocks 4-6): line 2, and block 6's 64 bytes spread two chunks per
// thread (chunk l8 % 4 of rows k = l8 / 4 and l8 / 4 + 2), scale bytes
// 456..463; the rope (block 7) goes by cp.async.
struct V4Lines {
  uint4 d[8];
  unsigned sc[4];  // row k's two scale bytes: lower blocks l8/4 and 2 + l8/4; upper 4 + l8/4 and 6

  template <bool UP>
  __device__ __forceinline__ void load(const unsigned char* __restrict__ src, const int (&e)[4], int l8) {
    auto row = [&](int k) { return src + static_cast<long long>(max(e[k], 0)) * V4_ROW; };
    if (!UP) {
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int k = 0; k < 4; ++k) d[4 * j + k] = ld_chunk(row(k) + j * 128 + l8 * 16, e[k] >= 0);
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) d[k] = ld_chunk(row(k) + 256 + l8 * 16, e[k] >= 0);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // Row (l8 / 4) + 2h, by selects: a runtime index would put e in local memory.
        const int ek = (l8 >> 2) ? e[1 + 2 * h] : e[2 * h];
        d[4 + h] = ld_chunk(src + static_cast<long long>(max(ek, 0)) * V4_ROW + 384 + (l8 & 3) * 16, ek >= 0);
      }
    }
    // Only the two scale bytes this thread uses stay live (waiting for
    // them here costs nothing: the stores after the wait need the chunks
    // loaded with them).
    const int hi = l8 >> 2;
#pragma unroll
    for (int k = 0; k < 4; ++k) sc[k] = pick_scales<UP>(ld_scales(row(k) + V4_SCALES + (UP ? 8 : 0), e[k] >= 0), hi);
  }

  template <bool UP>
  __device__ __forceinline__ void store(unsigned buf, int tg, int l8) const {
    const int hi = l8 >> 2, ch = 2 * (l8 & 3);
    if (!UP) {
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int k = 0; k < 4; ++k)
          st_v4_chunk(buf + (2 * j + hi) * CB, tg + 16 * k, ch, d[4 * j + k], sc[k] >> (8 * j));
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) st_v4_chunk(buf + (4 + hi) * CB, tg + 16 * k, ch, d[k], sc[k]);
#pragma unroll
      for (int h = 0; h < 2; ++h)
        st_v4_chunk(buf + 6 * CB, tg + 16 * (hi + 2 * h), ch, d[4 + h], (hi ? sc[1 + 2 * h] : sc[2 * h]) >> 8);
    }
    fence_proxy_async();  // generic stores, read by wgmma through the async proxy
  }
};

// The rope of rows tg + 16k (chunk l8) into block 7 at `buf`, by cp.async.
__device__ __forceinline__ void rope_cp(unsigned buf, const __nv_bfloat16* __restrict__ rope, const int (&e)[4],
                                        int tg, int l8) {
  const unsigned char* src = reinterpret_cast<const unsigned char*>(rope);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int t = tg + 16 * k;
    cp_async16(buf + 7 * CB + t * 128 + ((l8 ^ (t & 7)) << 4),
               src + static_cast<long long>(max(e[k], 0)) * V4_ROPE_ROW + l8 * 16, e[k] >= 0);
  }
}

#if WG_PAIR
// This CTA's half of a tile (WG_PAIR): rows rb + 16j, j = 0, 1, with rb =
// tg + 32 * rank, so each producer dequantizes 32 of the 64 tokens and
// stores them into both CTAs' buffers; the lane mapping is V4Lines' (the
// rows keep their swizzle parity, so the stores stay conflict-free).
// Lower: lines 0 and 1; upper: line 2 and block 6's 64 bytes, chunk l8 % 4
// of row j = l8 / 4. The rope goes by cp.async in each CTA, all 64 rows.
struct V4Half {
  uint4 d[4];
  unsigned sc[2];  // as V4Lines::sc, rows j = 0, 1

  template <bool UP>
  __device__ __forceinline__ void load(const unsigned char* __restrict__ src, const int (&e)[2], int l8) {
    auto row = [&](int j) { return src + static_cast<long long>(max(e[j], 0)) * V4_ROW; };
    const int hi = l8 >> 2;
    if (!UP) {
#pragma unroll
      for (int l = 0; l < 2; ++l)
#pragma unroll
        for (int j = 0; j < 2; ++j) d[2 * l + j] = ld_chunk(row(j) + l * 128 + l8 * 16, e[j] >= 0);
    } else {
#pragma unroll
      for (int j = 0; j < 2; ++j) d[j] = ld_chunk(row(j) + 256 + l8 * 16, e[j] >= 0);
      const int ek = hi ? e[1] : e[0];
      d[2] = ld_chunk(src + static_cast<long long>(max(ek, 0)) * V4_ROW + 384 + (l8 & 3) * 16, ek >= 0);
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) sc[j] = pick_scales<UP>(ld_scales(row(j) + V4_SCALES + (UP ? 8 : 0), e[j] >= 0), hi);
  }

  // One chunk as st_v4_chunk, into this CTA's buffer and the peer's (its
  // address `peer` bytes away), completing 32 bytes on the peer's barrier
  // `pbar` of that block.
  __device__ __forceinline__ static void put(unsigned blk, int r, int ch, uint4 v, unsigned e, unsigned peer,
                                             unsigned pbar) {
    unsigned h[8];
    dq_chunk(v, e, h);
    const unsigned a0 = blk + r * 128 + ((ch ^ (r & 7)) << 4), a1 = blk + r * 128 + (((ch + 1) ^ (r & 7)) << 4);
    sts_v4(a0, h[0], h[1], h[2], h[3]);
    sts_v4(a1, h[4], h[5], h[6], h[7]);
    st_async_v4(a0 + peer, h[0], h[1], h[2], h[3], pbar);
    st_async_v4(a1 + peer, h[4], h[5], h[6], h[7], pbar);
  }

  // pfull: the peer's full barriers of this buffer (cluster address).
  template <bool UP>
  __device__ __forceinline__ void store(unsigned buf, int rb, int l8, unsigned peer, unsigned pfull) const {
    const int hi = l8 >> 2, ch = 2 * (l8 & 3);
    if (!UP) {
#pragma unroll
      for (int l = 0; l < 2; ++l)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int c = 2 * l + hi;
          put(buf + c * CB, rb + 16 * j, ch, d[2 * l + j], sc[j] >> (8 * l), peer, pfull + 8 * c);
        }
    } else {
#pragma unroll
      for (int j = 0; j < 2; ++j) put(buf + (4 + hi) * CB, rb + 16 * j, ch, d[j], sc[j], peer, pfull + 8 * (4 + hi));
      put(buf + 6 * CB, rb + 16 * hi, ch, d[2], (hi ? sc[1] : sc[0]) >> 8, peer, pfull + 8 * 6);
    }
    fence_proxy_async();  // generic stores, read by wgmma through the async proxy
  }
};

// The peer's half of a dequantized block: 32 rows of 128 bytes.
constexpr unsigned PEER_BLOCK_BYTES = 32 * 128;

// Every producer thread arrives on a dequantized block's full barrier; one
// also expects the peer's half, so the phase completes when both landed.
__device__ __forceinline__ void arrive_full(unsigned bar, int p) {
  if (p == 0) {
    mbar_arrive_expect_tx(bar, PEER_BLOCK_BYTES);
  } else {
    mbar_arrive(bar);
  }
}
#endif

// Pulls pair pr's packed rows and ropes into L2 (as prefetch_pair). Under
// WG_PAIR each CTA pulls the 64 tokens it dequantizes (threads 0-63).
__device__ __forceinline__ void prefetch_v4(const Pass& ps, int pr, int p, const V4Src& s) {
#if WG_PAIR
  if (p >= 2 * 32) return;
  p = (p >> 5) * BN + 32 * static_cast<int>(cluster_rank()) + (p & 31);
#endif
  const int t = ps.t0 + 2 * pr * BN + p;
  if (!ps.prefetch || t >= ps.t_end) return;
  const long long e = __ldg(ps.idx + t);
  prefetch_lines<V4_PREFETCH>(s.kv + e * V4_ROW);
  prefetch_lines<V4_ROPE_ROW>(reinterpret_cast<const unsigned char*>(s.kv_rope) + e * V4_ROPE_ROW);
}

// Producer (warpgroup 2), V4: Q, then both buffers of every pair (page size
// 1), each group loaded into registers before its buffer is free. The lane
// mapping is the fp8 producer's (tg ^ 1 on lanes 4-7: conflict-free stores).
__device__ void produce_v4(unsigned base, const Pass& ps, Phase& ph, const V4Src& s) {
  const int p = threadIdx.x - 2 * 128;
  const int l8 = p & 7, tg = (p >> 3) ^ (l8 >> 2);
  const unsigned bars = base + OFF_BAR;
  prefetch_v4(ps, 0, p, s);
  {
    const unsigned char* qb = s.q + ps.q_row0 * V4_ROW;
    int e[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) e[k] = tg + 16 * k < ps.nrows ? tg + 16 * k : -1;
    V4Lines ln;
    ln.load<false>(qb, e, l8);
    mbar_wait(bars + 8 * BAR_QEMPTY, (ph.items & 1) ^ 1);
    rope_cp(base + OFF_Q, s.q_rope + ps.q_row0 * 64, e, tg, l8);
    ln.store<false>(base + OFF_Q, tg, l8);
    ln.load<true>(qb, e, l8);
    ln.store<true>(base + OFF_Q, tg, l8);
    cp_async_wait<0>();
    mbar_arrive(bars + 8 * BAR_QFULL);
  }
  const int np = n_pairs(ps);
#if WG_PAIR
  const unsigned rank = cluster_rank(), peer = mapa(base, rank ^ 1u) - base;
  const int rb = tg + 32 * static_cast<int>(rank);
#endif
  for (int pr = 0; pr < np; ++pr, ++ph.pairs) {
    prefetch_v4(ps, pr + 1, p, s);
    // In the order the consumers free them (V0R_FIRST): 0A, 0B, 1A, 1B.
    // Group A of buffer 0 and group B of buffer 1 are blocks 0-3 (lower),
    // the others blocks 4-7 (upper). One CTA's producer runs the steps as a loop:
    // fewer instructions for the instruction cache to hold beside the
    // consumers' loop (docs/kernels.md). The pair producer's half-size
    // steps measured faster unrolled.
#if WG_PAIR
#pragma unroll
#else
#pragma unroll 1
#endif
    for (int step = 0; step < 4; ++step) {
      const int b = step >> 1, g = step & 1;
      int e[4];
      tile_rows<1>(ps, ps.t0 + (2 * pr + b) * BN, tg, e);
#if WG_PAIR
      // Rows rb, rb + 16 are rows tg + 16k of k = 2 rank, 2 rank + 1.
      const int eh[2] = {rank ? e[2] : e[0], rank ? e[3] : e[1]};
      V4Half ln;
      const unsigned buf = base + OFF_BUF + b * TILE;
      const unsigned full = bars + 8 * (BAR_FULL + b * NCB);
      const unsigned empty = empty_bar(bars, b, g);
      const unsigned parity = (ph.pairs & 1) ^ 1;
      if (b == g) {
        ln.load<false>(s.kv, eh, l8);
        mbar_wait(empty, parity);
        ln.store<false>(buf, rb, l8, peer, full + peer);
#pragma unroll
        for (int c = 0; c < 4; ++c) arrive_full(full + 8 * c, p);
      } else {
        ln.load<true>(s.kv, eh, l8);
        mbar_wait(empty, parity);
        rope_cp(buf, s.kv_rope, e, tg, l8);
        mbar_arrive_cp_async(full + 8 * 7);
        ln.store<true>(buf, rb, l8, peer, full + peer);
#pragma unroll
        for (int c = 4; c < 7; ++c) arrive_full(full + 8 * c, p);
      }
#else
      V4Lines ln;
      const unsigned buf = base + OFF_BUF + b * TILE;
      const unsigned full = bars + 8 * (BAR_FULL + b * NCB);
      const unsigned empty = empty_bar(bars, b, g);
      const unsigned parity = (ph.pairs & 1) ^ 1;
      if (b == g) {
        ln.load<false>(s.kv, e, l8);
        mbar_wait(empty, parity);
        ln.store<false>(buf, tg, l8);
#pragma unroll
        for (int c = 0; c < 4; ++c) mbar_arrive(full + 8 * c);
      } else {
        ln.load<true>(s.kv, e, l8);
        mbar_wait(empty, parity);
        rope_cp(buf, s.kv_rope, e, tg, l8);
        mbar_arrive_cp_async(full + 8 * 7);
        ln.store<true>(buf, tg, l8);
#pragma unroll
        for (int c = 4; c < 7; ++c) mbar_arrive(full + 8 * c);
      }
#endif
    }
  }
  ++ph.items;
}

}  // namespace wg
}  // namespace mla
