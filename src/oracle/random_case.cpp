// The random case generator. A Config is drawn first (every decision, no memory), then the
// buffers are built from it. Unused cache slots, unused pages and the gaps of strided layouts
// hold NaN, so a backend that reads one position too many is caught.
#include "random_case.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>
#include <tuple>

#include "scalar_types.h"

namespace kvflash::oracle {
namespace {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull) {}
  uint64_t next() {  // splitmix64
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  int uniform(int lo, int hi) {  // inclusive
    return hi <= lo ? lo : lo + static_cast<int>(next() % static_cast<uint64_t>(hi - lo + 1));
  }
  double real() { return static_cast<double>(next() >> 11) * 0x1p-53; }
  double real(double lo, double hi) { return lo + (hi - lo) * real(); }
  bool chance(double p) { return real() < p; }
  template <class T>
  T pick(std::initializer_list<T> options) {
    return options.begin()[uniform(0, static_cast<int>(options.size()) - 1)];
  }
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[next() % i]);
  }

 private:
  uint64_t state_;
};

enum class CacheLayout { contiguous, padded, heads_outer };
enum class SeqlensMode { none, scalar, tensor };

struct Config {
  DType dtype = DType::bf16;        // q, qv, new k / v, rotary tables
  DType cache_dtype = DType::bf16;  // k_cache / v_cache: dtype, or e4m3 under a 16-bit q
  int heads = 1, heads_k = 1, headdim = 64, headdim_v = 64;
  bool qv = false, only_qv = false, q_absent = false, k_cache_absent = false;
  int batch = 1;
  bool varlen_q = false;
  int seqlen_q = 1;  // static (max_seqlen_q when varlen)
  std::vector<int> q_lens, cache_lens, leftpads, new_lens, rotary_starts, rows;
  SeqlensMode seqlens_mode = SeqlensMode::tensor;
  bool leftpad = false, append = false, packed_new = false, batch_idx = false;
  int new_static = 0;
  int rotary_dim = 0, seqlen_ro = 0;
  bool interleaved = true, rotary_seqlens = false;
  int cache_rows = 1;  // b_k
  bool paged = false;
  int page_size = 1, pages_per_seq = 0, capacity = 0;
  bool shared_pages = false;
  CacheLayout layout = CacheLayout::contiguous;
  bool padded_inputs = false;
  bool causal = false;
  int window_left = -1, window_right = -1, chunk = 0;
  float softcap = 0.0f;
  int sinks = 0;  // 0 none, 1 float32, 2 bfloat16
  int num_splits = 0;
  int pack_gqa = -1;
  std::optional<float> scale;
  bool q_descale = false, k_descale = false, v_descale = false, strided_descale = false;
  bool small_descales = false;  // fp8 cache under a 16-bit q: new rows saturate at +-448
  double magnitude = 1.0;
  bool checked = false;
  bool batch_invariant = false;
  const char* size_class = "small";
};

const char* dtype_tag(DType d) {
  switch (d) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::e4m3: return "e4m3";
    default: return "?";
  }
}

void draw_dims(Rng& rng, Config& c, const CaseLimits& limits) {
  if (limits.mla) {
    c.headdim = 64, c.headdim_v = 512;
    c.qv = rng.chance(0.85);
    c.only_qv = c.qv && rng.chance(0.35);
    c.q_absent = c.only_qv && rng.chance(0.5);
    c.k_cache_absent = c.only_qv && rng.chance(0.5);
    return;
  }
  if (!limits.head_dims.empty()) {
    std::tie(c.headdim, c.headdim_v) = limits.head_dims[rng.uniform(0, static_cast<int>(limits.head_dims.size()) - 1)];
    return;
  }
  const double r = rng.real();
  // An fp8 cache takes fp8's head dims (multiples of 16, at most 256 but for MLA's d_v up to 512
  // under a 16-bit query).
  const bool sixteen_bit = c.cache_dtype == DType::f16 || c.cache_dtype == DType::bf16;
  const bool fp8_cache_16_bit_q = c.cache_dtype != c.dtype;
  // MLA-style qv (d <= 64, d_v >= 256): fp16/bf16 upstream, and fp32 on kvflash's CPU backend;
  // a 16-bit qv over an fp8 cache too.
  // Over an fp8 cache, qv and a missing q are drawn more often: the mixed form is itself a
  // fifth of the 16-bit draws, and the shortened runs (300 cases) must still reach every tag.
  if ((sixteen_bit || c.dtype == DType::f32 || fp8_cache_16_bit_q) && r < (fp8_cache_16_bit_q ? 0.3 : 0.1)) {
    c.qv = true;
    c.headdim = fp8_cache_16_bit_q ? 16 * rng.uniform(2, 4) : 8 * rng.uniform(4, 8);
    c.headdim_v = rng.pick({256, 512});
    c.only_qv = rng.chance(fp8_cache_16_bit_q ? 0.6 : 0.4);
    c.q_absent = c.only_qv && rng.chance(fp8_cache_16_bit_q ? 0.7 : 0.5);
    c.k_cache_absent = c.only_qv && rng.chance(0.5);
  } else if ((sixteen_bit || fp8_cache_16_bit_q) && r < (fp8_cache_16_bit_q ? 0.4 : 0.2)) {
    const bool mla = rng.chance(0.5);  // the two non-square pairs upstream instantiates
    c.headdim = mla ? 64 : 192;
    c.headdim_v = mla ? 512 : 128;
  } else {
    const int step = c.cache_dtype == DType::e4m3 ? 16 : 8;
    c.headdim = c.headdim_v = step * rng.uniform(32 / step, 256 / step);
  }
}

// Shrinks the size bounds until one case's work fits the limit.
void fit_work(const Config& c, int64_t max_work, int& max_q, int& max_ctx) {
  const int64_t per_key = int64_t{c.heads} * (c.headdim + c.headdim_v + (c.qv ? c.headdim_v : 0));
  while (int64_t{c.batch} * max_q * max_ctx * per_key > max_work && (max_q > 1 || max_ctx > 1)) {
    if (max_ctx > 4 * max_q || max_q == 1) max_ctx = std::max(1, max_ctx / 2);
    else max_q = std::max(1, max_q / 2);
  }
}

void draw_lengths(Rng& rng, Config& c, const CaseLimits& limits) {
  const double r = rng.real();
  int max_q = 8, max_ctx = 64;
  int64_t max_work = limits.max_work;
  const bool large = r < limits.large_fraction;
  if (large) {
    // A few batch elements with long contexts (decode-like) or long queries (prefill-like),
    // allowed several times the usual work.
    c.size_class = "large";
    c.batch = std::min(c.batch, rng.uniform(1, 4));
    max_q = rng.chance(0.6) ? std::min(16, limits.max_seqlen_q) : limits.max_seqlen_q;
    max_ctx = limits.max_context;
    max_work *= 8;
  } else if (r < limits.large_fraction + limits.medium_fraction) {
    c.size_class = "medium";
    max_q = std::min(64, limits.max_seqlen_q);
    max_ctx = std::min(1024, limits.max_context);
  }
  fit_work(c, max_work, max_q, max_ctx);
  max_q = std::max(max_q, limits.min_seqlen_q);
  const bool decode = limits.min_seqlen_q <= 1 && rng.chance(0.35);
  auto draw_q = [&] {
    return decode ? 1 : rng.uniform(std::max(large ? (max_q + 1) / 2 : 1, limits.min_seqlen_q), max_q);
  };

  c.varlen_q = limits.awkward || rng.chance(0.4);
  c.q_lens.assign(c.batch, 0);
  if (c.varlen_q) {
    for (int& len : c.q_lens) len = rng.chance(0.1) ? 0 : draw_q();
    if (limits.awkward) c.q_lens[rng.uniform(0, c.batch - 1)] = 0;
    const int longest = *std::max_element(c.q_lens.begin(), c.q_lens.end());
    c.seqlen_q = std::max(1, longest + (rng.chance(0.2) ? rng.uniform(0, 5) : 0));
  } else {
    c.seqlen_q = draw_q();
    std::fill(c.q_lens.begin(), c.q_lens.end(), c.seqlen_q);
  }

  c.append = !c.k_cache_absent && rng.chance(0.35);
  c.new_lens.assign(c.batch, 0);
  if (c.append) {
    c.packed_new = limits.awkward || rng.chance(0.5);
    const int max_new = std::max(1, std::min(max_ctx / 2, c.varlen_q ? max_q : c.seqlen_q * 2));
    if (c.packed_new) {
      for (int& len : c.new_lens) len = rng.chance(0.15) ? 0 : rng.uniform(1, max_new);
    } else {
      c.new_static = rng.chance(0.5) ? std::min(c.seqlen_q, max_new) : rng.uniform(1, max_new);
      std::fill(c.new_lens.begin(), c.new_lens.end(), c.new_static);
    }
  }
  const int no_keys = rng.uniform(0, c.batch - 1);  // the awkward case's sequence with no keys
  if (limits.awkward) c.new_lens[no_keys] = 0;
  const int longest_new = *std::max_element(c.new_lens.begin(), c.new_lens.end());

  c.seqlens_mode = limits.awkward ? SeqlensMode::tensor : c.append ? (rng.chance(0.15) ? SeqlensMode::scalar : SeqlensMode::tensor)
                            : rng.pick({SeqlensMode::none, SeqlensMode::scalar, SeqlensMode::tensor,
                                        SeqlensMode::tensor, SeqlensMode::tensor});
  const int room = std::max(0, max_ctx - longest_new);
  const bool all_empty = rng.chance(0.03);
  c.cache_lens.assign(c.batch, 0);
  if (c.seqlens_mode == SeqlensMode::scalar) {
    std::fill(c.cache_lens.begin(), c.cache_lens.end(), all_empty ? 0 : rng.uniform(0, room));
  } else if (c.seqlens_mode == SeqlensMode::tensor) {
    for (int& len : c.cache_lens) {
      len = all_empty || rng.chance(0.1) ? 0 : rng.uniform(large ? room / 2 : 0, room);
    }
    if (limits.awkward) c.cache_lens[no_keys] = 0;
  }
  int needed = 1;
  for (int b = 0; b < c.batch; ++b) needed = std::max(needed, c.cache_lens[b] + c.new_lens[b]);
  if (c.seqlens_mode == SeqlensMode::none) needed = rng.uniform(1, std::max(1, max_ctx));
  // Upstream requires s_q <= s_k when new keys are appended.
  if (c.append) needed = std::max(needed, c.seqlen_q);
  c.capacity = needed + (rng.chance(0.5) ? rng.uniform(0, 8) : 0);
}

void draw_cache(Rng& rng, Config& c, const CaseLimits& limits) {
  c.batch_idx = rng.chance(0.3);
  c.cache_rows = c.batch + (c.batch_idx ? rng.uniform(0, 3) : 0);
  c.rows.resize(c.cache_rows);
  std::iota(c.rows.begin(), c.rows.end(), 0);
  if (c.batch_idx) rng.shuffle(c.rows);
  c.rows.resize(c.batch);

  c.paged = limits.awkward || rng.chance(limits.mla ? 0.85 : 0.5);
  const int64_t per_slot = int64_t{c.heads_k} * (c.headdim + c.headdim_v);
  if (c.paged) {
    c.page_size = limits.awkward ? rng.pick({1, 3}) : limits.mla ? rng.pick({1, 16, 64}) : rng.pick({1, 3, 16, 16, 64, 256});
    // A smaller page when the largest would not fit the memory bound, or (full-capacity
    // sequences) would make every sequence, hence the work, much longer than drawn.
    while (c.page_size > 1 &&
           (int64_t{c.cache_rows} * (c.capacity + 5 * c.page_size) * per_slot > limits.max_cache_elements ||
            (c.seqlens_mode == SeqlensMode::none && c.page_size > c.capacity))) {
      c.page_size = c.page_size == 256 ? 64 : c.page_size == 64 ? 16 : 1;
    }
    c.pages_per_seq = (c.capacity + c.page_size - 1) / c.page_size + (rng.chance(0.3) ? 1 : 0);
    c.shared_pages = !c.append && rng.chance(0.2);
    c.capacity = c.pages_per_seq * c.page_size;
  }
  if (c.seqlens_mode == SeqlensMode::none) std::fill(c.cache_lens.begin(), c.cache_lens.end(), c.capacity);

  c.leftpad = rng.chance(0.2);
  c.leftpads.assign(c.batch, 0);
  if (c.leftpad) {
    for (int b = 0; b < c.batch; ++b) c.leftpads[b] = rng.chance(0.2) ? c.cache_lens[b] : rng.uniform(0, c.cache_lens[b]);
  }
  c.layout = rng.pick({CacheLayout::contiguous, CacheLayout::contiguous, CacheLayout::contiguous,
                       CacheLayout::padded, CacheLayout::heads_outer});
  c.padded_inputs = rng.chance(0.2);
}

void draw_rotary(Rng& rng, Config& c) {
  c.rotary_starts = c.cache_lens;
  if (!c.append || c.only_qv || c.q_absent || !rng.chance(0.5)) return;
  c.rotary_dim = 16 * rng.uniform(1, c.headdim / 16);
  c.interleaved = rng.chance(0.5);
  c.rotary_seqlens = rng.chance(0.3);
  if (c.rotary_seqlens) {
    for (int& start : c.rotary_starts) start = rng.uniform(0, 2 * c.capacity);
  }
  int longest = c.capacity;  // paged caches need seqlen_ro >= s_k
  for (int b = 0; b < c.batch; ++b) {
    longest = std::max(longest, c.rotary_starts[b] + std::max(c.new_lens[b], c.q_lens[b]));
  }
  c.seqlen_ro = longest + rng.uniform(0, 3);
}

void draw_attention(Rng& rng, Config& c) {
  c.causal = rng.chance(0.4);
  if (rng.chance(0.25)) {
    c.window_left = rng.chance(0.7) ? rng.uniform(0, c.capacity + 2) : -1;
    c.window_right = rng.chance(0.5) ? rng.uniform(0, 8) : -1;
    // Windows as wide as the static sizes, which the spec normalises to "no window" (5.4 rule 1):
    // equal masks, but queries are then rotated at one position instead of one per row.
    if (rng.chance(0.3)) {
      c.window_left = rng.chance(0.7) ? c.capacity - 1 + rng.uniform(0, 2) : -1;
      c.window_right = rng.chance(0.7) ? c.seqlen_q - 1 + rng.uniform(0, 2) : -1;
    }
  }
  if (rng.chance(0.12)) c.chunk = rng.pick({1, 2, 3, 16, 64, 100, 256});
  if (rng.chance(0.15)) c.softcap = rng.pick({1.0f, 5.0f, 30.0f});
  if (rng.chance(0.15)) c.sinks = rng.uniform(1, 2);
  const double r = rng.real();
  c.num_splits = r < 0.4 ? 0 : r < 0.6 ? 1 : r < 0.8 ? 3 : rng.pick({8, 32, 128, 256});
  c.pack_gqa = rng.pick({-1, -1, -1, 0, 1});
  if (c.only_qv || rng.chance(0.3)) c.scale = static_cast<float>(rng.real(0.02, 0.3));
  if (c.dtype == DType::e4m3) {
    c.q_descale = rng.chance(0.7);
    c.k_descale = rng.chance(0.7);
    c.v_descale = rng.chance(0.7);
    c.strided_descale = rng.chance(0.3);
  } else if (c.cache_dtype == DType::e4m3) {
    // A 16-bit query over an fp8 cache: k / v descales only (a q_descale is refused).
    c.k_descale = rng.chance(0.8);
    c.v_descale = rng.chance(0.8);
    c.strided_descale = rng.chance(0.3);
    c.small_descales = c.append && rng.chance(0.25);
  } else {
    const double m = rng.real();
    c.magnitude = m < 0.8 ? 1.0 : m < 0.95 ? 4.0 : 16.0;
    // Descales are read only for fp8 inputs; others must ignore them (spec 12.8).
    c.q_descale = c.k_descale = c.v_descale = rng.chance(0.05);
  }
  c.checked = rng.chance(0.2);
}

// About one case in five with a 16-bit query gets an fp8 e4m3 cache instead (contract 5.8), MLA
// draws too (an fp8 latent cache). Drawn from a stream of its own, so every other case is the one
// its seed gave before that form existed.
bool draw_fp8_cache(uint64_t seed, DType dtype, const CaseLimits& limits) {
  const bool sixteen_bit = dtype == DType::f16 || dtype == DType::bf16;
  Rng own(seed ^ 0x5eed0f8ca5e5ull);
  return sixteen_bit && limits.head_dims.empty() && own.chance(0.2);
}

// About one case in eight runs in batch-invariant mode (splits from each sequence's own lengths),
// drawn from a stream of its own like the fp8 cache above.
bool draw_batch_invariant(uint64_t seed) {
  Rng own(seed ^ 0xb17c4a5e1a7ull);
  return own.chance(0.125);
}

Config draw_config(Rng& rng, uint64_t seed, const CaseLimits& limits) {
  Config c;
  const double r = rng.real();
  c.dtype = r < 0.15 ? DType::f32 : r < 0.4 ? DType::f16 : r < 0.8 ? DType::bf16 : DType::e4m3;
  if (limits.mla) c.dtype = r < 0.5 ? DType::bf16 : DType::f16;
  if (limits.all_fp8) c.dtype = DType::e4m3;
  c.cache_dtype = draw_fp8_cache(seed, c.dtype, limits) ? DType::e4m3 : c.dtype;
  const int heads_choice = limits.awkward ? 3 : rng.uniform(0, 4);
  const int heads[][2] = {{1, 1}, {8, 1}, {32, 8}, {63, 7}, {4, 2}};
  c.heads = limits.mla ? (heads_choice < 3 ? 16 : 128) : heads[heads_choice][0];
  c.heads_k = limits.mla ? 1 : heads[heads_choice][1];
  draw_dims(rng, c, limits);
  c.batch = limits.awkward ? limits.max_batch : rng.chance(0.5) ? rng.uniform(1, std::min(4, limits.max_batch)) : rng.uniform(1, limits.max_batch);
  draw_lengths(rng, c, limits);
  draw_cache(rng, c, limits);
  draw_rotary(rng, c);
  draw_attention(rng, c);
  c.batch_invariant = draw_batch_invariant(seed);
  return c;
}

// ---- building buffers ------------------------------------------------------------------------

// A random value of the dtype: uniform in [-magnitude, magnitude] rounded to the storage type, or
// an e4m3 code with magnitude in [1/8, 3.75] (exponent fields 4..8, no NaN).
uint32_t random_bits(Rng& rng, DType dtype, double magnitude) {
  if (dtype == DType::e4m3) {
    return static_cast<uint32_t>((rng.uniform(0, 1) << 7) | (rng.uniform(4, 8) << 3) | rng.uniform(0, 7));
  }
  return round_to_storage(dtype, static_cast<float>(rng.real(-magnitude, magnitude)));
}

// NaNs with a payload, so that a backend that copies a slot it should not touch is seen too.
uint32_t nan_bits(DType dtype) {
  switch (dtype) {
    case DType::f32: return 0x7fc00abcu;
    case DType::f16: return 0x7e05u;
    case DType::bf16: return 0x7fc5u;
    default: return 0x7fu;
  }
}

// Gaps of 8 elements, 16 for one-byte types: whole 16-byte chunks, so that a padded layout keeps
// the row alignment the CUDA backend requires (a misaligned row is refused, a case of its own).
std::vector<int64_t> padded_strides(const std::vector<int64_t>& shape, DType dtype, bool padded) {
  const int64_t gap = dtype_size(dtype) == 1 ? 16 : 8;
  std::vector<int64_t> strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= std::max<int64_t>(shape[i], 1);
    if (padded) stride += gap * int64_t(shape.size() - i);  // gaps after rows, heads, pages
  }
  return strides;
}

// Fills every element of a (rank <= 4) view with random values.
void fill_random(Rng& rng, const TensorView& t, double magnitude) {
  int64_t count = 1;
  for (int i = 0; i < t.rank; ++i) count *= t.shape[i];
  for (int64_t linear = 0; linear < count; ++linear) {
    int64_t rest = linear, offset = 0;
    for (int i = t.rank - 1; i >= 0; --i) {
      offset += (rest % t.shape[i]) * t.strides[i];
      rest /= t.shape[i];
    }
    store_bits(t, offset, random_bits(rng, t.dtype, magnitude));
  }
}

TensorView int_tensor(Case& k, const std::vector<int>& values) {
  TensorView t = k.allocate(DType::i32, {static_cast<int64_t>(values.size())}, {}, true);
  std::copy(values.begin(), values.end(), t.ptr<int32_t>());
  return t;
}

std::vector<int> prefix_sums(const std::vector<int>& lens) {
  std::vector<int> sums(lens.size() + 1, 0);
  std::partial_sum(lens.begin(), lens.end(), sums.begin() + 1);
  return sums;
}

// A cache view: (rows or pages, slots, h_k, dim) in the configured physical layout, all NaN.
TensorView make_cache(Case& k, const Config& c, int64_t first_dim, int slots, int dim) {
  std::vector<int64_t> shape{first_dim, slots, c.heads_k, dim};
  std::vector<int64_t> strides;
  if (c.layout == CacheLayout::heads_outer) {  // physically (N, h_k, slots, dim)
    strides = {int64_t{c.heads_k} * slots * dim, dim, int64_t{slots} * dim, 1};
  } else {
    strides = padded_strides(shape, c.cache_dtype, c.layout == CacheLayout::padded);
  }
  TensorView t = k.allocate(c.cache_dtype, shape, strides, false);
  const int64_t elements = (first_dim - 1) * strides[0] + (slots - 1) * strides[1] +
                           (c.heads_k - 1) * strides[2] + (dim - 1) * strides[3] + 1;
  for (int64_t e = 0; e < elements; ++e) store_bits(t, e, nan_bits(c.cache_dtype));
  return t;
}

// Page table: each used row gets fresh pages for its positions (a random permutation of all
// pages, a few left unused); entries no position reaches point at random pages.
TensorView make_page_table(Rng& rng, Case& k, const Config& c, int& num_pages) {
  std::vector<int> pages_needed(c.cache_rows, 0);
  for (int b = 0; b < c.batch; ++b) {
    const int positions = c.cache_lens[b] + c.new_lens[b];
    pages_needed[c.rows[b]] = (positions + c.page_size - 1) / c.page_size;
  }
  num_pages = std::accumulate(pages_needed.begin(), pages_needed.end(), 0) + rng.uniform(0, 4);
  num_pages = std::max(num_pages, 1);
  std::vector<int> order(num_pages);
  std::iota(order.begin(), order.end(), 0);
  rng.shuffle(order);
  TensorView table = k.allocate(DType::i32, {c.cache_rows, c.pages_per_seq}, {}, true);
  int32_t* entries = table.ptr<int32_t>();
  size_t next = 0;
  for (int r = 0; r < c.cache_rows; ++r) {
    for (int p = 0; p < c.pages_per_seq; ++p) {
      entries[r * c.pages_per_seq + p] = p < pages_needed[r] ? order[next++] : rng.uniform(0, num_pages - 1);
    }
  }
  if (c.shared_pages) {
    // Prefix sharing (a radix cache): some rows start with another row's first pages. Only
    // without appends, whose writes would then race.
    for (int r = 1; r < c.cache_rows; ++r) {
      const int other = rng.uniform(0, r - 1);
      const int shared = std::min({pages_needed[r], pages_needed[other], rng.uniform(0, 3)});
      for (int p = 0; p < shared; ++p) entries[r * c.pages_per_seq + p] = entries[other * c.pages_per_seq + p];
    }
  }
  return table;
}

// Valid positions [leftpad, cache_seqlens) of every used row get random values.
void fill_valid_slots(Rng& rng, const Config& c, const TensorView& cache, const OptTensor& table) {
  const int dim = static_cast<int>(cache.shape[3]);
  for (int b = 0; b < c.batch; ++b) {
    for (int pos = c.leftpads[b]; pos < c.cache_lens[b]; ++pos) {
      int64_t base;
      if (table) {
        const int page = table->ptr<int32_t>()[c.rows[b] * c.pages_per_seq + pos / c.page_size];
        base = offset_of(cache, {page, pos % c.page_size, 0, 0});
      } else {
        base = offset_of(cache, {c.rows[b], pos, 0, 0});
      }
      for (int hk = 0; hk < c.heads_k; ++hk) {
        for (int ch = 0; ch < dim; ++ch) {
          store_bits(cache, base + hk * cache.strides[2] + ch, random_bits(rng, cache.dtype, 1.0));
        }
      }
    }
  }
}

TensorView activations(Rng& rng, Case& k, const Config& c, std::vector<int64_t> shape, int dim, double magnitude) {
  shape.push_back(dim);
  TensorView t = k.allocate(c.dtype, shape, padded_strides(shape, c.dtype, c.padded_inputs), true);
  fill_random(rng, t, magnitude);
  return t;
}

void build_rotary(Rng& rng, Case& k, const Config& c) {
  KvCacheArgs& a = k.args;
  a.rotary_interleaved = c.interleaved;
  const int half = c.rotary_dim / 2;
  TensorView cos = k.allocate(c.dtype, {c.seqlen_ro, half}, {}, true);
  TensorView sin = k.allocate(c.dtype, {c.seqlen_ro, half}, {}, true);
  const double base = rng.real(100.0, 10000.0);
  for (int pos = 0; pos < c.seqlen_ro; ++pos) {
    for (int p = 0; p < half; ++p) {
      const double angle = pos * std::pow(base, -2.0 * p / c.rotary_dim);
      store_bits(cos, int64_t{pos} * half + p, round_to_storage(c.dtype, static_cast<float>(std::cos(angle))));
      store_bits(sin, int64_t{pos} * half + p, round_to_storage(c.dtype, static_cast<float>(std::sin(angle))));
    }
  }
  a.rotary_cos = cos;
  a.rotary_sin = sin;
  if (c.rotary_seqlens) a.rotary_seqlens = int_tensor(k, c.rotary_starts);
}

TensorView descale_tensor(Rng& rng, Case& k, const Config& c) {
  // Strided: a transposed (h_k, b) buffer viewed as (b, h_k).
  std::vector<int64_t> strides = c.strided_descale ? std::vector<int64_t>{1, c.batch}
                                                   : std::vector<int64_t>{c.heads_k, 1};
  TensorView t = k.allocate(DType::f32, {c.batch, c.heads_k}, strides, true);
  // Small descales put new rows of magnitude <= 1 up to 640 / 448 past fp8's range.
  const double lo = c.small_descales ? 1.0 / 640 : 0.25, hi = c.small_descales ? 1.0 / 64 : 2.0;
  for (int i = 0; i < c.batch * c.heads_k; ++i) {
    t.ptr<float>()[i] = static_cast<float>(rng.real(lo, hi));
  }
  return t;
}

void build_buffers(Rng& rng, Case& k, const Config& c) {
  KvCacheArgs& a = k.args;
  const int total_q = c.varlen_q ? std::accumulate(c.q_lens.begin(), c.q_lens.end(), 0) : c.batch * c.seqlen_q;
  const std::vector<int64_t> q_rows = c.varlen_q ? std::vector<int64_t>{total_q, c.heads}
                                                 : std::vector<int64_t>{c.batch, c.seqlen_q, c.heads};
  if (!c.q_absent) a.q = activations(rng, k, c, q_rows, c.headdim, c.magnitude);
  if (c.qv) a.qv = activations(rng, k, c, q_rows, c.headdim_v, c.magnitude);
  if (c.varlen_q) {
    a.cu_seqlens_q = int_tensor(k, prefix_sums(c.q_lens));
    a.max_seqlen_q = c.seqlen_q;
  }

  int num_pages = 0;
  if (c.paged) a.page_table = make_page_table(rng, k, c, num_pages);
  const int64_t first_dim = c.paged ? num_pages : c.cache_rows;
  const int slots = c.paged ? c.page_size : c.capacity;
  if (!c.k_cache_absent) {
    a.k_cache = make_cache(k, c, first_dim, slots, c.headdim);
    fill_valid_slots(rng, c, *a.k_cache, a.page_table);
  }
  a.v_cache = make_cache(k, c, first_dim, slots, c.headdim_v);
  fill_valid_slots(rng, c, *a.v_cache, a.page_table);

  if (c.seqlens_mode == SeqlensMode::tensor) a.cache_seqlens = int_tensor(k, c.cache_lens);
  if (c.seqlens_mode == SeqlensMode::scalar) a.cache_seqlens_value = c.cache_lens[0];
  if (c.batch_idx) a.cache_batch_idx = int_tensor(k, c.rows);
  if (c.leftpad) a.cache_leftpad = int_tensor(k, c.leftpads);

  if (c.append) {
    const int total_new = std::accumulate(c.new_lens.begin(), c.new_lens.end(), 0);
    const std::vector<int64_t> new_rows = c.packed_new ? std::vector<int64_t>{total_new, c.heads_k}
                                                       : std::vector<int64_t>{c.batch, c.new_static, c.heads_k};
    a.k = activations(rng, k, c, new_rows, c.headdim, 1.0);
    a.v = activations(rng, k, c, new_rows, c.headdim_v, 1.0);
    if (c.packed_new) a.cu_seqlens_k_new = int_tensor(k, prefix_sums(c.new_lens));
  }
  if (c.rotary_dim > 0) build_rotary(rng, k, c);
  if (c.q_descale) a.q_descale = descale_tensor(rng, k, c);
  if (c.k_descale) a.k_descale = descale_tensor(rng, k, c);
  if (c.v_descale) a.v_descale = descale_tensor(rng, k, c);
  if (c.sinks) {
    const DType sink_type = c.sinks == 1 ? DType::f32 : DType::bf16;
    a.sinks = k.allocate(sink_type, {c.heads}, {}, true);
    for (int h = 0; h < c.heads; ++h) {
      // Mostly comparable to the scores; sometimes a sink that dominates or vanishes.
      const double logit = rng.chance(0.9) ? rng.real(-3.0, 3.0) : rng.pick({-40.0, 12.0, 40.0});
      store_bits(*a.sinks, h, round_to_storage(sink_type, static_cast<float>(logit)));
    }
  }
  a.softmax_scale = c.scale;
  a.causal = c.causal;
  a.window_left = c.window_left;
  a.window_right = c.window_right;
  a.attention_chunk = c.chunk;
  a.softcap = c.softcap;
  a.num_splits = c.num_splits;
  if (c.pack_gqa >= 0) a.pack_gqa = c.pack_gqa == 1;
  a.only_qv = c.only_qv;
  a.checked = c.checked;
  a.batch_invariant = c.batch_invariant;
}

std::vector<std::string> feature_tags(const Config& c) {
  std::vector<std::string> t;
  auto add = [&](bool on, const std::string& tag) { if (on) t.push_back(tag); };
  t.push_back(std::string("dtype=") + dtype_tag(c.dtype));
  t.push_back("heads=" + std::to_string(c.heads) + "/" + std::to_string(c.heads_k));
  add(c.headdim != c.headdim_v && !c.qv, "headdim=" + std::to_string(c.headdim) + "/" + std::to_string(c.headdim_v));
  add(c.qv, "qv_headdim_v=" + std::to_string(c.headdim_v));
  t.push_back(std::string("size=") + c.size_class);
  t.push_back(c.paged ? "paged" : "dense_cache");
  add(c.paged, "page_size=" + std::to_string(c.page_size));
  add(c.shared_pages, "shared_pages");
  t.push_back(c.varlen_q ? "varlen_q" : "dense_q");
  t.push_back(c.seqlens_mode == SeqlensMode::none ? "cache_seqlens=none"
              : c.seqlens_mode == SeqlensMode::scalar ? "cache_seqlens=int" : "cache_seqlens=tensor");
  add(c.batch_idx, "cache_batch_idx");
  add(c.leftpad, "cache_leftpad");
  add(c.append && !c.packed_new, "append_dense");
  add(c.append && c.packed_new, "append_packed");
  add(c.rotary_dim > 0, c.interleaved ? "rotary_interleaved" : "rotary_neox");
  add(c.rotary_dim > 0 && c.rotary_dim < c.headdim, "rotary_partial");
  add(c.rotary_seqlens, "rotary_seqlens");
  add(c.causal, "causal");
  add(c.window_left >= 0 || c.window_right >= 0, "window");
  const bool left_unbounded = c.window_left < 0 || c.window_left >= c.capacity - 1;
  const bool right_unbounded = c.window_right < 0 || c.window_right >= c.seqlen_q - 1;
  add((c.window_left >= 0 || c.window_right >= 0) && left_unbounded && right_unbounded && !c.causal,
      c.rotary_dim > 0 ? "window_normalised_away_rotary" : "window_normalised_away");
  add(c.chunk > 0, "attention_chunk");
  add(c.softcap > 0, "softcap");
  add(c.sinks == 1, "sinks_f32");
  add(c.sinks == 2, "sinks_bf16");
  add(c.qv, "qv");
  add(c.only_qv, "only_qv");
  add(c.q_absent, "q_absent");
  add(c.k_cache_absent, "k_cache_absent");
  add(c.dtype == DType::e4m3 && (c.q_descale || c.k_descale || c.v_descale), "fp8_descales");
  add(c.dtype != DType::e4m3 && c.q_descale, "descales_ignored");
  add(c.dtype == DType::e4m3 && c.rotary_dim > 0, "fp8_rotary");
  const bool fp8_kv = c.dtype != DType::e4m3 && c.cache_dtype == DType::e4m3;
  add(fp8_kv, std::string("fp8_kv_cache_q_") + dtype_tag(c.dtype));
  add(fp8_kv && (c.k_descale || c.v_descale), "fp8_kv_descales");
  add(fp8_kv && c.append, "fp8_kv_append");
  add(fp8_kv && c.qv, "fp8_kv_qv");
  add(fp8_kv && c.headdim_v > 256, "fp8_kv_headdim_v=512");
  add(fp8_kv && c.q_absent, "fp8_kv_q_absent");
  add(fp8_kv && c.rotary_dim > 0, "fp8_kv_rotary");
  add(fp8_kv && c.small_descales && (c.k_descale || c.v_descale), "fp8_kv_saturating");
  t.push_back("num_splits=" + std::string(c.num_splits == 0 ? "0" : c.num_splits == 1 ? "1" : c.num_splits == 3 ? "3" : "many"));
  add(c.pack_gqa >= 0, "pack_gqa_forced");
  add(c.batch_invariant, "batch_invariant");
  add(c.batch >= 16, "batch>=16");
  int longest_keys = 0;
  for (int b = 0; b < c.batch; ++b) longest_keys = std::max(longest_keys, c.cache_lens[b] + c.new_lens[b]);
  add(longest_keys >= 1000, "context>=1000");
  add(*std::max_element(c.q_lens.begin(), c.q_lens.end()) >= 100, "seqlen_q>=100");
  add(std::count(c.q_lens.begin(), c.q_lens.end(), 0) > 0, "empty_q_sequence");
  bool empty_k = false, all_k_empty = true;
  for (int b = 0; b < c.batch; ++b) {
    const bool empty = c.cache_lens[b] - c.leftpads[b] + c.new_lens[b] == 0;
    empty_k |= empty;
    all_k_empty &= empty;
  }
  add(empty_k, "empty_k_sequence");
  add(all_k_empty, "all_keys_empty");
  add(c.layout == CacheLayout::padded, "cache_strided_padded");
  add(c.layout == CacheLayout::heads_outer, "cache_heads_outer");
  add(c.padded_inputs, "inputs_strided");
  add(c.scale.has_value(), "softmax_scale_given");
  add(c.magnitude > 1.0, "large_logits");
  add(c.checked, "checked_mode");
  return t;
}

std::string summarize(const Config& c) {
  std::ostringstream os;
  os << dtype_tag(c.dtype) << (c.cache_dtype != c.dtype ? "/e4m3-cache" : "");
  os << " b=" << c.batch << " h=" << c.heads << "/" << c.heads_k
     << " d=" << c.headdim << "/" << c.headdim_v << (c.qv ? (c.only_qv ? " only_qv" : " qv") : "")
     << (c.q_absent ? " q=None" : "") << (c.k_cache_absent ? " k_cache=None" : "")
     << (c.varlen_q ? " varlen" : " dense") << " s_q=" << c.seqlen_q << " cap=" << c.capacity;
  if (c.paged) os << " paged(ps=" << c.page_size << ",pages/seq=" << c.pages_per_seq << (c.shared_pages ? ",shared" : "") << ")";
  os << " cache_seqlens=" << (c.seqlens_mode == SeqlensMode::none ? "None" : c.seqlens_mode == SeqlensMode::scalar ? "int" : "tensor");
  os << " max_ctx=" << *std::max_element(c.cache_lens.begin(), c.cache_lens.end());
  if (c.batch_idx) os << " batch_idx(b_k=" << c.cache_rows << ")";
  if (c.leftpad) os << " leftpad";
  if (c.append) os << " append(" << (c.packed_new ? "packed" : "dense") << ")";
  if (c.rotary_dim) os << " rotary(" << c.rotary_dim << (c.interleaved ? ",gptj" : ",neox") << (c.rotary_seqlens ? ",seqlens" : "") << ")";
  if (c.causal) os << " causal";
  if (c.window_left >= 0 || c.window_right >= 0) os << " window=(" << c.window_left << "," << c.window_right << ")";
  if (c.chunk) os << " chunk=" << c.chunk;
  if (c.softcap > 0) os << " softcap=" << c.softcap;
  if (c.sinks) os << (c.sinks == 1 ? " sinks=f32" : " sinks=bf16");
  os << " splits=" << c.num_splits;
  if (c.pack_gqa >= 0) os << " pack_gqa=" << c.pack_gqa;
  if (c.layout != CacheLayout::contiguous) os << (c.layout == CacheLayout::padded ? " cache=padded" : " cache=heads_outer");
  if (c.checked) os << " checked";
  if (c.batch_invariant) os << " batch_invariant";
  return os.str();
}

}  // namespace

CaseLimits sm90_prefill_limits() {
  CaseLimits limits;
  limits.head_dims = {{64, 64}, {96, 96}, {128, 128}, {192, 192}, {256, 256}, {192, 128}};
  limits.min_seqlen_q = 64;
  limits.max_seqlen_q = 512;
  return limits;
}

CaseLimits sm90_fp8_prefill_limits() {
  CaseLimits limits = sm90_prefill_limits();
  limits.head_dims = {{64, 64}, {128, 128}, {256, 256}};
  limits.all_fp8 = true;
  return limits;
}

Case make_random_case(uint64_t seed, const CaseLimits& limits) {
  Rng rng(seed);
  const Config config = draw_config(rng, seed, limits);
  Case k;
  k.seed = seed;
  build_buffers(rng, k, config);
  k.features = feature_tags(config);
  k.summary = summarize(config) + (limits.awkward ? " (awkward limits)" : "");
  k.seal();
  return k;
}

std::vector<std::string> random_case_features(uint64_t seed, const CaseLimits& limits) {
  Rng rng(seed);
  return feature_tags(draw_config(rng, seed, limits));  // the buffers are drawn after the config
}

std::string describe(const Case& c) {
  std::ostringstream os;
  os << "seed=" << c.seed << " [" << c.summary << "] (reproduce: KVFLASH_DIFF_SEED=" << c.seed
     << " kvflash_tests --gtest_filter='Differential.*')";
  return os.str();
}

}  // namespace kvflash::oracle
