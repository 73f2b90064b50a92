// Host side of the in-kernel trace (trace.cuh): the registry of every translation unit's ring,
// and the extern "C" functions hybridcomm/trace.py calls. In the normal build no ring
// registers, so hc_trace_rings() is 0: that is how the host tells the builds apart.
#include <vector>

#define HC_TRACE_REGISTRY  // this file holds the registry, not a ring of its own
#include "trace.cuh"

namespace {

struct Ring {
  hc_trace_copy_fn copy;
  hc_trace_clear_fn clear;
};

std::vector<Ring>& rings() {
  static std::vector<Ring> r;  // built on first use: registration runs in static initialisers
  return r;
}

}  // namespace

bool hc_trace_register(hc_trace_copy_fn copy, hc_trace_clear_fn clear) {
  rings().push_back(Ring{copy, clear});
  return true;
}

// Rings registered (translation units with kernels, in the trace build; 0 otherwise).
extern "C" int hc_trace_rings() { return (int)rings().size(); }

// sizeof(TraceRing): the host checks its mirror of the layout against it.
extern "C" int hc_trace_ring_bytes() { return (int)sizeof(hc::TraceRing); }

// Copies ring i into dst (hc_trace_ring_bytes() bytes of host memory) on `stream`; the caller
// synchronises. Returns a cudaError_t (0 = success).
extern "C" int hc_trace_copy(int i, void* dst, cudaStream_t stream) {
  if (i < 0 || i >= (int)rings().size()) return (int)cudaErrorInvalidValue;
  return rings()[i].copy(dst, stream);
}

// Zeroes every ring on `stream`.
extern "C" int hc_trace_clear(cudaStream_t stream) {
  for (const Ring& r : rings()) {
    if (int status = r.clear(stream)) return status;
  }
  return 0;
}
