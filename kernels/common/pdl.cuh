// Programmatic dependent launch (PDL) of a forward's second kernel (ps1's
// reduce, page64's and v4_split's merges): the forward lets it launch at
// once, so its blocks are resident and past their own prologue when the
// forward ends, and the second kernel waits for the forward's results
// itself. Both instructions are no-ops when the launch is not a
// programmatic dependent one.
#pragma once

namespace mla {

// Every block of the forward runs this first: the dependent grid may start
// once every block of this one has run it (or exited).
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// Blocks until the primary grid has completed and its writes are visible.
__device__ __forceinline__ void pdl_wait_primary() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

}  // namespace mla

// A module whose merge kernels wait for their forward (above) says so, so the
// host launches an older kernels dir in plain stream order instead of racing.
extern "C" __device__ __attribute__((used)) const int mlab_pdl_waits = 1;
