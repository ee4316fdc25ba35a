// One flash_attn_with_kvcache call as it crosses from Python: a tuple whose items are FA3's
// arguments in FA3's order (python/kvflash/flash_attn_interface.py builds it), turned into a
// kvflash::KvCacheArgs. A single tuple keeps the per-call crossing cheap and the order in one place.
#pragma once

#include <nanobind/nanobind.h>

#include <string>
#include <utility>

#include "kvflash/args.h"
#include "kvflash/plan.h"
#include "tensor_import.h"

namespace kvflash::python {

// Positions in the tuple; keep in step with python/kvflash/_call.py.
enum CallField : int {
  kQ, kKCache, kVCache, kK, kV, kQv, kRotaryCos, kRotarySin, kCacheSeqlens, kCacheBatchIdx,
  kCacheLeftpad, kPageTable, kCuSeqlensQ, kCuSeqlensKNew, kMaxSeqlenQ, kRotarySeqlens,
  kQDescale, kKDescale, kVDescale, kSoftmaxScale, kCausal, kWindowSize, kAttentionChunk,
  kSoftcap, kRotaryInterleaved, kSchedulerMetadata, kNumSplits, kPackGqa, kSmMargin, kSinks,
  kOnlyQv, kBatchInvariant, kChecked, kCallFieldCount
};

// window_size as (left, right): any pair of integers (tuple, list, 2-element torch tensor or numpy
// array, Python / numpy / torch integer scalars), None for an unbounded side or for no window.
// A TypeError naming window_size otherwise.
std::pair<int, int> window_pair(nb::handle window_size);

// Builds the arguments; tensors are imported through `importer` (which keeps what it made
// alive). scheduler_metadata may be a Plan (typed metadata) or an int32 tensor (FA3's layout).
KvCacheArgs call_args(nb::handle call, TensorImporter& importer);

// Everything in a call that changes its plan, as bytes: the scheduling backend's per-batch key
// (python/kvflash/scheduling.py). Shapes, dtypes and devices of the tensors the plan reads the
// shape of; the length tensors by identity (the batch keeps them alive while the key is cached);
// every scalar that enters the PlanKey. Raises what the call itself would for a malformed call.
std::string configuration_key(nb::handle call);

}  // namespace kvflash::python
