// The sm90 prefill kernel's fp8 pieces (src/cuda/sm90/fp8_v.cuh), checked on the host against
// CuTe's own layouts (host code too), so a build without a GPU sees them break. For each planned
// fp8 tile (d 64, 128, 256):
//  - fp8_tile_offset is CuTe's V and V^T shared-memory layouts at every element of every stage;
//  - the transposers' walk, run by hand over a V stage of random bytes (the groups of all 3 warps:
//    ldmatrix rows at fp8_tile_offset of their keys, the prmt selectors, the stmatrix rows, the
//    keys past the sequence's end as zeros), writes every byte of the V^T stage once, and
//    V^T(c, slot) is V(key of slot, c);
//  - P's A operand: for every consumer thread, A value a (CuTe's partition of the P V GEMM's A)
//    is the thread's accumulator value fp8_p_source(a) (CuTe's partition of the S GEMM's C): the
//    same row, and the key its slot holds; and fp8_p_layout has the A fragment's shape.
// The transposers' shared-memory bank conflicts (most lanes of one access on one bank) are
// printed, not checked. Exit status 0 = every check held.
#include <cstdio>
#include <random>
#include <vector>

#include "cuda/sm90/prefill_rungs.cuh"

namespace {

using namespace cute;
namespace sm90 = kvflash::cuda::sm90;

template <int kHeadDim>
using Traits = sm90::PlannedTraits<__nv_fp8_e4m3, kHeadDim, kHeadDim, false, 0>;

// The key V^T's slot `slot` of a block holds.
int key_of_slot(int slot) { return 32 * (slot / 32) + sm90::fp8_slot_key(slot % 32); }

template <class T>
int tile_offsets_are_cute() {
  constexpr int N = T::kBlockN, D = T::kHeadDimV;
  int bad = 0;
  for (int stage = 0; stage < T::kStages; ++stage) {
    for (int key = 0; key < N; ++key) {
      for (int c = 0; c < D; ++c) {
        const int at = stage * N * D;
        bad += int(typename T::SmemLayoutV{}(key, c, stage)) != at + int(sm90::fp8_tile_offset<N, D>(key, c));
        bad += int(typename T::SmemLayoutVt{}(c, key, stage)) != at + int(sm90::fp8_tile_offset<D, N>(c, key));
      }
    }
  }
  return bad;
}

// Most lanes of one access (32 lanes' 4-byte words) on one of the 32 banks.
int bank_ways(const std::vector<uint32_t>& addresses) {
  int lanes_on[32] = {}, most = 0;
  for (uint32_t a : addresses) most = std::max(most, ++lanes_on[(a / 4) % 32]);
  return most;
}

// A walk's result: every byte of the V^T stage written once, V^T(c, slot) = V(key of slot, c), the
// keys from `valid` on zeros.
template <int N, int D>
int v_transposed_mismatches(const std::vector<uint8_t>& v, const std::vector<uint8_t>& vt_stage,
                            const std::vector<int>& writes, int valid) {
  int bad = 0;
  for (int n : writes) bad += n != 1;
  for (int c = 0; c < D; ++c) {
    for (int slot = 0; slot < N; ++slot) {
      const int key = key_of_slot(slot);
      bad += vt_stage[sm90::fp8_tile_offset<D, N>(c, slot)] != (key < valid ? v[key * D + c] : 0);
    }
  }
  return bad;
}

// transpose_v_stage by hand: ldmatrix.x4.trans and stmatrix.x4 (PTX ISA: lanes 8m .. 8m + 7
// give the row addresses of matrix m; thread t holds, of matrix m, the 16-bit elements (row t / 4,
// columns 2 (t % 4), + 1), which .trans takes from the matrix's transpose: (rows 2 (t % 4), + 1,
// column t / 4)) over a V stage of random bytes, every group of every warp.
template <class T>
int transposers_write_v_transposed(int valid, int& load_ways, int& store_ways) {
  constexpr int N = T::kBlockN, D = T::kHeadDimV;
  using Walk = sm90::Fp8MatrixTranspose<N, D>;
  std::mt19937 rng(uint32_t(D * 1000 + valid));
  std::vector<uint8_t> v(N * D), v_stage(N * D), vt_stage(N * D, 0);
  std::vector<int> writes(N * D, 0);
  for (int key = 0; key < N; ++key) {
    for (int c = 0; c < D; ++c) v_stage[sm90::fp8_tile_offset<N, D>(key, c)] = v[key * D + c] = uint8_t(rng());
  }
  auto b16 = [&](uint32_t at) { return uint32_t(v_stage[at]) | uint32_t(v_stage[at + 1]) << 8; };
  load_ways = store_ways = 0;
  int bad = 0;
  for (int warp = 0; warp < sm90::kTransposeThreads / 32; ++warp) {
    for (int group = warp; group < Walk::kGroups; group += sm90::kTransposeThreads / 32) {
      uint32_t load_row[32], store_row[32];
      for (uint32_t lane = 0; lane < 32; ++lane) {
        const Walk walk(lane);
        load_row[lane] = walk.load_row(lane, group);
        store_row[lane] = walk.store_row(lane, group);
        bad += load_row[lane] % 16 != 0 || store_row[lane] % 16 != 0;
        bad += load_row[lane] != sm90::fp8_tile_offset<N, D>(32 * Walk::slice_of(group) + lane, 16 * Walk::chunk_of(group));
      }
      for (int m = 0; m < 4; ++m) {  // 8 rows of 16 bytes a matrix: 4-byte words' banks
        std::vector<uint32_t> loads, stores;
        for (int i = 0; i < 8; ++i) {
          for (int w = 0; w < 4; ++w) loads.push_back(load_row[8 * m + i] + 4 * w), stores.push_back(store_row[8 * m + i] + 4 * w);
        }
        load_ways = std::max(load_ways, bank_ways(loads));
        store_ways = std::max(store_ways, bank_ways(stores));
      }
      for (uint32_t t = 0; t < 32; ++t) {
        uint32_t in[4], out[4];
        for (int m = 0; m < 4; ++m) {  // .trans: rows 2 (t % 4), + 1 of matrix m, 16-bit column t / 4
          const uint32_t col = 2 * (t / 4);
          in[m] = b16(load_row[8 * m + 2 * (t % 4)] + col) | b16(load_row[8 * m + 2 * (t % 4) + 1] + col) << 16;
        }
        const Walk walk(t);
        sm90::fp8_matrix_words<false>(walk, t, in, 0, out);
        if (valid < N) sm90::fp8_matrix_words<true>(walk, t, in, valid - 32 * int(Walk::slice_of(group)), out);
        for (int m = 0; m < 4; ++m) {  // row t / 4 of matrix m, bytes 4 (t % 4) .. + 3
          const uint32_t at = store_row[8 * m + t / 4] + 4 * (t % 4);
          for (int b = 0; b < 4; ++b) vt_stage[at + b] = uint8_t(out[m] >> (8 * b)), ++writes[at + b];
        }
      }
    }
  }
  return bad + v_transposed_mismatches<N, D>(v, vt_stage, writes, valid);
}

template <class T>
int p_is_the_a_operand() {
  constexpr int N = T::kBlockN;
  typename T::MmaQK mma_qk;
  typename T::MmaPV mma_pv;
  const auto tile = Shape<Int<T::kBlockM>, Int<N>>{};
  int bad = 0;
  for (int t = 0; t < T::kConsumerThreads; ++t) {
    Tensor cs = mma_qk.get_thread_slice(t).partition_C(make_identity_tensor(tile));
    Tensor ca = mma_pv.get_thread_slice(t).partition_A(make_identity_tensor(tile));
    bad += size(ca) != size(cs);
    for (int a = 0; a < size(ca); ++a) {
      const auto from = cs(sm90::fp8_p_source(a));
      bad += get<0>(ca(a)) != get<0>(from) || key_of_slot(get<1>(ca(a))) != get<1>(from);
    }
  }
  Tensor ca = mma_pv.get_thread_slice(0).partition_A(make_identity_tensor(tile));
  bad += !std::is_same_v<decltype(shape(ca)), decltype(shape(sm90::fp8_p_layout<N / 32>()))>;
  return bad;
}

template <int kHeadDim>
int check() {
  using T = Traits<kHeadDim>;
  const int offsets = tile_offsets_are_cute<T>();
  int load_ways = 0, store_ways = 0, walk = 0;
  for (int valid : {T::kBlockN, T::kBlockN - 5, 1, 0}) walk += transposers_write_v_transposed<T>(valid, load_ways, store_ways);
  const int p = p_is_the_a_operand<T>();
  std::printf("sm90 fp8 d %d (block %d x %d): %d tile offset, %d transposer, %d P operand mismatches; bank ways "
              "load %d, store %d; %d bytes of shared memory\n",
              kHeadDim, T::kBlockM, T::kBlockN, offsets, walk, p, load_ways, store_ways, T::kSmemBytes);
  return offsets + walk + p;
}

}  // namespace

int main() {
  const int bad = check<64>() + check<128>() + check<256>();
  return bad == 0 ? 0 : 1;
}
