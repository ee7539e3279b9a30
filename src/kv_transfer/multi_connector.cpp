#include "kv_transfer/multi_connector.h"

#include <algorithm>

#include "base/check.h"

namespace pagoda {

MultiScheduler::MultiScheduler(std::vector<std::unique_ptr<KvConnectorScheduler>> parts) : parts_(std::move(parts)) {}

int64_t MultiScheduler::get_num_new_matched_tokens(const KvRequest& request, int64_t num_local_computed) {
  // The part that has the most of the request's tokens (a prefill instance's whole prompt rather
  // than a tier's first blocks of it); the first of equals.
  chosen_.erase(request.id);
  int64_t best = 0;
  for (size_t i = 0; i < parts_.size(); ++i) {
    const int64_t n = parts_[i]->get_num_new_matched_tokens(request, num_local_computed);
    if (n > best) {
      best = n;
      chosen_[request.id] = i;
    }
  }
  return best;
}

void MultiScheduler::update_state_after_alloc(const KvRequest& request, std::span<const BlockId> blocks,
                                              int64_t num_local_computed, int64_t num_external) {
  const auto it = chosen_.find(request.id);
  for (size_t i = 0; i < parts_.size(); ++i) {
    const bool loads = it != chosen_.end() && it->second == i;
    parts_[i]->update_state_after_alloc(request, blocks, num_local_computed, loads ? num_external : 0);
  }
  if (it != chosen_.end() && num_external <= 0) chosen_.erase(it);
}

void MultiScheduler::on_scheduled(const KvRequest& request, int64_t num_computed_after, std::span<const BlockId> blocks) {
  for (auto& p : parts_) p->on_scheduled(request, num_computed_after, blocks);
}

KvConnectorMetadata MultiScheduler::build_meta() {
  last_.clear();
  KvConnectorMetadata meta;
  for (auto& p : parts_) {
    last_.push_back(p->build_meta());
    const KvConnectorMetadata& m = last_.back();
    meta.loads.insert(meta.loads.end(), m.loads.begin(), m.loads.end());
    meta.awaiting.insert(meta.awaiting.end(), m.awaiting.begin(), m.awaiting.end());
    meta.stores.insert(meta.stores.end(), m.stores.begin(), m.stores.end());
    meta.disk_removes.insert(meta.disk_removes.end(), m.disk_removes.begin(), m.disk_removes.end());
    meta.recvs.insert(meta.recvs.end(), m.recvs.begin(), m.recvs.end());
    meta.sends.insert(meta.sends.end(), m.sends.begin(), m.sends.end());
  }
  return meta;
}

void MultiScheduler::update_connector_output(const KvConnectorMetadata& meta, const KvConnectorOutput& output,
                                             std::vector<RequestId>& done, std::vector<RequestId>& failed) {
  // meta.awaiting is the parts' lists one after the other (build_meta): each part gets its own
  // slice of the states (or, from a report of the wrong length, a report it refuses as well).
  const bool matches = output.load_states.size() == meta.awaiting.size();
  size_t at = 0;
  for (size_t i = 0; i < parts_.size(); ++i) {
    const KvConnectorMetadata& mine = i < last_.size() ? last_[i] : KvConnectorMetadata{};
    KvConnectorOutput slice;
    // The step's moves once, in the first part's totals (stats() sums the parts).
    if (i == 0) slice.counters = output.counters;
    slice.disk_dropped = output.disk_dropped;
    if (matches) {
      slice.load_states.assign(output.load_states.begin() + static_cast<ptrdiff_t>(at),
                               output.load_states.begin() + static_cast<ptrdiff_t>(at + mine.awaiting.size()));
    }
    at += mine.awaiting.size();
    parts_[i]->update_connector_output(mine, slice, done, failed);
  }
  for (RequestId id : done) chosen_.erase(id);
  for (RequestId id : failed) chosen_.erase(id);
}

void MultiScheduler::request_finished(const KvRequest& request) {
  for (auto& p : parts_) p->request_finished(request);
  chosen_.erase(request.id);
}

KvConnectorStats MultiScheduler::stats() const {
  KvConnectorStats s;
  for (const auto& p : parts_) {
    const KvConnectorStats one = p->stats();
    s.queries += one.queries;
    s.hits += one.hits;
    s.disk_hits += one.disk_hits;
    s.failed_loads += one.failed_loads;
    s.remote_queries += one.remote_queries;
    s.remote_hits += one.remote_hits;
    s.host_blocks += one.host_blocks;
    s.host_capacity += one.host_capacity;
    s.disk_blocks += one.disk_blocks;
    s.disk_capacity += one.disk_capacity;
    s.requests_waiting += one.requests_waiting;
    s.moved += one.moved;
  }
  return s;
}

MultiWorker::MultiWorker(std::vector<std::unique_ptr<KvConnectorWorker>> parts) : parts_(std::move(parts)) {}

Status MultiWorker::register_kv_caches(const KvCacheTensors& kv, const Kernels& kernels) {
  for (auto& p : parts_) PAGODA_RETURN_IF_ERROR(p->register_kv_caches(kv, kernels));
  return Status::ok_status();
}

void MultiWorker::start_step(const KvConnectorMetadata& meta, bool idle) {
  // Loads go to the part that runs them: the tiers' to OffloadingWorker (loads), transfers' to
  // RemoteWorker (recvs). Parts are given in that order by make_kv_connector_worker.
  for (auto it = owner_.begin(); it != owner_.end();) {
    const bool awaited = std::find(meta.awaiting.begin(), meta.awaiting.end(), it->first) != meta.awaiting.end();
    it = awaited ? std::next(it) : owner_.erase(it);
  }
  for (const KvTierLoad& l : meta.loads) owner_[l.request_id] = 0;
  for (const KvRemoteRecv& r : meta.recvs) owner_[r.request_id] = parts_.size() - 1;
  for (auto& p : parts_) p->start_step(meta, idle);
}

KvConnectorOutput MultiWorker::finish_step(const KvConnectorMetadata& meta) {
  std::vector<KvConnectorOutput> outs;
  for (auto& p : parts_) outs.push_back(p->finish_step(meta));
  KvConnectorOutput out;
  for (size_t i = 0; i < meta.awaiting.size(); ++i) {
    const auto it = owner_.find(meta.awaiting[i]);
    const KvConnectorOutput* o = it == owner_.end() ? nullptr : &outs[it->second];
    out.load_states.push_back(o != nullptr && i < o->load_states.size() ? o->load_states[i] : KvLoadState::kFailed);
  }
  for (const KvConnectorOutput& o : outs) {
    out.counters += o.counters;
    out.disk_dropped.insert(out.disk_dropped.end(), o.disk_dropped.begin(), o.disk_dropped.end());
  }
  return out;
}

}  // namespace pagoda
