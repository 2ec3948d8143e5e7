#include "model/llama.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "anchorkv/anchorkv.h"
#include "cache/anchorkv_state.h"
#include "cache/anchorkv_streaming.h"
#include "core/rng.h"
#include "eval/error_analysis.h"
#include "eval/tasks.h"
#include "io/gguf.h"
#include "kernels/attention_kernels.h"
#include "model/tokenizer.h"
#include "runtime/prefix_chain.h"
#include "runtime/session.h"

namespace anchorkv::model {
namespace {

std::string shared_model(const char* name) {
  return (std::filesystem::path(ANCHORKV_SOURCE_DIR) / ".." / "shared" / "models" / name).string();
}

class Models : public ::testing::TestWithParam<const char*> {};

TEST_P(Models, IncrementalDecodeEqualsPrefillAndLosslessAnchorKVEqualsFull) {
  const std::string path = shared_model(GetParam());
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared model not present: " << path;
  const LlamaWeights w = load_model(path);
  ASSERT_GT(w.config.n_layers, 0);
  const std::vector<int32_t> tokens = {1, 40, 41, 42, 50, 60, 70, 80, 90, 100, 110, 120};
  auto full = [](int64_t) { return std::make_unique<FullKVCache>(); };
  LlamaModel a(w, full), b(w, full);
  const auto prefill = a.forward(tokens, true);
  const int64_t V = w.config.vocab;
  ASSERT_EQ(static_cast<int64_t>(prefill.size()), static_cast<int64_t>(tokens.size()) * V);
  // Prefill attends with the blocked causal kernel, decode with the cache's
  // kernels: the same arithmetic in another order. How far two orders drift
  // through this model is measured here rather than assumed from one CPU:
  // the scalar reference kernels (a third order) against the prefill, and
  // decode may differ from prefill by a few times that.
  LlamaModel r(w, full);
  r.set_reference(true);
  const auto reference = r.forward(tokens, true);
  float largest = 1.0f, order_drift = 0.0f;
  for (size_t i = 0; i < prefill.size(); ++i) {
    largest = std::max(largest, std::fabs(prefill[i]));
    order_drift = std::max(order_drift, std::fabs(reference[i] - prefill[i]));
  }
  const float tol = 4.0f * order_drift + 1e-6f * largest;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto step = b.forward({tokens[i]});
    for (int64_t v = 0; v < V; ++v)
      ASSERT_NEAR(step[v], prefill[i * V + v], tol) << i << "," << v << " (order drift " << order_drift << ")";
  }
  EXPECT_EQ(b.position(), static_cast<int64_t>(tokens.size()));
  // Every token an anchor: the compressed cache holds exactly what the full one does.
  AnchorKVConfig cfg;
  cfg.anchor_frac = 1.0;
  LlamaModel c(w, [&](int64_t) { return std::make_unique<AnchorKVCache>(cfg); });
  const auto lossless = c.forward(tokens, true);
  // (the compressed kernel sums in another order: equal to float rounding through every layer, relative 5e-4)
  for (size_t i = 0; i < lossless.size(); ++i)
    ASSERT_NEAR(lossless[i], prefill[i], 5e-4 * std::max(1.0f, std::fabs(prefill[i])));
  // The scalar reference kernels (matmuls and attention, incl. the compressed kernel) agree.
  for (int cache_kind = 0; cache_kind < 2; ++cache_kind) {
    CacheFactory make = [&](int64_t) -> std::unique_ptr<KVCache> {
      if (cache_kind == 0) return std::make_unique<FullKVCache>();
      AnchorKVConfig lossy;
      lossy.theta = 0.1;
      lossy.anchor_frac = 0.25;
      return std::make_unique<AnchorKVCache>(lossy);
    };
    LlamaModel fast(w, make), ref(w, make);
    ref.set_reference(true);
    const std::vector<int32_t> head(tokens.begin(), tokens.begin() + 8);
    std::vector<float> lf = fast.forward(head, true), lr = ref.forward(head, true);
    for (size_t i = 8; i < tokens.size(); ++i) {  // decode through the (compressed) cache
      const auto a = fast.forward({tokens[i]}), b = ref.forward({tokens[i]});
      lf.insert(lf.end(), a.begin(), a.end());
      lr.insert(lr.end(), b.begin(), b.end());
    }
    // float32 summation order only: 1e-4 of the largest logit.
    float scale = 1.0f;
    for (float x : lr) scale = std::max(scale, std::fabs(x));
    for (size_t i = 0; i < lr.size(); ++i)
      ASSERT_NEAR(lf[i], lr[i], 1e-4 * scale) << "cache " << cache_kind << " at " << i;
  }
  // Threads do not change the bits.
  LlamaModel d(w, full, 1), e(w, full, 2);
  EXPECT_EQ(d.forward(tokens, true), e.forward(tokens, true));
  EXPECT_THROW(a.forward({static_cast<int32_t>(V)}), Error);
}

TEST_P(Models, PreRopeKeysGiveTheSameModel) {
  const std::string path = shared_model(GetParam());
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared model not present: " << path;
  const LlamaWeights w = load_model(path);
  const std::vector<int32_t> tokens = {1, 40, 41, 42, 50, 60, 70, 80, 90, 100, 110, 120};
  const int64_t V = w.config.vocab, P = 6;
  auto full = [](int64_t) { return std::make_unique<FullKVCache>(); };
  LlamaModel post(w, full);
  const auto ref = post.forward(tokens, true);
  // Keys stored unrotated, RoPE inside attention: a prefix, then one token at a time.
  // (fp16 storage rounds unrotated keys differently: 2e-3 of the largest logit.)
  float scale = 1.0f;
  for (float x : ref) scale = std::max(scale, std::fabs(x));
  AnchorKVConfig lossless;
  lossless.anchor_frac = 1.0;
  for (int variant = 0; variant < 2; ++variant) {
    LlamaModel pre(
        w,
        [&](int64_t) -> std::unique_ptr<KVCache> {
          if (variant == 0) return std::make_unique<FullKVCache>();
          return std::make_unique<AnchorKVCache>(lossless);  // the compressed kernel with RoPE
        },
        0, KeyRope::kPreRope);
    // Two prefill chunks (the second attends over the first, fetched and rotated), then decode.
    std::vector<float> got = pre.forward(std::vector<int32_t>(tokens.begin(), tokens.begin() + P / 2), true);
    const auto second = pre.forward(std::vector<int32_t>(tokens.begin() + P / 2, tokens.begin() + P), true);
    got.insert(got.end(), second.begin(), second.end());
    for (size_t i = P; i < tokens.size(); ++i) {
      const auto step = pre.forward({tokens[i]});
      got.insert(got.end(), step.begin(), step.end());
    }
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i)
      ASSERT_NEAR(got[i], ref[i], 2e-3 * scale) << "variant " << variant << " at " << i;
  }
  // A lossy cache: where keys are stored changes what is compressed (the option is live).
  AnchorKVConfig lossy;
  lossy.theta = 0.05;
  lossy.anchor_frac = 0.25;
  auto lossy_factory = [&](int64_t) { return std::make_unique<AnchorKVCache>(lossy); };
  LlamaModel a(w, lossy_factory, 0, KeyRope::kPostRope), b(w, lossy_factory, 0, KeyRope::kPreRope);
  a.forward(std::vector<int32_t>(tokens.begin(), tokens.begin() + P));
  b.forward(std::vector<int32_t>(tokens.begin(), tokens.begin() + P));
  const auto la = a.forward({tokens[P]}), lb = b.forward({tokens[P]});
  float diff = 0;
  for (int64_t v = 0; v < V; ++v) diff = std::max(diff, std::fabs(la[v] - lb[v]));
  EXPECT_GT(diff, 1e-3f);
  // Key residuals coded at their positions only when asked for (the
  // runtime's :keyrope, AnchorKVConfig::key_rope): for the model's RoPE, the
  // same model within the codec's error of the plain pre-RoPE cache.
  AnchorKVConfig with_residuals;
  with_residuals.theta = 0.5;  // head dim 8 (stories260K) needs the tight layout's small metadata for residuals
  with_residuals.metadata = MetadataLayout::kTight;
  with_residuals.anchor_frac = 1.0 / 16;
  with_residuals.window = 4;
  auto residual_factory = [&](int64_t) { return std::make_unique<AnchorKVCache>(with_residuals); };
  LlamaModel b2(w, residual_factory, 0, KeyRope::kPreRope);
  AnchorKVConfig coded_at_positions = with_residuals;
  coded_at_positions.key_rope = w.config.rope;
  LlamaModel c(w, [&](int64_t) { return std::make_unique<AnchorKVCache>(coded_at_positions); }, 0, KeyRope::kPreRope);
  b2.forward(std::vector<int32_t>(tokens.begin(), tokens.begin() + P));
  c.forward(std::vector<int32_t>(tokens.begin(), tokens.begin() + P));
  const auto lb2 = b2.forward({tokens[P]}), lc = c.forward({tokens[P]});
  float diff_c = 0;
  for (int64_t v = 0; v < V; ++v) diff_c = std::max(diff_c, std::fabs(lc[v] - lb2[v]));
  EXPECT_GT(diff_c, 0.0f) << "the residual codes changed";
  EXPECT_LT(diff_c, 0.1f * scale);
  for (size_t l = 0; l < c.caches().size(); ++l) {
    const RopeOptions& kr = dynamic_cast<const AnchorKVCache&>(*c.caches()[l]).config().key_rope;
    EXPECT_TRUE(kr.enabled);
    EXPECT_EQ(kr.base, w.config.rope.base);
    EXPECT_EQ(kr.style, w.config.rope.style);
    EXPECT_EQ(kr.position_offset, 0);
    EXPECT_FALSE(dynamic_cast<const AnchorKVCache&>(*b2.caches()[l]).config().key_rope.enabled);
  }
}

// With an observation window the model hands each layer's cache the real
// (rotated) queries of the prompt's last positions: a SnapKV cache fed by hand
// with the observer's queries, keys and values ends up holding the same bits.
TEST_P(Models, ObservationQueriesReachTheCaches) {
  const std::string path = shared_model(GetParam());
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared model not present: " << path;
  const LlamaWeights w = load_model(path);
  const LlamaConfig& c = w.config;
  std::vector<int32_t> tokens = {1};
  for (int i = 0; i < 59; ++i) tokens.push_back(3 + (i * 37) % 200 % static_cast<int>(c.vocab - 3));
  const int64_t T = static_cast<int64_t>(tokens.size()), W = 8, hd = c.head_dim, Hq = c.n_heads,
                Hk = c.n_kv_heads;
  auto snap = [](int64_t) { return std::make_unique<SnapKVCache>(0.5, 4, 1); };
  LlamaModel m(w, snap), plain(w, snap);
  m.set_observation_window(W);
  std::vector<std::vector<float>> q(c.n_layers), k(c.n_layers), v(c.n_layers);
  m.set_observer([&](int64_t l, int64_t, const float* ql, const float*, const float* kl, const float* vl) {
    auto head_major = [&](const float* x, int64_t H, int64_t from) {
      std::vector<float> out(static_cast<size_t>(H * (T - from) * hd));
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = from; t < T; ++t)
          std::copy_n(&x[(t * H + h) * hd], hd, &out[(h * (T - from) + t - from) * hd]);
      return out;
    };
    q[l] = head_major(ql, Hq, T - W);
    k[l] = head_major(kl, Hk, 0);
    v[l] = head_major(vl, Hk, 0);
  });
  m.forward(tokens);
  plain.forward(tokens);
  bool any_differs = false;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    SnapKVCache by_hand(0.5, 4, 1);
    by_hand.update(TensorView::f32(k[l].data(), {1, Hk, T, hd}), TensorView::f32(v[l].data(), {1, Hk, T, hd}),
                   TensorView::f32(q[l].data(), {1, Hq, W, hd}));
    const KVPair got = m.caches()[l]->fetch(), want = by_hand.fetch();
    ASSERT_EQ(got.keys.shape(), want.keys.shape());
    const uint16_t* g = got.keys.data_as<uint16_t>();
    const uint16_t* e = want.keys.data_as<uint16_t>();
    EXPECT_TRUE(std::equal(g, g + got.keys.numel(), e)) << "layer " << l;
    const KVPair p = plain.caches()[l]->fetch();
    any_differs = any_differs || !std::equal(g, g + got.keys.numel(), p.keys.data_as<uint16_t>());
  }
  EXPECT_TRUE(any_differs) << "the queries changed no layer's choice";
}

// :layers gives each layer's cache its share of theta; a model of another
// layer count refuses the spec.
TEST(Session, LayerWeightsSetEachLayersTheta) {
  const std::string path = shared_model("anchorkv-tiny.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared model not present: " << path;
  const LlamaWeights w = load_model(path);
  ASSERT_EQ(w.config.n_layers, 4);
  LlamaModel m = runtime::make_model(w, "anchorkv_tight:layers2/1/0.5/0.5", 0.05, 1);
  const double want[] = {0.1, 0.05, 0.025, 0.025};
  for (int l = 0; l < 4; ++l)
    EXPECT_NEAR(dynamic_cast<const AnchorKVCache&>(*m.caches()[static_cast<size_t>(l)]).config().theta, want[l], 1e-12);
  EXPECT_THROW(runtime::make_model(w, "anchorkv_tight:layers1/1/1", 0.05, 1), Error);
}

// :fp32 reaches attention: the same prompt and steps give logits within the
// bf16 residual arithmetic's rounding of the default's, and differ from them
// only where this CPU runs the bf16 kernels.
TEST(Session, Fp32ResidualsModifierReachesAttention) {
  const std::string path = shared_model("anchorkv-tiny.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared model not present: " << path;
  const LlamaWeights w = load_model(path);
  std::vector<int32_t> prompt = {1};
  for (int i = 0; i < 399; ++i) prompt.push_back(3 + (i * 37) % 200);
  LlamaModel b = runtime::make_model(w, "anchorkv_tight:pre:obs:auto", 0.05, 2),
             f = runtime::make_model(w, "anchorkv_tight:pre:obs:auto:fp32", 0.05, 2);
  runtime::prefill_prompt(b, prompt);
  runtime::prefill_prompt(f, prompt);
  double diff = 0, norm = 0;
  bool any_differs = false;
  for (int i = 0; i < 8; ++i) {
    const int32_t t = 3 + (i * 11) % 200;
    const std::vector<float> lb = b.forward({t}), lf = f.forward({t});
    ASSERT_EQ(lb.size(), lf.size());
    for (size_t j = 0; j < lb.size(); ++j) {
      diff += (lb[j] - lf[j]) * double{lb[j] - lf[j]};
      norm += lf[j] * double{lf[j]};
    }
    any_differs = any_differs || lb != lf;
  }
  EXPECT_LT(diff / norm, 1e-6);
  const auto& st = internal::unlocked_state(dynamic_cast<const AnchorKVCache&>(*b.caches()[0]));
  EXPECT_EQ(any_differs, kernels::residual_arithmetic(*st.codec, true).bf16);
  EXPECT_THROW(runtime::make_model(w, "full:fp32", 0.05, 1), Error);
}

// The runtime streams AnchorKV: a prompt is compressed whole at its end, the
// tokens generated after it close into segments behind an exact window (with
// the decode steps' own queries), each extending the one before it up to
// kExtendTokens (:ext0 keeps them apart), and :oneshot is the seed's cache.
TEST(Session, StaysCompressedThroughAGeneration) {
  const std::string path = shared_model("anchorkv-tiny.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared model not present: " << path;
  const LlamaWeights w = load_model(path);
  std::vector<int32_t> prompt = {1};
  for (int i = 0; i < 299; ++i) prompt.push_back(3 + (i * 37) % 200);
  LlamaModel s = runtime::make_model(w, "anchorkv_tight:pre:obs:auto", 0.05, 2),
             o = runtime::make_model(w, "anchorkv_tight:pre:obs:auto:oneshot", 0.05, 2);
  runtime::prefill_prompt(s, prompt);
  runtime::prefill_prompt(o, prompt);
  EXPECT_GT(runtime::cache_totals(s).ratio(), 15.0) << "the prompt is compressed whole";
  const auto& st = internal::unlocked_state(dynamic_cast<const AnchorKVCache&>(*s.caches()[0]));
  EXPECT_EQ(st.compressed_tokens(), 300);
  EXPECT_EQ(st.tail.tokens, 0);
  const size_t prompt_segments = st.segments.size();
  for (int i = 0; i < 500; ++i) {
    const int32_t t = 3 + (i * 11) % 200;
    s.forward({t});
    o.forward({t});
    for (const auto& c : s.caches()) {
      const auto& st = internal::unlocked_state(dynamic_cast<const AnchorKVCache&>(*c));
      ASSERT_LT(st.tail.tokens, runtime::kRecentTokens + runtime::kSegmentTokens + internal::close_lag(st.config));
    }
  }
  ASSERT_GE(st.compressed_tokens(), 300 + 2 * runtime::kSegmentTokens) << "generated tokens close a segment at a time";
  EXPECT_EQ((st.compressed_tokens() - 300) % runtime::kSegmentTokens, 0);
  EXPECT_EQ(st.segments.size(), prompt_segments) << "each extends the prompt's (800 < kExtendTokens tokens)";
  LlamaModel apart = runtime::make_model(w, "anchorkv_tight:pre:obs:auto:seg128:ext0", 0.05, 2);
  runtime::prefill_prompt(apart, prompt);
  const auto& sa = internal::unlocked_state(dynamic_cast<const AnchorKVCache&>(*apart.caches()[0]));
  const size_t apart_prompt_segments = sa.segments.size();
  for (int i = 0; i < 500; ++i) apart.forward({3 + (i * 11) % 200});
  ASSERT_EQ(sa.compressed_tokens(), st.compressed_tokens());
  ASSERT_GE(sa.segments.size(), apart_prompt_segments + 2);
  for (size_t j = apart_prompt_segments; j < sa.segments.size(); ++j)
    EXPECT_EQ(sa.segments[j].tokens, runtime::kSegmentTokens) << ":ext0: a segment each";
  // The same budget per token; one segment spares the others' per-row bytes (tight exponents).
  EXPECT_LE(runtime::cache_totals(s).bytes, runtime::cache_totals(apart).bytes);
  EXPECT_GE(runtime::cache_totals(s).bytes, runtime::cache_totals(apart).bytes * 99 / 100);
  EXPECT_EQ(st.recent_queries.size(), AnchorKVConfig{}.window) << "decode steps hand over their queries";
  EXPECT_GT(runtime::cache_totals(s).ratio(), 2.5);  // 800 tokens, fewer than 192 exact
  EXPECT_LT(runtime::cache_totals(o).ratio(), 2.0) << "the seed's cache keeps generated tokens exact";
  EXPECT_FALSE(dynamic_cast<const AnchorKVCache&>(*o.caches()[0]).config().streaming());
}

// A long prompt goes through the model in chunks where the caches allow:
// an exact cache gives the one-call logits (the same fp16 keys, another
// summation order), a streaming cache holds the prompt compressed segment by
// segment, and the one-shot caches take it in one call whatever the chunk.
TEST(Session, LongPromptsArriveInChunksWhereTheCachesAllow) {
  const std::string path = shared_model("anchorkv-tiny.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared model not present: " << path;
  const LlamaWeights w = load_model(path);
  std::vector<int32_t> prompt = {1};
  for (int i = 0; i < 499; ++i) prompt.push_back(3 + (i * 41) % 200);
  auto run = [&](const std::string& spec, int64_t chunk) {
    LlamaModel m = runtime::make_model(w, spec, 0.05, 2);
    std::vector<float> logits = runtime::prefill_prompt(m, prompt, chunk);
    return std::make_pair(std::move(logits), runtime::cache_totals(m));
  };
  const auto [whole, whole_bytes] = run("full", 0);
  const auto [chunked, chunked_bytes] = run("full", 96);
  float largest = 0, diff = 0;
  for (size_t i = 0; i < whole.size(); ++i) {
    largest = std::max(largest, std::abs(whole[i]));
    diff = std::max(diff, std::abs(whole[i] - chunked[i]));
  }
  EXPECT_LE(diff, 1e-4f * largest);
  EXPECT_EQ(chunked_bytes.bytes, whole_bytes.bytes);
  for (const char* oneshot : {"anchorkv_tight:pre:obs:auto:oneshot", "snapkv:obs"})
    EXPECT_EQ(run(oneshot, 96).first, run(oneshot, 0).first) << oneshot << " takes the prompt in one call";
  LlamaModel s = runtime::make_model(w, "anchorkv_tight:pre:obs:auto:seg128:ext0", 0.05, 2);
  const std::vector<float> streamed = runtime::prefill_prompt(s, prompt, 96);
  const auto& st = internal::unlocked_state(dynamic_cast<const AnchorKVCache&>(*s.caches()[0]));
  EXPECT_EQ(st.compressed_tokens(), 500);
  EXPECT_GE(st.segments.size(), 4u) << "each chunk closes what left the window";
  LlamaModel x = runtime::make_model(w, "anchorkv_tight:pre:obs:auto", 0.05, 2);
  runtime::prefill_prompt(x, prompt, 96);
  const auto& sx = internal::unlocked_state(dynamic_cast<const AnchorKVCache&>(*x.caches()[0]));
  EXPECT_EQ(sx.compressed_tokens(), 500);
  EXPECT_EQ(sx.segments.size(), 1u) << "by default each extends the one before it";
  EXPECT_GT(runtime::cache_totals(s).ratio(), 10.0);
  EXPECT_NE(streamed, run("anchorkv_tight:pre:obs:auto", 0).first)
      << "later chunks attend over the compressed segments";
}

// A prompt's blocks (one per segment) restore the session bit for bit at a
// restore point: the same logits, the same next steps; a later turn adds
// blocks after them alone; blocks out of place, of another cache or not of
// this prompt are refused and leave the model as it was. (Segments extend
// up to 256 tokens here, so each turn's prompt is two.)
TEST(PrefixChain, BlocksRestoreTheSessionAndTheNextTurnAddsItsOwn) {
  const std::string path = shared_model("anchorkv-tiny.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared model not present: " << path;
  const LlamaWeights w = load_model(path);
  const std::string spec = "anchorkv_tight:pre:obs:auto:seg128:ext256";
  const runtime::PromptCacheKey key{runtime::model_identity(path, w), spec, 0.05};
  std::vector<int32_t> turn1 = {1};
  for (int i = 0; i < 299; ++i) turn1.push_back(3 + (i * 37) % 200);
  std::vector<int32_t> turn2 = turn1;
  for (int i = 0; i < 330; ++i) turn2.push_back(3 + (i * 29) % 200);
  auto held = [](const std::vector<runtime::ChainBlock>& blocks) {
    std::vector<runtime::HeldBlock> out;
    for (const auto& b : blocks) out.push_back({b.info, std::make_shared<const std::vector<uint8_t>>(b.file)});
    return out;
  };
  LlamaModel s = runtime::make_model(w, spec, 0.05, 2);
  const std::vector<float> logits1 = runtime::prefill_prompt(s, turn1);
  runtime::mark_restore_point(s);
  const std::vector<runtime::ChainBlock> blocks1 = runtime::chain_blocks(key, s, turn1, {}, logits1);
  ASSERT_GE(blocks1.size(), 2u) << "one block per segment";
  uint64_t parent = runtime::chain_root(key);
  int64_t end = 0;
  for (const auto& b : blocks1) {
    EXPECT_EQ(b.info.parent, parent);
    EXPECT_EQ(b.info.first, end);
    EXPECT_TRUE(b.info.matches(turn1)) << "a block holds its own tokens";
    const auto info = runtime::block_info(b.file.data(), b.file.size(), "block", key);
    ASSERT_TRUE(info);
    EXPECT_EQ(info->key, b.info.key);
    EXPECT_EQ(info->tokens, b.info.tokens);
    parent = b.info.key;
    end = b.info.end();
  }
  EXPECT_EQ(end, 300);
  EXPECT_FALSE(runtime::block_info(blocks1[0].file.data(), blocks1[0].file.size(), "block",
                                   {key.identity, "anchorkv_tight:pre", 0.05}))
      << "another cache's chains";

  LlamaModel r = runtime::make_model(w, spec, 0.05, 2);
  const runtime::ChainRestored c = runtime::restore_chain(held(blocks1), key, turn2, r);
  ASSERT_EQ(c.restored.outcome, runtime::Restore::kUsed) << c.restored.why_not;
  EXPECT_EQ(c.restored.tokens, 300);
  EXPECT_EQ(c.restored.logits, logits1);
  // Turn 2 on both: the same bits, and its blocks follow turn 1's.
  const std::vector<int32_t> rest(turn2.begin() + 300, turn2.end());
  const std::vector<float> logits2 = runtime::prefill_prompt(s, rest);
  EXPECT_EQ(runtime::prefill_prompt(r, rest), logits2);
  const std::vector<runtime::ChainBlock> blocks2 =
      runtime::chain_blocks(key, r, turn2, {blocks1.back().info.key, 300}, logits2);
  ASSERT_GE(blocks2.size(), 1u);
  EXPECT_EQ(blocks2[0].info.parent, blocks1.back().info.key);
  EXPECT_EQ(blocks2[0].info.first, 300);
  std::vector<runtime::HeldBlock> whole = held(blocks1), after = held(blocks2);
  whole.insert(whole.end(), after.begin(), after.end());
  LlamaModel again = runtime::make_model(w, spec, 0.05, 2);
  ASSERT_EQ(runtime::restore_chain(whole, key, turn2, again).restored.outcome, runtime::Restore::kUsed);
  for (int32_t t : {5, 17, 42}) EXPECT_EQ(again.forward({t}), s.forward({t}));

  LlamaModel bad = runtime::make_model(w, spec, 0.05, 2);
  std::vector<runtime::HeldBlock> swapped = whole;
  std::swap(swapped[0], swapped[1]);
  runtime::ChainRestored b = runtime::restore_chain(swapped, key, turn2, bad);
  EXPECT_EQ(b.restored.outcome, runtime::Restore::kDamaged);
  EXPECT_EQ(b.bad_block, 0u);
  std::vector<runtime::HeldBlock> renamed = whole;  // bytes of one block held under another's key
  renamed[1].file = renamed[2].file;
  b = runtime::restore_chain(renamed, key, turn2, bad);
  EXPECT_EQ(b.restored.outcome, runtime::Restore::kDamaged);
  EXPECT_EQ(b.bad_block, 1u);
  std::vector<int32_t> other = turn2;
  other[310] += 1;  // turn 2's blocks are not this prompt's
  b = runtime::restore_chain(whole, key, other, bad);
  EXPECT_EQ(b.restored.outcome, runtime::Restore::kNotPrefix);
  EXPECT_EQ(b.bad_block, blocks1.size());
  EXPECT_EQ(runtime::restore_chain(whole, {key.identity, spec, 0.1}, turn2, bad).restored.outcome,
            runtime::Restore::kDamaged);
  EXPECT_EQ(bad.position(), 0) << "a refused chain leaves the model as it was";
}

// Random damage to a chain's blocks (bytes flipped, blocks dropped, swapped or
// repeated): each restore is used or refused with the model untouched, and
// the model decodes on either way (fuzz/chain_fuzz.cc goes past the checksums).
TEST(PrefixChain, DamagedChainsAreRefusedAndTheModelGoesOn) {
  const std::string path = shared_model("anchorkv-tiny.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared model not present: " << path;
  const LlamaWeights w = load_model(path);
  const std::string spec = "anchorkv_tight:pre:seg32:recent8:ext0";
  const runtime::PromptCacheKey key{"tiny", spec, 0.1};
  std::vector<int32_t> prompt = {1};
  for (int i = 0; i < 159; ++i) prompt.push_back(3 + (i * 13) % 200);
  LlamaModel s = runtime::make_model(w, spec, 0.1, 1);
  const std::vector<float> logits = runtime::prefill_prompt(s, prompt, 40);
  const std::vector<runtime::ChainBlock> blocks = runtime::chain_blocks(key, s, prompt, {}, logits);
  ASSERT_GE(blocks.size(), 3u);
  core::Rng rng(11);
  int used = 0;
  for (int trial = 0; trial < 60; ++trial) {
    std::vector<runtime::HeldBlock> chain;
    for (const auto& b : blocks) chain.push_back({b.info, std::make_shared<const std::vector<uint8_t>>(b.file)});
    const size_t edited = rng.next() % chain.size();
    std::vector<uint8_t> file = *chain[edited].file;
    for (uint64_t e = rng.next() % 3; e > 0; --e) file[rng.next() % file.size()] ^= static_cast<uint8_t>(1 + rng.next() % 255);
    chain[edited].file = std::make_shared<const std::vector<uint8_t>>(std::move(file));
    const uint64_t shape = rng.next() % 8;
    if (shape == 1) chain.erase(chain.begin());
    if (shape == 2) std::swap(chain.front(), chain.back());
    if (shape == 3) chain.push_back(chain.back());
    LlamaModel m = runtime::make_model(w, spec, 0.1, 1);
    const runtime::ChainRestored r = runtime::restore_chain(chain, key, prompt, m);
    if (r.restored.outcome == runtime::Restore::kUsed) {
      ++used;
      EXPECT_EQ(m.position(), r.restored.tokens);
    } else {
      EXPECT_EQ(m.position(), 0) << r.restored.why_not;
      EXPECT_LT(r.bad_block, chain.size());
    }
    if (m.position() < 160) m.forward(std::vector<int32_t>(prompt.begin() + m.position(), prompt.end()));
    EXPECT_EQ(m.forward({5}).size(), static_cast<size_t>(w.config.vocab));
  }
  EXPECT_GT(used, 0) << "undamaged chains (no edit, no reshaping) restore";
}

// The chat task: turns of a prompt and a scored answer through one session.
TEST(ChatTask, ScoresEveryTurnThroughTheSession) {
  const std::string path = shared_model("anchorkv-tiny.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared model not present: " << path;
  const LlamaWeights w = load_model(path);
  std::vector<int32_t> toks = {1};
  for (int i = 0; i < 599; ++i) toks.push_back(3 + (i * 53) % 200);
  const eval::ChatRun ref = eval::chat(w, toks, 5, 70, 40, "full", 0, 2);
  ASSERT_EQ(ref.logp.size(), 5u);
  ASSERT_EQ(ref.logp[0].size(), 40u);
  for (const auto& t : eval::score_chat(ref, ref)) EXPECT_EQ(t.kl, 0.0);
  const eval::ChatRun s = eval::chat(w, toks, 5, 70, 40, "anchorkv_tight:pre:obs:auto", 0.05, 2),
                      o = eval::chat(w, toks, 5, 70, 40, "anchorkv_tight:pre:obs:auto:oneshot", 0.05, 2);
  const std::vector<eval::ChatTurnScore> turns = eval::score_chat(ref, s);
  ASSERT_EQ(turns.size(), 5u);
  for (const auto& t : turns) EXPECT_GT(t.kl, 0.0);
  EXPECT_GT(s.session.ratio(), 3.0 * o.session.ratio()) << "every turn's message is compressed whole";
  for (size_t t = 1; t < s.bytes.size(); ++t) EXPECT_GT(s.bytes[t].full, s.bytes[t - 1].full);
  EXPECT_THROW(eval::chat(w, toks, 6, 70, 40, "full", 0, 2), Error) << "600 tokens hold 5 turns of 110";
}

TEST(CopyTask, PassageFillerPassage) {
  const std::string path = shared_model("anchorkv-tiny.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared model not present: " << path;
  const Tokenizer tok = Tokenizer::from_gguf(io::GgufFile::open(path));
  const std::vector<int32_t> text = tok.encode("In the beginning God created the heaven and the earth.", false);
  const int64_t L = 20, ctx = 100;
  const eval::CopyPrompt c = eval::copy_prompt(tok, text, ctx, L);
  ASSERT_EQ(static_cast<int64_t>(c.tokens.size()), ctx);
  EXPECT_EQ(c.prefix, ctx - L);
  EXPECT_EQ(c.tokens[0], tok.bos());
  for (int64_t i = 0; i < L; ++i) {
    EXPECT_EQ(c.tokens[1 + i], text[i]);
    EXPECT_EQ(c.tokens[c.prefix + i], text[i]);
  }
  EXPECT_NE(tok.decode(std::vector<int32_t>(c.tokens.begin() + 1 + L, c.tokens.begin() + c.prefix)).find("grass"),
            std::string::npos);
  EXPECT_THROW(eval::copy_prompt(tok, text, 40, L), Error);   // two passages do not fit
  EXPECT_THROW(eval::copy_prompt(tok, text, 1000, 200), Error);  // the text is shorter
}

TEST(MultiQueryTask, FactsAtSpreadDepthsAndTheirQuestions) {
  const std::string path = shared_model("anchorkv-tiny.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared model not present: " << path;
  const Tokenizer tok = Tokenizer::from_gguf(io::GgufFile::open(path));
  const eval::MultiQueryPrompt p = eval::multi_query_prompt(tok, 600, 4, 7);
  ASSERT_EQ(p.prefix.size(), 600u);
  ASSERT_EQ(p.questions.size(), 4u);
  const std::string text = tok.decode(p.prefix);
  std::vector<double> depths;
  for (const auto& q : p.questions) {
    const std::string question = tok.decode(q.question), answer = tok.decode(q.answer);
    const std::string name = question.substr(24, question.find('?') - 24);  // "What is the pass key of NAME?"
    const std::string key = answer.substr(1, answer.size() - 2);            // " KEY."
    EXPECT_NE(text.find("The pass key of " + name + " is " + key + "."), std::string::npos) << name;
    depths.push_back(q.depth);
  }
  std::sort(depths.begin(), depths.end());
  EXPECT_EQ(depths, (std::vector<double>{0.125, 0.375, 0.625, 0.875}));
  EXPECT_THROW(eval::multi_query_prompt(tok, 100, 4, 7), Error);  // no room
  EXPECT_THROW(eval::multi_query_prompt(tok, 600, 0, 7), Error);
  // The full cache scored against itself: zero KL, finite NLL.
  const LlamaWeights w = load_model(path);
  const eval::MultiQueryRun full = eval::multi_query(w, p, "full", 0, 1, nullptr);
  const eval::MultiQueryRun again = eval::multi_query(w, p, "full", 0, 2, &full);
  for (const auto& a : again.answers) {
    EXPECT_NEAR(a.kl, 0.0, 1e-9);
    EXPECT_TRUE(std::isfinite(a.nll) && a.nll > 0);
  }
}

// The error analysis: zero for the full cache, a consistent split for a lossy one.
TEST(ErrorAnalysis, FullCacheHasNoErrorAndLossyOneSplitsIt) {
  const std::string path = shared_model("anchorkv-tiny.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared model not present: " << path;
  const LlamaWeights w = load_model(path);
  const Tokenizer tok = Tokenizer::from_gguf(io::GgufFile::open(path));
  const std::vector<int32_t> toks = tok.encode(
      "In the beginning God created the heaven and the earth. And the earth was without form, and void; and "
      "darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters.",
      true);
  const int64_t P = static_cast<int64_t>(toks.size()) / 2;
  const eval::ErrorAnalysis full = eval::analyze_errors(w, toks, P, "full", 0, 2, 3);
  EXPECT_NEAR(full.kl_all, 0.0, 1e-12);
  for (const auto& e : full.heads) {
    EXPECT_NEAR(e.err, 0.0, 1e-12);
    EXPECT_EQ(e.approx_share, 0.0);
  }
  const eval::ErrorAnalysis a = eval::analyze_errors(w, toks, P, "anchorkv_compact:obs", 0.05, 2, 3);
  ASSERT_EQ(a.layers.size(), static_cast<size_t>(w.config.n_layers));
  ASSERT_EQ(a.heads.size(), static_cast<size_t>(w.config.n_layers * w.config.n_kv_heads));
  EXPECT_GT(a.kl_all, 0.0);
  for (const auto& e : a.heads) {
    EXPECT_GT(e.err, 0.0);
    EXPECT_GT(e.approx_share, 0.0);
    EXPECT_LE(e.approx_share, 1.0);
    EXPECT_GE(e.approx_mass_true, 0.0);
    EXPECT_LE(e.approx_mass_true, 1.0 + 1e-9);
  }
  for (const auto& l : a.layers) EXPECT_GE(l.kl_alone, 0.0);
  EXPECT_THROW(eval::analyze_errors(w, toks, P, "snapkv", 0.2, 2), Error);  // evicts: positions lost
  EXPECT_THROW(eval::analyze_errors(w, toks, 1, "full", 0, 2), Error);
}

INSTANTIATE_TEST_SUITE_P(Shared, Models, ::testing::Values("anchorkv-tiny.gguf", "stories260K.bin"));

TEST(Llama, BadFilesAreClearErrors) {
  EXPECT_THROW(load_model("/nonexistent/model.bin"), Error);
  const auto tmp = std::filesystem::temp_directory_path() / "anchorkv_bad_llama2c.bin";
  {
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    const int32_t h[7] = {64, 172, 5, 8, 4, 512, 512};  // header only: weights missing
    std::fwrite(h, 4, 7, f);
    std::fclose(f);
  }
  try {
    load_model(tmp.string());
    ADD_FAILURE() << "accepted a truncated checkpoint";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptFile);
    EXPECT_NE(std::string(e.what()).find("the header implies"), std::string::npos) << e.what();
  }
  std::filesystem::remove(tmp);
}

}  // namespace
}  // namespace anchorkv::model
