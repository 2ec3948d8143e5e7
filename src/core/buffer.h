// Allocation helpers for large numeric buffers.
//
// DefaultInitAllocator makes std::vector<T>::resize leave trivially
// constructible elements uninitialised: buffers that are fully written next
// are not zero-filled first (on virtual machines the first touch of fresh
// pages dominates large copies, so touching them twice is expensive).
#pragma once

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

}  // namespace anchorkv::core
