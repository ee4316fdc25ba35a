// Tile sizes (kBlockM x kBlockN): the one source of truth (each family's table is picked by
// core/kernel_family.h family_tile). The planner derives num_m_blocks,
// key blocks per split and the split heuristics from these numbers, and every kernel (CUDA sm80 /
// sm90, the CPU backend's split partition) must read its block sizes from the same functions with
// the same inputs; otherwise a Plan's per-batch vectors would describe tiles the kernel does not
// use. Usable from host and device code, and in constant expressions.
#pragma once

#include "core/limits.h"

namespace kvflash::core {

struct TileSize {
  int block_m = 0;  // query rows (packed rows with PackGQA) per tile
  int block_n = 0;  // keys per block
};

// What the tile choice depends on. Head dims are given as-is and rounded inside.
struct TileInputs {
  int headdim = 0;
  int headdim_v = 0;
  int elem_bytes = 2;          // 1 selects the fp8 table
  bool causal = false;         // normalised flags (contract 5.4), not the caller's
  bool local = false;
  bool paged_non_tma = false;  // paged KV read without TMA (contract 6.2)
  bool softcap = false;
  bool v_colmajor = false;     // fp8 V stored column-major (never in kvflash today)
  bool qv = false;             // qv given: the sm80 family runs its d_v 512 kernels (kernel_family.h)
};

// Head dims are compiled for {64, 96, 128, 192, 256}; V also for 512 (contract 6.1).
KVFLASH_HD constexpr int round_up_headdim(int d) {
  return d <= 64 ? 64 : d <= 96 ? 96 : d <= 128 ? 128 : d <= 192 ? 192 : 256;
}
KVFLASH_HD constexpr int round_up_headdim_v(int dv) {
  return dv <= 256 ? round_up_headdim(dv) : 512;
}

// Hopper (sm90) table, FA3's choices (contract 6.1).
KVFLASH_HD constexpr TileSize tile_size_sm90_16bit(const TileInputs& in) {
  const int d = round_up_headdim(in.headdim);
  const int dv = round_up_headdim_v(in.headdim_v);
  const bool narrow = in.causal || in.local || in.paged_non_tma;
  if (d <= 64) {
    if (dv == 512) return {64, 64};
    if (dv == 256) return {128, 96};
    return {192, narrow ? 128 : 192};
  }
  if (d <= 96) return {192, in.local || in.paged_non_tma ? 128 : 144};
  if (d <= 128) return {128, narrow ? 128 : 176};
  if (d <= 192) return {128, in.paged_non_tma || in.local ? 96 : (dv <= 128 ? 128 : 112)};
  return {128, in.local ? 64 : 80};
}

KVFLASH_HD constexpr TileSize tile_size_sm90_fp8(const TileInputs& in) {
  const int d = round_up_headdim(in.headdim);
  if (d <= 64) return {192, 160};
  if (d <= 96) return {192, 128};
  if (d <= 128) {
    if (in.paged_non_tma) return {128, 160};
    return {128, in.v_colmajor || (in.softcap && in.local) ? 192 : 224};
  }
  if (d <= 192) return {128, (in.paged_non_tma || in.softcap) && in.local ? 128 : 160};
  return {128, in.local ? 64 : 128};
}

KVFLASH_HD constexpr TileSize tile_size_sm90(const TileInputs& in) {
  return in.elem_bytes == 1 ? tile_size_sm90_fp8(in) : tile_size_sm90_16bit(in);
}

// sm80 (any pre-Hopper GPU) and the CPU backend share one simple table: 128 query rows up to
// head dim 128 and 64 beyond (accumulators stay small), 128 keys per block for head dims up to
// 64, 64 up to 256 (K and V tiles stay small) and 32 at d_v 512 (two stages of 32 x (64 + 512)
// K / V rows, Q and qv fit an sm_80 CTA's shared memory). The larger of the two rounded head dims
// decides; a call with qv runs the d_v 512 kernels whatever its d_v.
KVFLASH_HD constexpr TileSize tile_size_sm80(const TileInputs& in) {
  const int d = round_up_headdim(in.headdim);
  const int dv = in.qv ? 512 : round_up_headdim_v(in.headdim_v);
  const int widest = d > dv ? d : dv;
  return {widest <= 128 ? 128 : 64, widest <= 64 ? 128 : widest <= 256 ? 64 : 32};
}

}  // namespace kvflash::core
