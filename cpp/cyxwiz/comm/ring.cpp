#include "cyxwiz/comm/ring.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "cyxwiz/comm/reduce.h"
#include "cyxwiz/common/error.h"
#include "cyxwiz/common/logging.h"

namespace cyxwiz::comm {

namespace {

platform::IoVec span(const void* p, size_t n) { return {const_cast<void*>(p), n}; }

enum Algorithm { kRecursiveDoubling, kGather, kRing, kAlgorithms };

// CYXWIZ_LOG_LEVEL=debug names the algorithm all_reduce takes, the first time it takes each one
// (not at every call: a training loop makes thousands). Otherwise a load and a level check.
void noteAlgorithm(Algorithm a, size_t count, DType dtype, int ranks) {
  static std::atomic<bool> said[kAlgorithms];
  if (said[a].load(std::memory_order_relaxed) || !logEnabled(LogLevel::Debug) || said[a].exchange(true)) return;
  static const char* const names[kAlgorithms] = {"recursive doubling", "gather", "ring"};
  logDebug(makeString("all_reduce: ", names[a], " for ", count, " ", dtypeName(dtype), " over ", ranks,
                      " ranks (logged at the first use of each algorithm)"));
}

}  // namespace

Ring::Ring(Links& links, std::vector<uint8_t>& scratch, const CallSignature& call, size_t sliceBytes)
    : links_(links), rank_(links.me()), size_(links.size()), scratch_(scratch), call_(call), sliceBytes_(sliceBytes) {
  encodeCall(call_, myHeader_);
}

bool Ring::canDouble() const {
  if (size_ < 4 || (size_ & (size_ - 1)) != 0) return false;
  for (int distance = 2; distance < size_; distance *= 2) {
    if (!links_.linked(rank_ ^ distance)) return false;
  }
  return true;
}

void Ring::checkHeader(int from) {
  CallSignature theirs;
  const int rank = links_.rank(from);
  if (!decodeCall(theirHeader_, &theirs)) {
    throw BackendError(makeString(links_.what(), ": rank ", rank, " sent bytes that are not a collective header: "
                                  "the ranks are out of step (mixed pycyxwiz versions?)"));
  }
  if (theirs != call_) {
    throw BackendError(makeString(links_.what(), ": mismatch with rank ", rank, ", which called ", theirs.describe(),
                                  ": every rank must call the same collectives in the same order, with the same "
                                  "dtype, element count and op"));
  }
}

void Ring::step(std::vector<platform::IoVec> send, std::vector<platform::IoVec> recv, Step&& extra, int from, int to) {
  Step s = std::move(extra);
  if (from < 0) from = mod(rank_ - 1);
  if (to < 0) to = mod(rank_ + 1);
  if (!headerSent_) {
    // Every rank sends one header and receives one in its first step, even without a payload in
    // that direction.
    headerSent_ = true;
    send.insert(send.begin(), span(myHeader_, sizeof myHeader_));
    s.sendHeaderBytes = sizeof myHeader_;
    recv.insert(recv.begin(), span(theirHeader_, sizeof theirHeader_));
    s.recvHeaderBytes = sizeof theirHeader_;
    s.onHeader = [this, from] { checkHeader(from); };
  }
  s.send = std::move(send);
  s.recv = std::move(recv);
  links_.run(s, from, to);
}

void Ring::gatherBlocks(uint8_t* blocks, size_t b) {
  // Step s: pass on the block that arrived in step s-1 (our own first), receive the next one.
  for (int s = 0; s < size_ - 1; ++s) {
    int sendBlock = mod(rank_ - s), recvBlock = mod(rank_ - s - 1);
    step({span(blocks + sendBlock * b, b)}, {span(blocks + recvBlock * b, b)});
  }
}

void Ring::reduceScatterSteps(uint8_t* data, size_t count, DType dtype, ReduceOp op, uint8_t* recvBuf, int steps) {
  const size_t esz = itemSize(dtype);
  for (int s = 0; s < steps; ++s) {
    int sendChunk = mod(rank_ - s - 1), recvChunk = mod(rank_ - s - 2);
    size_t sendAt = partBegin(count, size_, sendChunk) * esz;
    size_t sendLen = partBegin(count, size_, sendChunk + 1) * esz - sendAt;
    size_t recvAt = partBegin(count, size_, recvChunk) * esz;
    size_t recvLen = partBegin(count, size_, recvChunk + 1) * esz - recvAt;
    Step reduce;
    reduce.unit = esz;
    // Reduce each segment as soon as it lands, while the rest is still on the wire.
    reduce.onReceived = [&](size_t begin, size_t end) {
      reduceInto(data + recvAt + begin, recvBuf + begin, (end - begin) / esz, dtype, op);
    };
    step({span(data + sendAt, sendLen)}, {span(recvBuf, recvLen)}, std::move(reduce));
  }
}

void Ring::allReduce(void* data, size_t count, DType dtype, ReduceOp op) {
  if (size_ == 1) return;
  const size_t esz = itemSize(dtype), bytes = count * esz;
  auto* d = static_cast<uint8_t*>(data);
  if (bytes <= kSmallBytes && canDouble()) {
    noteAlgorithm(kRecursiveDoubling, count, dtype, size_);
    return recursiveDoubling(d, count, dtype, op);
  }
  if (bytes * static_cast<size_t>(size_ - 1) <= kSmallBytes || count < static_cast<size_t>(size_)) {
    noteAlgorithm(kGather, count, dtype, size_);
    scratch_.resize(bytes * static_cast<size_t>(size_));
    std::memcpy(scratch_.data() + static_cast<size_t>(rank_) * bytes, d, bytes);
    gatherBlocks(scratch_.data(), bytes);
    // Rank order, the same on every rank: every rank ends with the same bits.
    std::memcpy(d, scratch_.data(), bytes);
    for (int k = 1; k < size_; ++k) reduceInto(d, scratch_.data() + static_cast<size_t>(k) * bytes, count, dtype, op);
    if (op == ReduceOp::Avg) finishAverage(d, count, dtype, size_);
    return;
  }
  noteAlgorithm(kRing, count, dtype, size_);
  // Slices small enough that what a step sends, receives and reduces stays in cache, but each step
  // at least 64 KiB: every slice is a whole ring of 2N-3 steps, each paying the link's latency
  // (docs/scaling.md: 1 MiB slices at 512 ranks would be 2 KiB steps).
  const size_t slice = std::max<size_t>(std::max(sliceBytes_, kMinStepBytes * static_cast<size_t>(size_)) / esz,
                                        static_cast<size_t>(size_));
  scratch_.resize(partBegin(std::min(count, slice), size_, 1) * esz);  // the largest chunk
  for (size_t at = 0; at < count; at += slice) ringAllReduce(d + at * esz, std::min(slice, count - at), dtype, op);
}

void Ring::ringAllReduce(uint8_t* d, size_t count, DType dtype, ReduceOp op) {
  const size_t esz = itemSize(dtype);
  auto at = [&](int chunk) { return partBegin(count, size_, mod(chunk)) * esz; };
  auto len = [&](int chunk) { return partBegin(count, size_, mod(chunk) + 1) * esz - at(chunk); };
  reduceScatterSteps(d, count, dtype, op, scratch_.data(), size_ - 2);

  // The last reduce-scatter step and the first all-gather step run as one: each segment of our own
  // chunk goes back out to the right as soon as it is reduced, instead of after the whole chunk.
  const int sendFirst = rank_ + 1, mine = rank_, recvLast = rank_ - 1;
  const size_t mineAt = at(mine), mineLen = len(mine), firstLen = len(sendFirst);
  uint8_t* recvBuf = scratch_.data();
  Step merged;
  merged.unit = esz;
  merged.grain = 64 * 1024;
  merged.onReceived = [&](size_t begin, size_t end) {
    end = std::min(end, mineLen);
    if (begin >= end) return;
    reduceInto(d + mineAt + begin, recvBuf + begin, (end - begin) / esz, dtype, op);
    if (op == ReduceOp::Avg) finishAverage(d + mineAt + begin, (end - begin) / esz, dtype, size_);
  };
  merged.sendAvailable = [&](size_t handedOn) { return firstLen + std::min(handedOn, mineLen); };
  merged.flushAt = mineLen;  // the chunk's last segment must go out even if it is shorter than a grain
  step({span(d + at(sendFirst), firstLen), span(d + mineAt, mineLen)},
       {span(recvBuf, mineLen), span(d + at(recvLast), len(recvLast))}, std::move(merged));

  // The rest of the all-gather: pass on the chunk that arrived last, receive the next in place.
  allGatherSteps(d, count, esz, 1);
}

void Ring::allGatherSteps(uint8_t* d, size_t count, size_t esz, int first) {
  auto at = [&](int chunk) { return partBegin(count, size_, mod(chunk)) * esz; };
  auto len = [&](int chunk) { return partBegin(count, size_, mod(chunk) + 1) * esz - at(chunk); };
  for (int s = first; s < size_ - 1; ++s) {
    int sendChunk = rank_ - s, recvChunk = rank_ - s - 1;
    step({span(d + at(sendChunk), len(sendChunk))}, {span(d + at(recvChunk), len(recvChunk))});
  }
}

void Ring::reduceScatterInPlace(void* data, size_t count, DType dtype, ReduceOp op) {
  if (size_ == 1) return;
  const size_t esz = itemSize(dtype);
  auto* d = static_cast<uint8_t*>(data);
  scratch_.resize(partBegin(count, size_, 1) * esz);  // the largest chunk
  reduceScatterSteps(d, count, dtype, op, scratch_.data(), size_ - 1);
  if (op == ReduceOp::Avg) {
    const size_t mine = partBegin(count, size_, rank_);
    finishAverage(d + mine * esz, partBegin(count, size_, rank_ + 1) - mine, dtype, size_);
  }
}

void Ring::allGatherInPlace(void* data, size_t count, DType dtype) {
  if (size_ > 1) allGatherSteps(static_cast<uint8_t*>(data), count, itemSize(dtype), 0);
}

void Ring::broadcast(void* data, size_t bytes, int root) {
  if (size_ == 1) return;
  // A chain root -> root+1 -> ... -> root-1; middle ranks forward each segment as it arrives. Every
  // link still carries a header (the last rank's goes to the root), so every rank checks a call.
  int pos = mod(rank_ - root);
  std::vector<platform::IoVec> send, recv;
  if (pos < size_ - 1) send.push_back(span(data, bytes));
  if (pos > 0) recv.push_back(span(data, bytes));
  Step relay;
  relay.relay = pos > 0 && pos < size_ - 1;
  step(std::move(send), std::move(recv), std::move(relay));
  // One more pass round the ring: no rank returns before every rank has its copy, so a rank that
  // raised (on a mismatch) is noticed by all of them.
  scratch_.assign(static_cast<size_t>(size_), 1);
  gatherBlocks(scratch_.data(), 1);
}

void Ring::recursiveDoubling(uint8_t* d, size_t count, DType dtype, ReduceOp op) {
  const size_t bytes = count * itemSize(dtype);
  scratch_.resize(2 * bytes);
  uint8_t* theirs = scratch_.data();
  uint8_t* combined = scratch_.data() + bytes;
  for (int distance = 1; distance < size_; distance *= 2) {
    const int partner = rank_ ^ distance;
    step({span(d, bytes)}, {span(theirs, bytes)}, Step(), partner, partner);
    const uint8_t* low = rank_ < partner ? d : theirs;
    const uint8_t* high = rank_ < partner ? theirs : d;
    std::memcpy(combined, low, bytes);
    reduceInto(combined, high, count, dtype, op);
    std::memcpy(d, combined, bytes);
  }
  if (op == ReduceOp::Avg) finishAverage(d, count, dtype, size_);
}

void Ring::allGather(const void* in, void* out, size_t bytesPerRank) {
  auto* o = static_cast<uint8_t*>(out);
  std::memcpy(o + static_cast<size_t>(rank_) * bytesPerRank, in, bytesPerRank);
  if (size_ == 1) return;
  gatherBlocks(o, bytesPerRank);
}

void Ring::reduceScatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) {
  const size_t esz = itemSize(dtype);
  size_t mine = partBegin(count, size_, rank_), mineLen = partBegin(count, size_, rank_ + 1) - mine;
  if (size_ > 1) {
    size_t work = count * esz, recv = partBegin(count, size_, 1) * esz;
    scratch_.resize(work + recv);
    std::memcpy(scratch_.data(), in, work);  // the caller's input stays as it was
    reduceScatterSteps(scratch_.data(), count, dtype, op, scratch_.data() + work, size_ - 1);
    in = scratch_.data();
  }
  std::memcpy(out, static_cast<const uint8_t*>(in) + mine * esz, mineLen * esz);
  if (op == ReduceOp::Avg) finishAverage(out, mineLen, dtype, size_);
}

void Ring::barrier() {
  // Gathering one byte from every rank: nobody leaves before everybody has arrived.
  if (size_ == 1) return;
  scratch_.assign(static_cast<size_t>(size_), 1);
  gatherBlocks(scratch_.data(), 1);
}

void Ring::checkCalls() {
  if (size_ > 1) step({}, {});
}

}  // namespace cyxwiz::comm
