// pybind11 bindings: the native part of the `anchorkv` Python package.
// The Python-facing classes (KVCacheConfig, AnchorKVKVCache, ...) live in
// python/anchorkv/__init__.py and wrap these.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "anchorkv/anchorkv.h"
#include "anchorkv/baselines.h"

namespace py = pybind11;
using namespace anchorkv;

namespace {

// A numpy array viewed as a TensorView (no copy). Accepts float16 and float32
// with any strides that are whole elements; anything else is a TypeError.
struct ArrayView {
  py::array array;  // keeps the memory alive
  TensorView view;
};

ArrayView as_view(const py::handle& obj, const char* name, const char* op) {
  if (!py::isinstance<py::array>(obj))
    throw py::type_error(std::string("[") + op + "] " + name + " must be a numpy array, got " +
                         std::string(py::str(obj.get_type().attr("__name__"))));
  py::array a = py::reinterpret_borrow<py::array>(obj);
  if (a.dtype().kind() == 'f' && a.dtype().itemsize() > 4) {
    // float64 (and wider): cast to float32 as the seed does; values beyond the
    // float32 range become Inf and are then rejected as non-finite.
    a = py::array_t<float, py::array::forcecast>::ensure(a);
  }
  const py::dtype dt = a.dtype();
  DType dtype;
  if (dt.is(py::dtype::of<float>())) {
    dtype = DType::kF32;
  } else if (dt.kind() == 'f' && dt.itemsize() == 2) {
    dtype = DType::kF16;
  } else {
    throw py::type_error(std::string("[") + op + "] " + name +
                         " must be a float array (float16, float32 or float64), got " +
                         std::string(py::str(static_cast<const py::object&>(dt))));
  }
  if (a.ndim() != 4)
    throw py::value_error(std::string("[") + op + "] " + name + " must have 4 dimensions [B, H, S, D], got " +
                          std::to_string(a.ndim()));
  const auto item = static_cast<py::ssize_t>(dt.itemsize());
  bool ok = true;
  for (int i = 0; i < 4; ++i) ok &= a.strides(i) >= 0 && a.strides(i) % item == 0;
  if (!ok) {  // negative or odd strides: take a contiguous copy
    a = py::array::ensure(a, py::array::c_style | py::array::forcecast);
  }
  ArrayView out{a, {}};
  out.view.data = a.data();
  out.view.dtype = dtype;
  for (int i = 0; i < 4; ++i) {
    out.view.shape[i] = a.shape(i);
    out.view.strides[i] = a.strides(i) / item;
  }
  return out;
}

// Hand a Tensor to numpy without copying: the array owns it through a capsule.
py::array to_numpy(Tensor&& t) {
  auto* owned = new Tensor(std::move(t));
  py::capsule base(owned, [](void* p) { delete static_cast<Tensor*>(p); });
  const auto& s = owned->shape();
  const py::ssize_t item = static_cast<py::ssize_t>(dtype_size(owned->dtype()));
  std::vector<py::ssize_t> shape(s.begin(), s.end());
  std::vector<py::ssize_t> strides = {s[1] * s[2] * s[3] * item, s[2] * s[3] * item, s[3] * item, item};
  return py::array(py::dtype(owned->dtype() == DType::kF32 ? "float32" : "float16"), shape, strides,
                   owned->data(), base);
}

// queries: None or [B, Hq, W, D] observation queries (KVCache::update with queries).
py::tuple update(KVCache& cache, const py::handle& keys, const py::handle& values, const py::handle& queries,
                 const char* op) {
  ArrayView k = as_view(keys, "keys", op);
  ArrayView v = as_view(values, "values", op);
  std::optional<ArrayView> q;
  if (!queries.is_none()) q = as_view(queries, "queries", op);
  KVPair out;
  {
    py::gil_scoped_release release;
    out = q ? cache.update_and_fetch(k.view, v.view, q->view) : cache.update_and_fetch(k.view, v.view);
  }
  return py::make_tuple(to_numpy(std::move(out.keys)), to_numpy(std::move(out.values)));
}

py::tuple fetch(const KVCache& cache) {
  KVPair out;
  {
    py::gil_scoped_release release;
    out = cache.fetch();
  }
  return py::make_tuple(to_numpy(std::move(out.keys)), to_numpy(std::move(out.values)));
}

std::vector<const KVCache*> native_caches(const py::list& caches) {
  std::vector<const KVCache*> out;
  for (const py::handle& c : caches) out.push_back(&c.cast<const KVCache&>());
  return out;
}

PromptCacheMeta make_meta(std::vector<int32_t> tokens, std::vector<float> logits,
                          std::map<std::string, std::string> entries) {
  return {std::move(tokens), std::move(logits), std::move(entries)};
}

// (caches, tokens, logits, entries) for Python; the caches become their most
// derived registered class.
py::tuple loaded_to_python(LoadedCaches&& l) {
  py::list caches;
  for (auto& c : l.caches) caches.append(py::cast(std::move(c)));
  return py::make_tuple(caches, l.meta.tokens, l.meta.logits, l.meta.entries);
}

// The methods every cache shares.
template <class C, class... Extra>
void bind_common(py::class_<C, Extra...>& cls, const char* op) {
  cls.def(
         "update_and_fetch",
         [op](C& c, const py::handle& k, const py::handle& v, const py::handle& q) { return update(c, k, v, q, op); },
         py::arg("keys"), py::arg("values"), py::arg("queries") = py::none())
      .def("fetch", [](const C& c) { return fetch(c); })
      .def_property_readonly("offset", &C::offset)
      .def_property_readonly("nbytes", &C::nbytes)
      .def_property_readonly("full_seq_bytes", &C::full_seq_bytes)
      .def_property_readonly("compression_ratio", &C::compression_ratio)
      .def_property_readonly("tokens_kept", &C::tokens_kept)
      .def_property_readonly("tokens_total", &C::tokens_total)
      .def_property_readonly("name", &C::name);
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "Native core of the anchorkv package (C++ library bindings).";

  // Library errors: bad input -> ValueError, misuse of state -> RuntimeError,
  // the operating system -> OSError.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kIo)
        PyErr_SetString(PyExc_OSError, e.what());
      else if (e.code() == ErrorCode::kInvalidState || e.code() == ErrorCode::kUnsupported)
        PyErr_SetString(PyExc_RuntimeError, e.what());
      else
        PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  py::enum_<ResidualScale>(m, "ResidualScale")
      .value("absmax", ResidualScale::kAbsMax)
      .value("rms", ResidualScale::kRms);
  py::enum_<ResidualAllocation>(m, "ResidualAllocation")
      .value("pooled", ResidualAllocation::kPooledAcrossHeads)
      .value("per_head", ResidualAllocation::kPerHead);
  py::enum_<CompressTrigger>(m, "CompressTrigger")
      .value("first_prefill", CompressTrigger::kFirstPrefill)
      .value("first_decode", CompressTrigger::kFirstDecode);

  py::enum_<MetadataLayout>(m, "MetadataLayout")
      .value("seed", MetadataLayout::kSeed)
      .value("compact", MetadataLayout::kCompact)
      .value("tight", MetadataLayout::kTight);
  py::enum_<AnchorCount>(m, "AnchorCount").value("fixed", AnchorCount::kFixed).value("auto", AnchorCount::kAuto);
  py::enum_<RopeStyle>(m, "RopeStyle").value("normal", RopeStyle::kNormal).value("neox", RopeStyle::kNeox);
  py::class_<RopeOptions>(m, "RopeOptions")
      .def(py::init<>())
      .def_readwrite("enabled", &RopeOptions::enabled)
      .def_readwrite("base", &RopeOptions::base)
      .def_readwrite("style", &RopeOptions::style)
      .def_readwrite("position_offset", &RopeOptions::position_offset)
      .def_readwrite("freq_scale", &RopeOptions::freq_scale);

  py::class_<AnchorKVConfig>(m, "AnchorKVConfig")
      .def(py::init<>())
      .def_readwrite("theta", &AnchorKVConfig::theta)
      .def_readwrite("window", &AnchorKVConfig::window)
      .def_readwrite("rho", &AnchorKVConfig::rho)
      .def_readwrite("anchor_frac", &AnchorKVConfig::anchor_frac)
      .def_readwrite("residual_bits", &AnchorKVConfig::residual_bits)
      .def_readwrite("seed", &AnchorKVConfig::seed)
      .def_readwrite("scale", &AnchorKVConfig::scale)
      .def_readwrite("allocation", &AnchorKVConfig::allocation)
      .def_readwrite("trigger", &AnchorKVConfig::trigger)
      .def_readwrite("metadata", &AnchorKVConfig::metadata)
      .def_readwrite("anchor_count", &AnchorKVConfig::anchor_count)
      .def_readwrite("threads", &AnchorKVConfig::threads)
      .def_readwrite("key_rope", &AnchorKVConfig::key_rope)
      .def_readwrite("segment_tokens", &AnchorKVConfig::segment_tokens)
      .def_readwrite("recent_tokens", &AnchorKVConfig::recent_tokens)
      .def_readwrite("extend_tokens", &AnchorKVConfig::extend_tokens)
      .def("validate", &AnchorKVConfig::validate)
      .def("__repr__", &AnchorKVConfig::to_string);

  py::class_<KVCache>(m, "KVCache")
      .def(
          "update",
          [](KVCache& c, const py::handle& keys, const py::handle& values, const py::handle& queries) {
            const std::string op = "anchorkv::" + c.name() + "::update";
            ArrayView k = as_view(keys, "keys", op.c_str());
            ArrayView v = as_view(values, "values", op.c_str());
            std::optional<ArrayView> q;
            if (!queries.is_none()) q = as_view(queries, "queries", op.c_str());
            py::gil_scoped_release release;
            if (q)
              c.update(k.view, v.view, q->view);
            else
              c.update(k.view, v.view);
          },
          py::arg("keys"), py::arg("values"), py::arg("queries") = py::none());

  m.def(
      "attend",
      [](const py::handle& query, const KVCache& cache, float scale, bool f16, int threads,
         const RopeOptions& rope, bool bf16_residuals, bool bf16_scores) {
        ArrayView q = as_view(query, "query", "anchorkv::attend");
        AttentionOptions o;
        o.scale = scale;
        o.out_dtype = f16 ? DType::kF16 : DType::kF32;
        o.threads = threads;
        o.rope = rope;
        o.bf16_residuals = bf16_residuals;
        o.bf16_scores = bf16_scores;
        Tensor out;
        {
          py::gil_scoped_release release;
          out = attend(q.view, cache, o);
        }
        return to_numpy(std::move(out));
      },
      py::arg("query"), py::arg("cache"), py::arg("scale") = 0.0f, py::arg("f16") = false,
      py::arg("threads") = 0, py::arg("rope") = RopeOptions{}, py::arg("bf16_residuals") = true,
      py::arg("bf16_scores") = true);

  m.def(
      "serialize_caches",
      [](const py::list& caches, std::vector<int32_t> tokens, std::vector<float> logits,
         std::map<std::string, std::string> entries) {
        const auto native = native_caches(caches);
        const PromptCacheMeta meta = make_meta(std::move(tokens), std::move(logits), std::move(entries));
        std::vector<uint8_t> bytes;
        {
          py::gil_scoped_release release;
          bytes = serialize_caches(native, meta);
        }
        return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      },
      py::arg("caches"), py::arg("tokens"), py::arg("logits"), py::arg("entries"));
  m.def(
      "save_caches",
      [](const std::string& path, const py::list& caches, std::vector<int32_t> tokens, std::vector<float> logits,
         std::map<std::string, std::string> entries) {
        const auto native = native_caches(caches);
        const PromptCacheMeta meta = make_meta(std::move(tokens), std::move(logits), std::move(entries));
        py::gil_scoped_release release;
        save_caches(path, native, meta);
      },
      py::arg("path"), py::arg("caches"), py::arg("tokens"), py::arg("logits"), py::arg("entries"));
  m.def("load_caches", [](const std::string& path) {
    LoadedCaches l;
    {
      py::gil_scoped_release release;
      l = load_caches(path);
    }
    return loaded_to_python(std::move(l));
  });
  m.def("load_caches_from_bytes", [](const py::bytes& data) {
    const std::string_view bytes = data;
    LoadedCaches l;
    {
      py::gil_scoped_release release;
      l = load_caches_from_memory(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "<state>");
    }
    return loaded_to_python(std::move(l));
  });

  py::class_<AnchorKVCache, KVCache>(m, "AnchorKVCache")
      .def(py::init<const AnchorKVConfig&>())
      .def_property_readonly("config", [](const AnchorKVCache& c) { return c.config(); })
      .def(
          "update_and_fetch",
          [](AnchorKVCache& c, const py::handle& k, const py::handle& v, const py::handle& q) {
            return update(c, k, v, q, "anchorkv::AnchorKVCache::update_and_fetch");
          },
          py::arg("keys"), py::arg("values"), py::arg("queries") = py::none())
      .def("fetch", [](const AnchorKVCache& c) { return fetch(c); })
      .def("compress_now",
           [](AnchorKVCache& c) {
             py::gil_scoped_release release;
             c.compress_now();
           })
      .def_property_readonly("is_compressed", &AnchorKVCache::is_compressed)
      .def_property_readonly("offset", &AnchorKVCache::offset)
      .def_property_readonly("anchorkv_bytes", &AnchorKVCache::anchorkv_bytes)
      .def_property_readonly("full_seq_bytes", &AnchorKVCache::full_seq_bytes)
      .def_property_readonly("compression_ratio", &AnchorKVCache::compression_ratio)
      .def_property_readonly("tokens_kept", &AnchorKVCache::tokens_kept)
      .def_property_readonly("tokens_total", &AnchorKVCache::tokens_total)
      .def_property_readonly("n_anchor_total", &AnchorKVCache::n_anchor_total)
      .def_property_readonly("n_residual_total", &AnchorKVCache::n_residual_total);

  py::class_<FullKVCache, KVCache>(m, "FullKVCache")
      .def(py::init<>())
      .def(
          "update_and_fetch",
          [](FullKVCache& c, const py::handle& k, const py::handle& v, const py::handle& q) {
            return update(c, k, v, q, "anchorkv::FullKVCache::update_and_fetch");
          },
          py::arg("keys"), py::arg("values"), py::arg("queries") = py::none())
      .def("fetch", [](const FullKVCache& c) { return fetch(c); })
      .def("trim", &FullKVCache::trim)
      .def_property_readonly("offset", &FullKVCache::offset)
      .def_property_readonly("nbytes", &FullKVCache::nbytes)
      .def_property_readonly("full_seq_bytes", &FullKVCache::full_seq_bytes)
      .def_property_readonly("compression_ratio", &FullKVCache::compression_ratio)
      .def_property_readonly("tokens_kept", &FullKVCache::tokens_kept)
      .def_property_readonly("tokens_total", &FullKVCache::tokens_total);

  py::class_<QuantizedKVCache, KVCache> q(m, "QuantizedKVCache");
  q.def(py::init<int, int64_t>(), py::arg("bits") = 4, py::arg("group_size") = 64);
  bind_common(q, "anchorkv::QuantizedKVCache::update_and_fetch");
  py::class_<StreamingLLMCache, KVCache> sl(m, "StreamingLLMCache");
  sl.def(py::init<double, int64_t>(), py::arg("theta") = 0.05, py::arg("sinks") = 4);
  bind_common(sl, "anchorkv::StreamingLLMCache::update_and_fetch");
  py::class_<SnapKVCache, KVCache> sn(m, "SnapKVCache");
  sn.def(py::init<double, int64_t, int64_t>(), py::arg("theta") = 0.05, py::arg("window") = 32,
         py::arg("kernel") = 7);
  bind_common(sn, "anchorkv::SnapKVCache::update_and_fetch");
  py::class_<KIVICache, KVCache> kv(m, "KIVICache");
  kv.def(py::init<int, int64_t, int64_t>(), py::arg("bits") = 2, py::arg("group") = 32,
         py::arg("residual") = 32);
  bind_common(kv, "anchorkv::KIVICache::update_and_fetch");
  py::class_<TurboQuantCache, KVCache> tq(m, "TurboQuantCache");
  tq.def(py::init<double, double, uint64_t>(), py::arg("key_bits") = 4.0, py::arg("value_bits") = 4.0,
         py::arg("seed") = uint64_t{0x7475726271ULL});
  bind_common(tq, "anchorkv::TurboQuantCache::update_and_fetch");
  py::class_<H2OCache, KVCache> h2o(m, "H2OCache");
  h2o.def(py::init<double, double>(), py::arg("theta") = 0.05, py::arg("recent_share") = 0.5);
  bind_common(h2o, "anchorkv::H2OCache::update_and_fetch");
}
