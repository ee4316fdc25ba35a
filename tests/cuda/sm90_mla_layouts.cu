// The sm90_mla kernel's shared-memory and fragment layouts (src/cuda/sm90_mla/mla_kernel.cuh),
// checked on the host (CuTe layouts are host code too), so a build without a GPU sees them break:
//  - V, and V^T as the P V GEMM's B operand, are the first 512 columns of a 576-wide key stage;
//  - the loader's 16-byte chunks (row, 8 c .. 8 c + 7) tile a stage exactly once, each contiguous
//    in the 128-byte swizzle, at MlaTraits::chunk_offset(row, c), and a loading thread's copy
//    (i, j) sits chunk_offset(i * kRowsPerPass, j * 8) past its first (copy_tile's constant steps);
//  - thread t of group 0 (S, its O half) and thread t + 128 of group 1 (the other O half) hold
//    the same rows, so group 0's P and row rescale fit group 1's fragments as they are.
// Exit status 0 = every check held.
#include <cstdio>
#include <vector>

#include "cuda/sm90_mla/mla_kernel.cuh"

namespace {

using namespace cute;
using T = kvflash::cuda::sm90::MlaTraits<__nv_bfloat16>;
using kvflash::cuda::sm90::rows_cols;

int v_is_the_latent_part() {
  int bad = 0;
  const auto rows = typename T::SmemLayoutRows{};
  const auto v = typename T::SmemLayoutV{};
  const auto vt = typename T::SmemLayoutVt{};
  for (int r = 0; r < T::kBlockN; ++r) {
    for (int c = 0; c < T::kLatent; ++c) bad += rows(r, c) != v(r, c) || vt(c, r) != v(r, c);
  }
  return bad;
}

int chunks_tile_a_stage() {
  alignas(1024) static T::E tile[T::kTileElems];
  Tensor s = make_tensor(make_smem_ptr(tile), typename T::SmemLayoutRows{});
  std::vector<int> seen(T::kTileElems / 8, 0);
  int bad = 0;
  for (int row = 0; row < T::kBlockN; ++row) {
    for (int chunk = 0; chunk < T::kChunks; ++chunk) {
      const T::E* at = &s(row, chunk * 8);
      const long offset = at - tile;
      bad += offset % 8 != 0 || offset != T::chunk_offset(row, chunk);
      ++seen[offset / 8];
      for (int e = 1; e < 8; ++e) bad += &s(row, chunk * 8 + e) != at + e;
    }
  }
  for (int n : seen) bad += n != 1;
  for (int t = 0; t < T::kGroupThreads; ++t) {
    const int row = t / T::kThreadsPerRow, chunk = t % T::kThreadsPerRow;
    for (int i = 0; i < T::kPasses; ++i) {
      for (int j = 0; j < T::kChunks / T::kThreadsPerRow; ++j) {
        bad += T::chunk_offset(row + i * T::kRowsPerPass, chunk + j * T::kThreadsPerRow) !=
               T::chunk_offset(row, chunk) + T::chunk_offset(i * T::kRowsPerPass, j * T::kThreadsPerRow);
      }
    }
  }
  bad += &s(1, 0) - tile == typename T::SmemLayoutRows{}(1, 0);  // the swizzle moves row 1's first chunk
  return bad;
}

int groups_share_rows() {
  typename T::MmaS mma_s;
  typename T::MmaO mma_o;
  int bad = 0;
  for (int t = 0; t < T::kGroupThreads; ++t) {
    Tensor cs = mma_s.get_thread_slice(t).partition_C(make_identity_tensor(select<0, 1>(typename T::TileS{})));
    const auto o_tile = Shape<Int<T::kBlockM>, Int<T::kLatent>>{};
    Tensor c0 = mma_o.get_thread_slice(t).partition_C(make_identity_tensor(o_tile));
    Tensor c1 = mma_o.get_thread_slice(t + T::kGroupThreads).partition_C(make_identity_tensor(o_tile));
    Tensor s = make_tensor(cs.data(), rows_cols(cs.layout()));
    Tensor o0 = make_tensor(c0.data(), rows_cols(c0.layout()));
    Tensor o1 = make_tensor(c1.data(), rows_cols(c1.layout()));
    for (int r = 0; r < T::kRowsPerThread; ++r) {
      const int row = get<0>(s(r, 0));
      for (int c = 0; c < size<1>(o0); ++c) {
        bad += get<0>(o0(r, c)) != row || get<0>(o1(r, c)) != row;
        bad += get<1>(o0(r, c)) >= T::kLatent / 2 || get<1>(o1(r, c)) < T::kLatent / 2;  // each group's half
      }
    }
  }
  bad += size(partition_fragment_C(mma_s, select<0, 1>(typename T::TileS{}))) != T::kPValues;
  return bad;
}

}  // namespace

int main() {
  const int v = v_is_the_latent_part(), chunks = chunks_tile_a_stage(), rows = groups_share_rows();
  std::printf("sm90_mla layouts: %d V view, %d chunk, %d row mismatches; %d bytes of shared memory\n", v, chunks,
              rows, T::kSmemBytes);
  return v + chunks + rows == 0 ? 0 : 1;
}
