// loom's HOST EMULATION of CANN — NOT the vendor library.
// Element types: sizes, fp16/bf16 conversions (round to nearest even), load/store as double.
// Built into libascendcl.so (aclDataTypeSize, aclFloat16ToFloat live there in ACL too); the other
// emulation libraries link it.
#include "internal.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace loomemu {

/// Bytes per element (0 = unsupported). 
std::size_t dtype_size(aclDataType dt) {
  switch (dt) {
    case ACL_FLOAT: case ACL_INT32: case ACL_UINT32: return 4;
    case ACL_FLOAT16: case ACL_BF16: case ACL_INT16: case ACL_UINT16: return 2;
    case ACL_INT8: case ACL_UINT8: case ACL_BOOL: return 1;
    case ACL_INT64: case ACL_UINT64: case ACL_DOUBLE: case ACL_COMPLEX64: return 8;
    case ACL_COMPLEX128: return 16;
    default: return 0;
  }
}

// --- element conversions -------------------------------------------------------------------------------
namespace {

uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                          // round to nearest even
  return uint16_t(u >> 16);
}

float bf16_to_float(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u));
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 rounds to infinity
  if (a < 0x38800000u) {                                  // below 2^-14: subnormal half
    float af;
    std::memcpy(&af, &a, 4);
    return uint16_t(sign | uint32_t(std::nearbyint(af * 16777216.0f)));  // units of 2^-24, to even
  }
  const uint32_t mant = a & 0x7fffffu;
  uint32_t h = ((((a >> 23) - 127 + 15)) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return uint16_t(sign | h);
}

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = std::ldexp(float(mant), -24);
    return sign ? -v : v;
  }
  const uint32_t bits = exp == 31 ? (sign | 0x7f800000u | (mant << 13)) : (sign | ((exp - 15 + 127) << 23) | (mant << 13));
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

template <class T>
T read(const void* base, int64_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(base) + i * int64_t(sizeof(T)), sizeof(T));
  return v;
}
template <class T>
void write(void* base, int64_t i, T v) {
  std::memcpy(static_cast<char*>(base) + i * int64_t(sizeof(T)), &v, sizeof(T));
}

}  // namespace

// dtype_size: runtime.cpp (libascendcl, which exports aclDataTypeSize)

bool is_float_type(aclDataType dt) { return dt == ACL_FLOAT || dt == ACL_FLOAT16 || dt == ACL_BF16 || dt == ACL_DOUBLE; }

const char* dtype_name(aclDataType dt) {
  switch (dt) {
    case ACL_FLOAT: return "FLOAT";
    case ACL_FLOAT16: return "FLOAT16";
    case ACL_BF16: return "BFLOAT16";
    case ACL_DOUBLE: return "DOUBLE";
    case ACL_INT8: return "INT8";
    case ACL_UINT8: return "UINT8";
    case ACL_INT16: return "INT16";
    case ACL_INT32: return "INT32";
    case ACL_INT64: return "INT64";
    case ACL_BOOL: return "BOOL";
    default: return "UNSUPPORTED";
  }
}

double load(aclDataType dt, const void* base, int64_t i) {
  switch (dt) {
    case ACL_FLOAT: return read<float>(base, i);
    case ACL_FLOAT16: return half_to_float(read<uint16_t>(base, i));
    case ACL_BF16: return bf16_to_float(read<uint16_t>(base, i));
    case ACL_DOUBLE: return read<double>(base, i);
    case ACL_INT8: return read<int8_t>(base, i);
    case ACL_UINT8: return read<uint8_t>(base, i);
    case ACL_INT16: return read<int16_t>(base, i);
    case ACL_INT32: return read<int32_t>(base, i);
    case ACL_INT64: return double(read<int64_t>(base, i));
    case ACL_BOOL: return read<uint8_t>(base, i) ? 1.0 : 0.0;
    default: throw task_error{ACL_ERROR_RT_DRV_INTERNAL_ERROR, "load: dtype not emulated"};
  }
}

void store(aclDataType dt, void* base, int64_t i, double v) {
  switch (dt) {
    case ACL_FLOAT: write<float>(base, i, float(v)); break;
    case ACL_FLOAT16: write<uint16_t>(base, i, float_to_half(float(v))); break;
    case ACL_BF16: write<uint16_t>(base, i, float_to_bf16(float(v))); break;
    case ACL_DOUBLE: write<double>(base, i, v); break;
    case ACL_INT8: write<int8_t>(base, i, int8_t(v)); break;
    case ACL_UINT8: write<uint8_t>(base, i, uint8_t(v)); break;
    case ACL_INT16: write<int16_t>(base, i, int16_t(v)); break;
    case ACL_INT32: write<int32_t>(base, i, int32_t(v)); break;
    case ACL_INT64: write<int64_t>(base, i, int64_t(v)); break;
    case ACL_BOOL: write<uint8_t>(base, i, v != 0 ? 1 : 0); break;
    default: throw task_error{ACL_ERROR_RT_DRV_INTERNAL_ERROR, "store: dtype not emulated"};
  }
}

}  // namespace loomemu
