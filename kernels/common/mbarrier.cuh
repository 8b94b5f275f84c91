// Shared-memory mbarriers and named barriers of the warp-specialised MLA
// core (mla_wg.cuh): a producer warpgroup's cp.async copies complete on an
// mbarrier, so the consumers wait for data without the producer waiting.
#pragma once

namespace mla {

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// `n` arrivals at once (a thread that stands for the warps that copy nothing).
__device__ __forceinline__ void mbar_arrive_n(unsigned bar, unsigned n) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(n) : "memory");
}
// Arrives once every earlier cp.async of this thread has landed; the count
// given to mbar_init includes this arrival (noinc).
__device__ __forceinline__ void mbar_arrive_cp_async(unsigned bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase of parity `parity` has completed. A fresh barrier
// counts its phase "-1" (parity 1) as completed: producers start there.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Arrives and adds `bytes` to the phase's expected transactions (the bytes a
// peer's st.async will complete on it).
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// TMA: the box of a 2-D tensor map at column x, row y (elements) into
// shared memory at `dst` (1024-byte aligned for the 128-byte swizzle); its
// bytes complete on `bar`. `map` is the generic address of a
// `__grid_constant__` CUtensorMap parameter.
__device__ __forceinline__ void tma_tile(unsigned dst, const void* map, int x, int y, unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(map), "r"(x), "r"(y), "r"(bar)
      : "memory");
}

// 2-CTA clusters (WG_PAIR). Both CTAs have the same layout, so a peer
// address is the local one plus the distance of the two windows.
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// shared::cluster address of `a` in CTA `rank` of the cluster.
__device__ __forceinline__ unsigned mapa(unsigned a, unsigned rank) {
  unsigned r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(rank));
  return r;
}
// Arrival on a peer's barrier at CTA scope, as FlashMLA's cluster kernel
// does: it only says this warp's wgmma reads of the buffer have returned,
// and the cluster-scope form compiles to a GPU-wide fence (about 4% of the
// samples, docs/kernels.md).
__device__ __forceinline__ void mbar_arrive_remote(unsigned cluster_bar) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_bar) : "memory");
}
// 16 bytes into a peer's shared memory, completing 16 transaction bytes on
// its barrier `cluster_bar`.
__device__ __forceinline__ void st_async_v4(unsigned cluster_addr, unsigned x, unsigned y, unsigned z, unsigned w,
                                            unsigned cluster_bar) {
  asm volatile("st.async.weak.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(
                   cluster_addr),
               "r"(x), "r"(y), "r"(z), "r"(w), "r"(cluster_bar)
               : "memory");
}
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }

// Named barrier `id` over `n` threads: the arriving side does not wait.
__device__ __forceinline__ void nbar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void nbar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

}  // namespace mla
