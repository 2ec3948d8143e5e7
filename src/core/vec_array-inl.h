// A fixed number of Highway vectors, indexed by number: the kernels' register
// blocks (accumulators of several rows and columns, lookup tables held across
// a loop). Per-target "-inl.h" header: include it after "hwy/highway.h" in a
// file compiled through hwy/foreach_target.h.
//
// Why not a plain array: SVE's vectors have no size at compile time, and the
// language forbids arrays and class members of sizeless types. On every
// fixed-width target (x86, NEON, the scalar target) VecArray is that plain
// array, so the code and its bits are what they were; on the SVE targets the
// vectors live in a lane buffer on the stack (a store and a load per access).
#if defined(ANCHORKV_CORE_VEC_ARRAY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ANCHORKV_CORE_VEC_ARRAY_INL_H_
#undef ANCHORKV_CORE_VEC_ARRAY_INL_H_
#else
#define ANCHORKV_CORE_VEC_ARRAY_INL_H_
#endif

#include <cstddef>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace anchorkv::core {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class D, int N>
class VecArray {
 public:
  using V = hn::Vec<D>;
  // Written, not implicit: GCC does not give an implicit constructor the
  // target attributes of the code around it, and then refuses to inline the
  // NEON vectors' constructors into it ("target specific option mismatch").
  HWY_INLINE VecArray() {}
#if HWY_HAVE_SCALABLE
  HWY_INLINE V get(int i) const { return hn::Load(D(), lanes_ + i * kMaxLanes); }
  HWY_INLINE void set(int i, V v) { hn::Store(v, D(), lanes_ + i * kMaxLanes); }

 private:
  static constexpr size_t kMaxLanes = hn::MaxLanes(D());
  HWY_ALIGN hn::TFromD<D> lanes_[N * kMaxLanes];
#else
  HWY_INLINE V get(int i) const { return v_[i]; }
  HWY_INLINE void set(int i, V v) { v_[i] = v; }

 private:
  V v_[N];
#endif
};

}  // namespace HWY_NAMESPACE
}  // namespace anchorkv::core
HWY_AFTER_NAMESPACE();

#endif  // ANCHORKV_CORE_VEC_ARRAY_INL_H_
