// The family rule: which kernel family, kernel shape, instantiation and tile run a call, from the
// values a PlanKey holds (real arch, dtype, head dims, shape). The planner records its answer in
// the Plan (Plan::kernel, block_m, block_n) and plans splits the family's way; the CUDA
// dispatcher launches exactly the Plan's kernel from the instantiation table
// (src/cuda/instantiations.def). Host and device, constexpr.
//
// Adding a family: one row in kernel_family() (and in family_tile() if it has its own tile
// table), its rows in the instantiation table, and its folder src/cuda/<family>/.
#pragma once

#include "core/limits.h"
#include "core/split_rule.h"
#include "core/tile_size.h"
#include "kvflash/kernel_family.h"

namespace kvflash::core {

// What the rule reads (a PlanKey's fields; see family_inputs() in the planner).
struct FamilyInputs {
  int arch = 0;             // 0: CPU, else compute capability * 10 as the device reports it
  bool sixteen_bit = true;  // fp16 / bf16 inputs (false: fp8, a 16-bit query over an fp8 cache too)
  int headdim = 0;
  int headdim_v = 0;
  int64_t packed_rows = 0;  // max_seqlen_q x query heads per KV head (the kernels pack GQA)
  // What the sm90 family also needs (it runs one query head per CTA row space, one split):
  int max_seqlen_q = 0;
  int page_size = 0;        // 0: dense cache
  bool has_leftpad = false;
  bool one_split = false;   // at most one split asked for, and FA3's rule plans one (heuristics.cpp)
  // On unless KVFLASH_SM90=0 (read by family_inputs()).
  bool sm90_enabled = true;
  // Pages smaller than a key block on the sm90 family: on unless KVFLASH_SM90_SMALL_PAGES=0
  // (family_inputs()).
  bool sm90_small_pages = true;
  bool has_qv = false;      // qv given (MLA): the d_v 512 instantiation
  // The sm90_mla kernel for MLA decode: on unless KVFLASH_SM90_MLA=0 (family_inputs()).
  bool sm90_mla = true;
  // The sm90 family's small tiles for short prompts (sm90_small_tiles()): on unless
  // KVFLASH_SM90_SMALL_TILES=0 (family_inputs()).
  bool sm90_small_tiles = false;
  // Its 192-row tiles at d 64 (sm90_three_groups()): on unless KVFLASH_SM90_THREE_GROUPS=0.
  bool sm90_three_groups = false;
  // ... over pages smaller than a key block too: opt-in KVFLASH_SM90_THREE_GROUP_PAGES=1 (compiled,
  // not yet run on a GPU).
  bool sm90_three_group_pages = false;
  // FA3's all-fp8 call: the query itself is e4m3 (a 16-bit query over an fp8 cache is not).
  bool fp8_query = false;
  // The sm90 family's fp8 prefill kernel for the all-fp8 call: on unless KVFLASH_SM90_FP8=0
  // (family_inputs()).
  bool sm90_fp8 = false;
  // Keys the middle query row attends to under the mask (family_inputs(): the static extent, the
  // normalised window): a query tile's average work.
  int middle_row_keys = 0;
};

// Keys per block of the sm90 family's kernels at head dim d (src/cuda/sm90/prefill_kernel.cuh);
// 128 query rows per CTA.
KVFLASH_HD constexpr int sm90_block_n(int headdim) { return headdim <= 128 ? 128 : 64; }

// The fewest keys a page may hold for the sm90 family's TMA loads: a 128-byte-swizzled tile repeats
// every 8 rows, so a page's slice of a key block must start at a multiple of 8 rows.
constexpr int kSm90MinPageKeys = 8;

// Page sizes whose pages the sm90 kernels load by TMA at head dim d: whole key blocks (a block
// lies in one page: one copy per block), or 8 or more keys dividing the block (one copy per page
// of the block; with a block of 64 or 128 keys these are the powers of two 8 ... block / 2).
KVFLASH_HD constexpr bool sm90_page_fits(int page_size, int headdim) {
  const int block_n = sm90_block_n(headdim);
  return page_size % block_n == 0 || (page_size >= kSm90MinPageKeys && block_n % page_size == 0);
}

// The cache layouts the sm90 kernels read: dense, or without leftpad pages of whole key blocks,
// or (unless opted out) any page size sm90_page_fits. The key block is the wider head dim's, as
// the kernels' (src/cuda/sm90/prefill.h prefill_block_n) and the Plan's tile (family_tile).
KVFLASH_HD constexpr bool sm90_reads_pages(const FamilyInputs& in) {
  if (in.page_size == 0) return true;
  if (in.has_leftpad) return false;
  const int widest = in.headdim > in.headdim_v ? in.headdim : in.headdim_v;
  return in.page_size % sm90_block_n(widest) == 0 ||
         (in.sm90_small_pages && sm90_page_fits(in.page_size, widest));
}

// The head dims the sm90 family is compiled at (src/cuda/instantiations.def): FA3's, d == d_v in
// {64, 96, 128, 192, 256} and (192, 128) (DeepSeek's prefill: rope + nope keys, 128-wide values).
KVFLASH_HD constexpr bool sm90_head_dims(int d, int dv) {
  return (d == dv && (d == 64 || d == 96 || d == 128 || d == 192 || d == 256)) || (d == 192 && dv == 128);
}

// The head dims of the sm90 family's fp8 kernel (src/cuda/instantiations.def's sm90 e4m3 rows):
// d == d_v in {64, 128, 256}, fp8's own widths.
KVFLASH_HD constexpr bool sm90_fp8_head_dims(int d, int dv) { return d == dv && (d == 64 || d == 128 || d == 256); }

// The calls the sm90 family's kernels take: fp16 / bf16 at sm90_head_dims exactly (other widths
// are the portable kernels', which zero-pad), or (opted in) FA3's all-fp8 call at
// sm90_fp8_head_dims (a 16-bit query over an fp8 cache stays on the portable kernels); no qv, at
// least 64 query rows (shorter ones are the sm80 decode / prefill kernels' work), one split, a
// cache layout sm90_reads_pages.
KVFLASH_HD constexpr bool sm90_takes(const FamilyInputs& in) {
  const bool compiled = in.sixteen_bit ? sm90_head_dims(in.headdim, in.headdim_v)
                                       : in.sm90_fp8 && in.fp8_query && sm90_fp8_head_dims(in.headdim, in.headdim_v);
  return compiled && !in.has_qv && in.max_seqlen_q >= 64 && in.one_split && sm90_reads_pages(in);
}

// The sm90 family's small-tile kernel (src/cuda/sm90/prefill.h, rung 6): 64 x 64 tiles, two CTAs
// per SM (three at head dims <= 64: sm90::small_tile_ctas), so that one CTA's prologue and
// epilogue overlap the others' GEMMs. It pays while a query tile's key loop is short (session
// 16, H100, through the API, 16 heads, d 128: b32 x 512 causal 0.176 -> 0.155 ms, full 0.211 ->
// 0.205, b16 x 1024 causal 0.230 -> 0.216 (512 keys per row on average), but b16 x 1024 full
// 0.309 -> 0.321 and b1 x 16k 20% slower): so at most 512 keys for
// the middle query row, prompts of up to 1,024 tokens, head dim <= 128 (two CTAs' tiles fit in
// shared memory), over any cache layout the family reads (pages of 8-64 keys: one copy per page);
// 16-bit calls only (the fp8 kernel is built as rung 3's 128-row shape alone).
constexpr int kSm90SmallTile = 64;
constexpr int kSm90SmallTileMaxHeadDim = 128;
constexpr int kSm90SmallTileMaxSeqlenQ = 1024;
constexpr int kSm90SmallTileMaxKeys = 512;
KVFLASH_HD constexpr bool sm90_small_tiles(const FamilyInputs& in) {
  const int widest = round_up_headdim(in.headdim > in.headdim_v ? in.headdim : in.headdim_v);
  return in.sm90_small_tiles && in.sixteen_bit && widest <= kSm90SmallTileMaxHeadDim && in.max_seqlen_q <= kSm90SmallTileMaxSeqlenQ &&
         in.middle_row_keys <= kSm90SmallTileMaxKeys;
}

// FA3's tile at head dim 64: 192 query rows x 128 keys, three consumer groups (160 registers each).
// At d 64 a block's exp2s take the multiprocessor's special-function units as long as its GEMMs
// take the tensor cores, so a third group's softmax keeps them busy (session 25, H100: see
// BENCHMARKS.md). 16-bit calls, over a dense cache or pages of whole 128-key blocks, and with
// KVFLASH_SM90_THREE_GROUP_PAGES=1 over pages of 8-64 keys too (one copy per page, as rung 3's;
// its kernels are compiled and timed by sm90bench, not yet run on a GPU); short prompts keep the
// small tiles. On unless KVFLASH_SM90_THREE_GROUPS=0 (family_inputs()).
constexpr int kSm90ThreeGroupRows = 192;
constexpr int kSm90ThreeGroupMaxHeadDim = 64;
KVFLASH_HD constexpr bool sm90_three_groups(const FamilyInputs& in) {
  const int widest = round_up_headdim(in.headdim > in.headdim_v ? in.headdim : in.headdim_v);
  const bool pages_read = in.page_size == 0 || in.page_size % sm90_block_n(widest) == 0 || in.sm90_three_group_pages;
  return in.sm90_three_groups && in.sixteen_bit && widest <= kSm90ThreeGroupMaxHeadDim && pages_read &&
         !sm90_small_tiles(in);
}

// Tile t of the sm90 family's persistent kernel (src/cuda/sm90/prefill_kernel.cuh), over m_blocks
// query blocks x heads x sequences: the query block first, last to first (under a causal mask the
// longest blocks start first), then the head, then the sequence (its grid column).
struct Sm90Tile {
  int m_block, head, column;
};
KVFLASH_HD constexpr Sm90Tile sm90_persistent_tile(int t, int m_blocks, int heads, int sequences) {
  const int columns = heads * sequences, rest = t % columns;
  return {m_blocks - 1 - t / columns, rest % heads, rest / heads};
}

// The sm90_mla kernel's tile (src/cuda/sm90/mla_kernel.cuh): 64 packed query rows (query heads x
// tokens of one KV head) per CTA, 64 keys per block.
constexpr int kSm90MlaBlockM = 64;
constexpr int kSm90MlaBlockN = 64;
// MLA decode: at most this many query tokens per sequence (decode, speculative / MTP tokens);
// longer query sides are prefill, the portable kernels' work.
constexpr int kSm90MlaMaxSeqlenQ = 16;

// The calls the sm90_mla kernel takes (opted in): fp16 / bf16 with qv (MLA: the 64 / 512
// instantiation, only_qv too), a decode's query side; any cache layout (it gathers key rows by
// cp.async: dense, leftpad, pages of any size) and any split count.
KVFLASH_HD constexpr bool sm90_mla_takes(const FamilyInputs& in) {
  return in.sm90_mla && in.sixteen_bit && in.has_qv && in.max_seqlen_q <= kSm90MlaMaxSeqlenQ;
}

// Rows, first match wins: the Hopper families on sm_90 (their kernels are sm_90a code) for the
// calls they take, the portable sm80 kernels on every other GPU and call (fp8 among them, but for
// the all-fp8 prefill calls the sm90 family takes when opted in).
KVFLASH_HD constexpr KernelFamily kernel_family(const FamilyInputs& in) {
  if (in.arch == 0) return KernelFamily::cpu;
  if (in.arch == 90 && in.sm90_enabled && sm90_takes(in)) return KernelFamily::sm90;
  if (in.arch == 90 && in.sm90_enabled && sm90_mla_takes(in)) return KernelFamily::sm90_mla;
  return KernelFamily::sm80;
}

// The family's tile (core/tile_size.h's sm80 table; the sm90 kernels' compiled 128 x
// sm90_block_n, whatever the mask, or 64 x 64 for the small-tile kernel's `shape`).
KVFLASH_HD constexpr TileSize family_tile(KernelFamily family, const TileInputs& in,
                                          KernelShape shape = KernelShape::prefill) {
  if (family == KernelFamily::sm90 && shape == KernelShape::prefill_small_tiles) {
    return {kSm90SmallTile, kSm90SmallTile};
  }
  if (family == KernelFamily::sm90 && shape == KernelShape::prefill_three_groups) {
    return {kSm90ThreeGroupRows, sm90_block_n(kSm90ThreeGroupMaxHeadDim)};
  }
  if (family == KernelFamily::sm90) {
    const int d = round_up_headdim(in.headdim), dv = round_up_headdim_v(in.headdim_v);
    return {128, sm90_block_n(d > dv ? d : dv)};
  }
  if (family == KernelFamily::sm90_mla) return {kSm90MlaBlockM, kSm90MlaBlockN};
  return tile_size_sm80(in);
}

// CTA slots per SM the portable split rule (core/split_rule.h) counts for a family's kernels: one
// for the sm90_mla kernel (its shared memory fills an SM), the portable decode CTA's otherwise.
KVFLASH_HD constexpr int family_ctas_per_sm(KernelFamily family) {
  return family == KernelFamily::sm90_mla ? 1 : kPortableCtasPerSm;
}

// Head dims of the instantiation that runs (d, d_v): (192, 128) for its own shape, (64, 512) for
// MLA's (d_v above 256, which the contract allows only with d <= 64, and every call with qv,
// whose d <= 64 and d_v >= 256: one instantiation for the qv.v scores, d_v 256 zero-padded),
// else the wider rounded dim for both (core/tile_size.h round_up_headdim), in 16 bits and over
// an fp8 cache alike. Otherwise fp8 (an fp8 cache, under any query) has only 64, 128 and 256
// (src/cuda/instantiations.def): its wider dim rounds up to one of them; the sm80 tile is the
// same as for the rounded dim (tile_size_sm80 changes only at 64 and 128).
struct InstanceDims {
  int headdim = 0;
  int headdim_v = 0;
};
KVFLASH_HD constexpr int round_up_headdim_fp8(int d) { return d <= 64 ? 64 : d <= 128 ? 128 : 256; }
KVFLASH_HD constexpr InstanceDims instance_dims(int headdim, int headdim_v, bool has_qv = false,
                                                bool fp8 = false) {
  if (has_qv || headdim_v > 256) return {64, 512};
  if (fp8) {
    const int widest = round_up_headdim_fp8(headdim > headdim_v ? headdim : headdim_v);
    return {widest, widest};
  }
  const int d = round_up_headdim(headdim), dv = round_up_headdim(headdim_v);
  if (d == 192 && dv <= 128) return {192, 128};
  const int widest = d > dv ? d : dv;
  return {widest, widest};
}

// The sm80 family's kernel: the decode kernel up to 16 packed query rows per KV head, with both
// 8-row tiles in one CTA (K and V read once) where their registers fit (widest head dim <= 128),
// else one CTA per 8 rows; the prefill kernel beyond.
KVFLASH_HD constexpr KernelShape sm80_shape(int64_t packed_rows, const InstanceDims& dims) {
  const int widest = dims.headdim > dims.headdim_v ? dims.headdim : dims.headdim_v;
  if (packed_rows <= 8) return KernelShape::decode_8;
  if (packed_rows <= 16) return widest <= 128 ? KernelShape::decode_16 : KernelShape::decode_8;
  return KernelShape::prefill;
}

// The kernel of `family` for a call (the planner asks for the rule's family; tests for others).
// On a GPU the inputs are 16-bit or fp8 (fp32 is the CPU's).
KVFLASH_HD constexpr KernelChoice family_kernel(KernelFamily family, const FamilyInputs& in) {
  if (family == KernelFamily::cpu) return KernelChoice{};
  const InstanceDims dims = instance_dims(in.headdim, in.headdim_v, in.has_qv, !in.sixteen_bit);
  const KernelShape shape = family == KernelFamily::sm80       ? sm80_shape(in.packed_rows, dims)
                           : family == KernelFamily::sm90_mla ? KernelShape::mla_decode
                           : sm90_small_tiles(in)             ? KernelShape::prefill_small_tiles
                           : sm90_three_groups(in)            ? KernelShape::prefill_three_groups
                                                              : KernelShape::prefill;
  return KernelChoice{family, shape, dims.headdim, dims.headdim_v};
}

KVFLASH_HD constexpr KernelChoice choose_kernel(const FamilyInputs& in) {
  return family_kernel(kernel_family(in), in);
}

}  // namespace kvflash::core
