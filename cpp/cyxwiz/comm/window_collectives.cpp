#include "cyxwiz/comm/window_collectives.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "cyxwiz/comm/reduce.h"
#include "cyxwiz/common/error.h"

namespace cyxwiz::comm {

void WindowCollectives::allReduce(void* data, size_t count, DType dtype, ReduceOp op) {
  const size_t esz = itemSize(dtype), bytes = count * esz;
  auto* d = static_cast<uint8_t*>(data);
  if (bytes <= std::min(kSmallBytes, w_.halfBytes()) || count < static_cast<size_t>(w_.size())) {
    return allReduceSmall(d, count, dtype, op);
  }
  // One window of a shared buffer takes three rounds where copying it takes two: only larger ones
  // read in place (at 4 ranks on 2 cores, 64 KiB took 54 us in place against 46 us copied).
  if (call_.buffer != 0 && bytes > w_.halfBytes()) return allReduceShared(d, count, dtype, op);
  const size_t chunk = w_.halfBytes() / esz;
  for (size_t at = 0; at < count; at += chunk) allReduceChunk(d + at * esz, std::min(chunk, count - at), dtype, op);
}

void WindowCollectives::allReduceSmall(uint8_t* d, size_t count, DType dtype, ReduceOp op) {
  const size_t bytes = count * itemSize(dtype);
  if (bytes > w_.halfBytes()) {  // fewer elements than ranks, but huge ones: cannot happen with our dtypes
    throw BackendError(makeString("[rank ", w_.rank(w_.me()), "] ", call_.describe(), ": ", bytes,
                                  " bytes do not fit a half of the window"));
  }
  const int h = w_.nextHalf();
  std::memcpy(w_.writable(h, d), d, bytes);
  w_.arrive();
  // Rank order on every rank: every rank ends with the same bits.
  std::array<const void*, kMaxSources> halves{};
  for (int r = 0; r < w_.size() && r < static_cast<int>(kMaxSources); ++r) halves[r] = w_.half(r, h);
  if (reduceSources(d, halves.data(), w_.size(), count, dtype, op)) return w_.doneReading(h);
  std::memcpy(d, w_.half(0, h), bytes);
  for (int r = 1; r < w_.size(); ++r) reduceInto(d, w_.half(r, h), count, dtype, op);
  w_.doneReading(h);
  if (op == ReduceOp::Avg) finishAverage(d, count, dtype, w_.size());
}

void WindowCollectives::allReduceShared(uint8_t* d, size_t count, DType dtype, ReduceOp op) {
  allReduceSharedWith(d, count, itemSize(dtype), [&](const std::vector<const uint8_t*>& of, uint8_t* to, size_t first,
                                                     size_t last) { reduceShared(of, to, first, last, dtype, op); });
}

void WindowCollectives::allReduceSharedWith(uint8_t* d, size_t count, size_t esz, const PartReducer& reducePart) {
  const int n = w_.size(), me = w_.me();
  const std::vector<const uint8_t*> of = sharedBuffers();
  // Windows as allReduceChunk's chunks, parts within them as its parts: the same bits. Window k's
  // reduced parts are copied in the round that reduces window k+1, while they are still in cache.
  // A round writes our part of one window and the others' parts of the one before, and reads the
  // others' buffers only where they do not write in that round.
  const size_t window = w_.halfBytes() / esz;
  const size_t windows = (count + window - 1) / window;
  auto part = [&](size_t k, int r) { return (k * window + partBegin(std::min(window, count - k * window), n, r)) * esz; };
  w_.arrive();  // every member's buffer holds its input
  for (size_t k = 0; k <= windows; ++k) {
    if (k < windows) reducePart(of, d, part(k, me), part(k, me + 1));
    if (k > 0) {
      for (int r = 0; r < n; ++r) {
        if (r != me) std::memcpy(d + part(k - 1, r), of[static_cast<size_t>(r)] + part(k - 1, r), part(k - 1, r + 1) - part(k - 1, r));
      }
    }
    w_.arrive();  // the last also keeps every member from changing its buffer while a peer copies from it
  }
}

std::vector<const uint8_t*> WindowCollectives::sharedBuffers() const {
  std::vector<const uint8_t*> of(static_cast<size_t>(w_.size()));
  for (int r = 0; r < w_.size(); ++r) {
    of[static_cast<size_t>(r)] = w_.shared(r, call_.buffer);
    if (of[static_cast<size_t>(r)] == nullptr) {
      throw BackendError(makeString("[rank ", w_.rank(w_.me()), "] ", call_.describe(), ": shared buffer ", call_.buffer,
                                    " is not mapped here"));
    }
  }
  return of;
}

void WindowCollectives::reduceShared(const std::vector<const uint8_t*>& of, uint8_t* d, size_t first, size_t last,
                                     DType dtype, ReduceOp op) {
  const size_t esz = itemSize(dtype);
  reduceSharedInto(of, d, first / esz, last / esz, dtype, op, [&](size_t from, size_t to, const float* piece) {
    std::memcpy(d + from * esz, piece, (to - from) * esz);
  });
}

void WindowCollectives::reduceSharedInto(const std::vector<const uint8_t*>& of, const void* near, size_t first,
                                         size_t last, DType dtype, ReduceOp op, const StepConsumer& consume) {
  // In rank order, a cache-sized piece at a time through a buffer placed half a page away from `near`
  // (see Group::place).
  constexpr size_t kPiece = 64 * 1024;
  const size_t esz = itemSize(dtype), step = kPiece / esz;
  thread_local std::vector<uint8_t> space(kPiece + 8192);
  uint8_t* tmp =
      space.data() + (reinterpret_cast<uintptr_t>(near) + 2048 - reinterpret_cast<uintptr_t>(space.data())) % 4096;
  std::array<const void*, kMaxSources> from{};
  for (size_t at = first; at < last; at += step) {
    const size_t k = std::min(step, last - at);
    for (size_t r = 0; r < of.size() && r < kMaxSources; ++r) from[r] = of[r] + at * esz;
    if (!reduceSources(tmp, from.data(), of.size(), k, dtype, op)) {
      std::memcpy(tmp, of[0] + at * esz, k * esz);
      for (size_t r = 1; r < of.size(); ++r) reduceInto(tmp, of[r] + at * esz, k, dtype, op);
      if (op == ReduceOp::Avg) finishAverage(tmp, k, dtype, static_cast<int>(of.size()));
    }
    consume(at, at + k, reinterpret_cast<const float*>(tmp));
  }
}

void WindowCollectives::reduceForStep(const float* data, size_t count, ReduceOp op, bool partial, DType wire,
                                      float scale, const StepConsumer& consume) {
  if (call_.buffer == 0 || count * sizeof(float) <= w_.halfBytes()) {
    return Collectives::reduceForStep(data, count, op, partial, wire, scale, consume);
  }
  const int n = w_.size(), me = w_.me();
  const std::vector<const uint8_t*> of = sharedBuffers();
  const size_t first = partial ? partBegin(count, n, me) : 0, last = partial ? partBegin(count, n, me + 1) : count;
  w_.arrive();  // every member's buffer holds its input
  if (wire == DType::Float32) {
    reduceSharedInto(of, data, first, last, DType::Float32, op, consume);
  } else if (partial) {
    reduceSharedRoundedInto(of, data, first, last, wire, scale, op, consume);
  } else {
    // The plain 16-bit step. Rounding is compute-bound, so each member rounds only its own part, in place
    // (the rounded all-reduce's bits and place), and then reads the others' parts where they lie.
    const size_t mine = partBegin(count, n, me), next = partBegin(count, n, me + 1);
    reduceSharedRoundedInto(of, data, mine, next, wire, scale, op, consume, const_cast<float*>(data));
    w_.arrive();  // every member's part is rounded in its buffer
    constexpr size_t step = 64 * 1024 / sizeof(float);
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      const auto* theirs = reinterpret_cast<const float*>(of[static_cast<size_t>(r)]);
      for (size_t at = partBegin(count, n, r), end = partBegin(count, n, r + 1); at < end; at += step) {
        consume(at, std::min(end, at + step), theirs + at);
      }
    }
  }
  w_.arrive();  // no member changes its buffer while a peer still reads it
}

namespace {

// k floats from byte `at` of every buffer in `of`, reduced as the 16-bit exchange rounds, into out (which
// may be one of the sources only at two members).
void reducePieceRounded(float* out, const std::vector<const uint8_t*>& of, size_t at, size_t k, DType wire, float scale,
                        ReduceOp op, float* acc) {
  auto source = [&](size_t r) { return reinterpret_cast<const float*>(of[r] + at); };
  if (of.size() == 2 && reduceTwoRounded(out, source(0), source(1), k, wire, scale, op == ReduceOp::Avg)) return;
  roundScaled(acc, source(0), k, wire, scale);
  for (size_t r = 1; r < of.size(); ++r) sumRounded(acc, source(r), k, wire, scale);
  if (op == ReduceOp::Avg) finishAverageRounded(acc, k, wire, static_cast<int>(of.size()));
  if (out != acc) std::memcpy(out, acc, k * sizeof(float));
}

}  // namespace

void WindowCollectives::reduceSharedRounded(const std::vector<const uint8_t*>& of, uint8_t* d, size_t first,
                                             size_t last, DType wire, float scale, ReduceOp op) {
  constexpr size_t kPiece = 64 * 1024;  // as reduceShared, and placed as it places its buffer
  thread_local std::vector<uint8_t> space(kPiece + 8192);
  uint8_t* tmp = space.data() + (reinterpret_cast<uintptr_t>(d) + 2048 - reinterpret_cast<uintptr_t>(space.data())) % 4096;
  for (size_t at = first; at < last; at += kPiece) {
    const size_t len = std::min(kPiece, last - at);
    reducePieceRounded(reinterpret_cast<float*>(d + at), of, at, len / sizeof(float), wire, scale, op,
                       reinterpret_cast<float*>(tmp));
  }
}

void WindowCollectives::reduceSharedRoundedInto(const std::vector<const uint8_t*>& of, const void* near, size_t first,
                                                size_t last, DType wire, float scale, ReduceOp op,
                                                const StepConsumer& consume, float* into) {
  constexpr size_t kPiece = 64 * 1024, step = kPiece / sizeof(float);  // as reduceSharedInto
  thread_local std::vector<uint8_t> space(kPiece + 8192);
  auto* tmp = reinterpret_cast<float*>(
      space.data() + (reinterpret_cast<uintptr_t>(near) + 2048 - reinterpret_cast<uintptr_t>(space.data())) % 4096);
  for (size_t at = first; at < last; at += step) {
    const size_t k = std::min(step, last - at);
    float* piece = into ? into + at : tmp;
    reducePieceRounded(piece, of, at * sizeof(float), k, wire, scale, op, tmp);
    consume(at, at + k, piece);
  }
}

void WindowCollectives::allReduceRounded(float* data, size_t count, DType wire, float scale, ReduceOp op,
                                         bool partial) {
  auto* d = reinterpret_cast<uint8_t*>(data);
  const size_t esz = sizeof(float);
  if (call_.buffer == 0 || count * esz <= w_.halfBytes()) {
    return Collectives::allReduceRounded(data, count, wire, scale, op, partial);
  }
  auto reducePart = [&](const std::vector<const uint8_t*>& of, uint8_t* to, size_t first, size_t last) {
    reduceSharedRounded(of, to, first, last, wire, scale, op);
  };
  if (!partial) return allReduceSharedWith(d, count, esz, reducePart);
  // reduceScatterInPlace's shared rounds: our part from every member's buffer, in rank order.
  const int n = w_.size(), me = w_.me();
  const std::vector<const uint8_t*> of = sharedBuffers();
  w_.arrive();  // every member's buffer holds its input
  reducePart(of, d, partBegin(count, n, me) * esz, partBegin(count, n, me + 1) * esz);
  w_.arrive();  // no member changes its buffer while a peer still reads it
}

void WindowCollectives::allReduceChunk(uint8_t* d, size_t count, DType dtype, ReduceOp op) {
  const size_t esz = itemSize(dtype);
  const int n = w_.size(), me = w_.me();
  auto at = [&](int r) { return partBegin(count, n, r) * esz; };
  auto len = [&](int r) { return at(r + 1) - at(r); };
  const int in = w_.nextHalf(), out = w_.nextHalf();
  // The peers' parts only: each rank reads its own part of the others' copies, and ours from d.
  uint8_t* copy = w_.writable(in, d);
  for (int r = 0; r < n; ++r) {
    if (r != me) std::memcpy(copy + at(r), d + at(r), len(r));
  }
  w_.arrive();
  // Our part, reduced in rank order into our other half, where the peers will copy it from.
  auto part = [&](int r) -> const uint8_t* { return (r == me ? d : w_.half(r, in)) + at(me); };
  uint8_t* mine = w_.writable(out, d) + at(me);
  std::array<const void*, kMaxSources> parts{};
  for (int r = 0; r < n && r < static_cast<int>(kMaxSources); ++r) parts[r] = part(r);
  if (!reduceSources(mine, parts.data(), n, len(me) / esz, dtype, op)) {
    std::memcpy(mine, part(0), len(me));
    for (int r = 1; r < n; ++r) reduceInto(mine, part(r), len(me) / esz, dtype, op);
    if (op == ReduceOp::Avg) finishAverage(mine, len(me) / esz, dtype, n);
  }
  std::memcpy(d + at(me), mine, len(me));
  w_.doneReading(in);
  w_.arrive();
  for (int r = 0; r < n; ++r) {
    if (r != me) std::memcpy(d + at(r), w_.half(r, out) + at(r), len(r));
  }
  w_.doneReading(out);
}

void WindowCollectives::broadcast(void* data, size_t bytes, int root) {
  auto* d = static_cast<uint8_t*>(data);
  const int from = w_.memberOf(root);
  size_t at = 0;
  do {  // at least one round, so that an empty broadcast still checks the call
    const size_t len = std::min(w_.halfBytes(), bytes - at);
    const int h = w_.nextHalf();
    if (from == w_.me()) std::memcpy(w_.writable(h, d + at), d + at, len);
    w_.arrive();
    if (from != w_.me()) std::memcpy(d + at, w_.half(from, h), len);
    w_.doneReading(h);
    at += len;
  } while (at < bytes);
}

void WindowCollectives::allGather(const void* in, void* out, size_t bytesPerRank) {
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  size_t at = 0;
  do {
    const size_t len = std::min(w_.halfBytes(), bytesPerRank - at);
    const int h = w_.nextHalf();
    // Placed for the copies out: each peer copies it to its own array where ours goes.
    std::memcpy(w_.writable(h, dst + static_cast<size_t>(w_.rank(w_.me())) * bytesPerRank + at), src + at, len);
    w_.arrive();
    for (int r = 0; r < w_.size(); ++r) std::memcpy(dst + static_cast<size_t>(w_.rank(r)) * bytesPerRank + at, w_.half(r, h), len);
    w_.doneReading(h);
    at += len;
  } while (at < bytesPerRank);
}

void WindowCollectives::reduceScatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) {
  const size_t esz = itemSize(dtype), window = w_.halfBytes() / esz;
  const int n = w_.size(), me = w_.me();
  const size_t first = partBegin(count, n, me), last = partBegin(count, n, me + 1);
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  size_t at = 0;
  do {
    const size_t len = std::min(window, count - at);
    const int h = w_.nextHalf();
    std::memcpy(w_.writable(h, src + at * esz), src + at * esz, len * esz);
    w_.arrive();
    // The part of this window that is ours, reduced in rank order.
    const size_t from = std::max(at, first), to = std::min(at + len, last);
    if (from < to) {
      uint8_t* o = dst + (from - first) * esz;
      std::memcpy(o, w_.half(0, h) + (from - at) * esz, (to - from) * esz);
      for (int r = 1; r < n; ++r) reduceInto(o, w_.half(r, h) + (from - at) * esz, to - from, dtype, op);
    }
    w_.doneReading(h);
    at += len;
  } while (at < count);
  if (op == ReduceOp::Avg) finishAverage(out, last - first, dtype, n);
}

void WindowCollectives::reduceScatterInPlace(void* data, size_t count, DType dtype, ReduceOp op) {
  const size_t esz = itemSize(dtype), window = w_.halfBytes() / esz;
  const int n = w_.size(), me = w_.me();
  const size_t first = partBegin(count, n, me), last = partBegin(count, n, me + 1);
  auto* d = static_cast<uint8_t*>(data);
  if (call_.buffer != 0 && count * esz > w_.halfBytes()) {
    // Our part, read from every member's buffer where it lies, in rank order: all_reduce's bits.
    const std::vector<const uint8_t*> of = sharedBuffers();
    w_.arrive();  // every member's buffer holds its input
    reduceShared(of, d, first * esz, last * esz, dtype, op);
    w_.arrive();  // no member changes its buffer while a peer still reads it
    return;
  }
  size_t at = 0;
  do {
    const size_t len = std::min(window, count - at);
    // Our part's share of this window, [from, to); empty at the window's edge when it lies outside.
    const size_t from = std::min(std::max(at, first), at + len), to = std::max(from, std::min(at + len, last));
    const int h = w_.nextHalf();
    uint8_t* copy = w_.writable(h, d + at * esz);
    std::memcpy(copy, d + at * esz, (from - at) * esz);
    std::memcpy(copy + (to - at) * esz, d + to * esz, (at + len - to) * esz);
    w_.arrive();
    for (int r = 0; r < n; ++r) {
      if (r != me) reduceInto(d + from * esz, w_.half(r, h) + (from - at) * esz, to - from, dtype, op);
    }
    w_.doneReading(h);
    at += len;
  } while (at < count);
  if (op == ReduceOp::Avg) finishAverage(d + first * esz, last - first, dtype, n);
}

void WindowCollectives::allGatherInPlace(void* data, size_t count, DType dtype) {
  const size_t esz = itemSize(dtype);
  const int n = w_.size(), me = w_.me();
  auto* d = static_cast<uint8_t*>(data);
  auto begin = [&](int r) { return partBegin(count, n, r) * esz; };
  if (call_.buffer != 0 && count * esz > w_.halfBytes()) {
    const std::vector<const uint8_t*> of = sharedBuffers();
    w_.arrive();  // every member's part is in place
    for (int r = 0; r < n; ++r) {
      if (r != me) std::memcpy(d + begin(r), of[static_cast<size_t>(r)] + begin(r), begin(r + 1) - begin(r));
    }
    w_.arrive();  // no member changes its part while a peer still copies it
    return;
  }
  const size_t largest = begin(1) - begin(0);
  size_t at = 0;
  do {
    // What of rank r's part this round carries.
    auto piece = [&](int r) {
      const size_t part = begin(r + 1) - begin(r);
      return at < part ? std::min(w_.halfBytes(), part - at) : size_t{0};
    };
    const int h = w_.nextHalf();
    std::memcpy(w_.writable(h, d + begin(me) + at), d + begin(me) + at, piece(me));
    w_.arrive();
    for (int r = 0; r < n; ++r) {
      if (r != me) std::memcpy(d + begin(r) + at, w_.half(r, h), piece(r));
    }
    w_.doneReading(h);
    at += w_.halfBytes();
  } while (at < largest);
}

}  // namespace cyxwiz::comm
