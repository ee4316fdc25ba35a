// Launching the sm90 family's attention: its best rung (prefill.h), whose kernels are compiled
// once, in prefill_inst_*.cu. Included by the units CMake generates from the instantiation table.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "core/env_switch.h"
#include "cuda/sm90/launch.h"
#include "cuda/sm90/prefill.h"

namespace kvflash::cuda {

// Not launched to overlap the previous kernel: a prefill grid is many CTAs (see sm80/launch.cuh).
// The Plan's small-tile shape runs rung 6 (core::sm90_small_tiles), its three-group shape rung 8
// (core::sm90_three_groups). KVFLASH_SM90_PERSISTENT=1
// runs the persistent rung instead of rung 3 (prefill.h; opt-in: correct on the H200 but slower than
// rung 3 on six of eight shapes, BENCHMARKS.md session 11; the same 128-row tile as rung 3).
// KVFLASH_SM90_PINGPONG=1 runs rung 4 (the groups' GEMMs in turns) instead of rung 3 where it is
// compiled (the ladder's head dims, fp8 included; dense caches or pages of whole blocks).
template <class Elem, int kHeadDim, int kHeadDimV>
void launch_sm90_attention(const AttentionParams& p, KernelShape shape, bool /*overlap_previous*/,
                           cudaStream_t stream) {
  const int rung = shape == KernelShape::prefill_small_tiles     ? sm90::kSmallTileRung
                   : shape == KernelShape::prefill_three_groups  ? sm90::kThreeGroupRung
                   : core::env_opted_in("KVFLASH_SM90_PERSISTENT") ? sm90::kPersistentRung
                   : core::env_opted_in("KVFLASH_SM90_PINGPONG")   ? sm90::kPingPongRung
                                                                    : sm90::kBestRung;
  sm90::launch_prefill_rung<Elem, kHeadDim, kHeadDimV>(p, p.group, rung, stream);
}

}  // namespace kvflash::cuda
