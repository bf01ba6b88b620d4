// A non-owning reference to a callable, for calls that finish before the
// callable goes out of scope (ThreadPool::run). Unlike std::function it never
// allocates and holds two pointers, so a parallel region's job reaches the
// worker in the cache line that wakes it instead of through a heap object the
// caller has just written (an empty region on the development VM: 0.83 ->
// 0.41 us, docs/BENCHMARKS.md).
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

namespace tandem {

template <typename Signature>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  FunctionRef() = default;

  template <typename F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef> && std::is_invocable_r_v<R, F&, Args...>)
  FunctionRef(F&& f) noexcept  // NOLINT: implicit, as std::function's
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* o, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }
  explicit operator bool() const { return call_ != nullptr; }

 private:
  void* object_ = nullptr;
  R (*call_)(void*, Args...) = nullptr;
};

}  // namespace tandem
