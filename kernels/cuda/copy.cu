// Many device-to-device copies (or zero fills) in one launch: a prefix-cache restore, a
// snapshot or a fork copies one slot of every layer's states, 2 × layers buffers, and a new
// sequence's slot is zeroed in each; one launch replaces a driver call for each (4–10 µs of
// host time apiece on the device host). The ranges travel by value in the launch parameters,
// so nothing is uploaded.
#define MAX_COPIES 64

struct Copies {
  unsigned long long src[MAX_COPIES];  // 0: fill with zeros
  unsigned long long dst[MAX_COPIES];
  unsigned long long words[MAX_COPIES];  // 32-bit words
};

// Grid (blocks a copy, copies): copy blockIdx.y, strided over its blocks' threads, 16 bytes a
// move when both ends are 16-byte aligned (the tail word by word).
extern "C" __global__ void copy_many(const Copies c) {
  const int i = blockIdx.y;
  const unsigned* __restrict__ s = reinterpret_cast<const unsigned*>(c.src[i]);
  unsigned* __restrict__ d = reinterpret_cast<unsigned*>(c.dst[i]);
  const size_t n = c.words[i];
  const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
  size_t done = 0;
  if (c.src[i] == 0) {
    if ((c.dst[i] & 15) == 0) {
      uint4* __restrict__ d4 = reinterpret_cast<uint4*>(d);
      for (size_t k = t; k < n / 4; k += stride) d4[k] = make_uint4(0, 0, 0, 0);
      done = n / 4 * 4;
    }
    for (size_t k = done + t; k < n; k += stride) d[k] = 0;
    return;
  }
  if (((c.src[i] | c.dst[i]) & 15) == 0) {
    const size_t n4 = n / 4;
    const uint4* __restrict__ s4 = reinterpret_cast<const uint4*>(s);
    uint4* __restrict__ d4 = reinterpret_cast<uint4*>(d);
    for (size_t k = t; k < n4; k += stride) d4[k] = s4[k];
    done = n4 * 4;
  }
  for (size_t k = done + t; k < n; k += stride) d[k] = s[k];
}
