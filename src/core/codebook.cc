#include "core/codebook.h"

#include <array>

namespace anchorkv::core {
namespace {
constexpr std::array<float, 2> kBits1 = {-0.7978846f, 0.7978846f};
constexpr std::array<float, 4> kBits2 = {-1.5104176f, -0.4527800f, 0.4527800f, 1.5104176f};
constexpr std::array<float, 8> kBits3 = {-2.1519457f, -1.3439093f, -0.7560053f, -0.2450942f,
                                         0.2450942f,  0.7560053f,  1.3439093f,  2.1519457f};
constexpr std::array<float, 16> kBits4 = {
    -2.7325896f, -2.0690172f, -1.6180464f, -1.2562312f, -0.9423405f, -0.6567591f,
    -0.3880483f, -0.1283950f, 0.1283950f,  0.3880483f,  0.6567591f,  0.9423405f,
    1.2562312f,  1.6180464f,  2.0690172f,  2.7325896f};
}  // namespace

std::span<const float> gaussian_codebook(int bits) {
  switch (bits) {
    case 1: return kBits1;
    case 2: return kBits2;
    case 3: return kBits3;
    case 4: return kBits4;
    default: return {};
  }
}

}  // namespace anchorkv::core
