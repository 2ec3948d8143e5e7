// The kernels an attend() call runs, chosen once per call: the fast ones, or
// (AttentionOptions::reference) their scalar twins, which the tests compare
// them against.
#pragma once

#include "core/linalg.h"
#include "kernels/attention_kernels.h"
#include "kernels/coded_attention.h"

namespace anchorkv::kernels {

struct KernelSet {
  decltype(&core::dot_matrix) dot_matrix;
  decltype(&kernels::anchors_chunk) anchors_chunk;
  decltype(&kernels::coded_chunk) coded_chunk;
  decltype(&kernels::affine_chunk) affine_chunk;
  decltype(&kernels::dense_chunk) dense_chunk;
  decltype(&kernels::dense_chunk_rope) dense_chunk_rope;
  decltype(&kernels::entries_chunk) entries_chunk;

  static KernelSet of(bool reference) {
    if (reference)
      return {core::dot_matrix_ref,     kernels::anchors_chunk_ref, kernels::coded_chunk_ref,
              kernels::affine_chunk_ref, kernels::dense_chunk_ref,   kernels::dense_chunk_rope_ref,
              kernels::entries_chunk_ref};
    return {core::dot_matrix,     kernels::anchors_chunk, kernels::coded_chunk,  kernels::affine_chunk,
            kernels::dense_chunk, kernels::dense_chunk_rope, kernels::entries_chunk};
  }
};

}  // namespace anchorkv::kernels
