// Allocation helpers for large numeric buffers.
//
// DefaultInitAllocator makes std::vector<T>::resize leave trivially
// constructible elements uninitialised: buffers that are fully written next
// are not zero-filled first (on virtual machines the first touch of fresh
// pages dominates large copies, so touching them twice is expensive).
//
// AlignedAllocator puts a vector's storage on cache-line boundaries (C++17
// aligned new): kernels that stream 64-byte vectors from a buffer would
// otherwise split every load across two lines where malloc hands out 16-byte
// alignment.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace anchorkv::core {

template <class T>
struct DefaultInitAllocator : std::allocator<T> {
  using std::allocator<T>::allocator;
  template <class U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

// A vector whose resize() does not zero-fill.
template <class T>
using UninitVector = std::vector<T, DefaultInitAllocator<T>>;

template <class T, std::size_t kAlign = 64>
struct AlignedAllocator {
  using value_type = T;
  template <class U>
  struct rebind {
    using other = AlignedAllocator<U, kAlign>;
  };
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U, kAlign>&) {}  // NOLINT: converting, as std::allocator's
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{kAlign})); }
  void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t{kAlign}); }
  template <class U>
  bool operator==(const AlignedAllocator<U, kAlign>&) const { return true; }
};

// A vector whose data() is 64-byte aligned.
template <class T>
using AlignedVector = std::vector<T, AlignedAllocator<T>>;

// The bytes the elements of some vectors take (what a workspace reports).
template <class... Vectors>
int64_t bytes_held(const Vectors&... v) {
  return static_cast<int64_t>((std::size_t{0} + ... + (v.size() * sizeof(typename Vectors::value_type))));
}

}  // namespace anchorkv::core
