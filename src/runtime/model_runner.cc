#include "runtime/model_runner.h"

#include <algorithm>
#include <limits>
#include <span>
#include <pthread.h>

#include "core/error.h"
#include "core/startup.h"
#include "runtime/generator.h"
#include "runtime/logits_processor.h"
#include "runtime/speculative.h"
#include "runtime/token_constraint.h"

namespace basalt {
namespace {

Tensor i32_tensor(const std::vector<int32_t>& v) { return Tensor::from_i32({static_cast<int64_t>(v.size())}, v); }

ForwardBatch forward_batch_of(const StepPlan& plan) {
  ForwardBatch fb = host_forward_batch(plan.token_ids, plan.positions, plan.out_slots, plan.q_start, plan.kv_start,
                                       plan.kv_slots, plan.logit_rows);
  fb.mode = plan.mode;
  return fb;
}

// A sequence of a finished step, as the draft passes after sampling read
// it: its tokens [q0, q0 + n) and slots [k0, k1) in the plan, and how many
// of its positions the step kept (a verification keeps its last token and
// the accepted drafts; a prefill chunk all of them). `first` is its sampled
// group's first row when `samples`; `sampled` the token drawn after its
// last kept position (-1 when it does not sample). Sequences whose sampled
// row failed are left out.
struct KeptSequence {
  size_t index = 0;
  int32_t q0 = 0, n = 0, k0 = 0, k1 = 0, kept = 0;
  bool samples = false;
  size_t first = 0;
  int32_t sampled = -1;
};

std::vector<KeptSequence> kept_sequences(const StepPlan& plan, const StepResult& result) {
  std::vector<KeptSequence> out;
  const size_t R = plan.rows.size();
  size_t r = 0;
  for (size_t s = 0; s + 1 < plan.q_start.size(); ++s) {
    KeptSequence k;
    k.index = s;
    k.q0 = plan.q_start[s];
    k.n = plan.q_start[s + 1] - k.q0;
    k.k0 = plan.kv_start[s];
    k.k1 = plan.kv_start[s + 1];
    k.kept = k.n;
    // The sequence's sampled rows (one group) are those whose logits row
    // lies in its tokens; rows come in sequence order.
    k.first = r;
    while (r < R && plan.logit_rows[r] < k.q0 + k.n) ++r;
    k.samples = r > k.first;
    if (k.samples) {
      if (!result.row_errors.empty() && !result.row_errors[k.first].empty()) continue;
      const auto drafts = static_cast<int32_t>(r - k.first) - 1;
      const int32_t accepted = result.accepted.empty() ? 0 : result.accepted[k.first];
      k.kept = k.n - drafts + accepted;
      k.sampled = result.next[k.first + static_cast<size_t>(accepted)];
    }
    out.push_back(k);
  }
  return out;
}

// Whether every token of the step samples, in order (decode and
// verification steps: no prefill chunk).
bool every_token_samples(const StepPlan& plan) {
  if (plan.rows.size() != plan.token_ids.size() || plan.logit_rows.size() != plan.token_ids.size()) return false;
  for (size_t i = 0; i < plan.logit_rows.size(); ++i)
    if (plan.logit_rows[i] != static_cast<int32_t>(i)) return false;
  return true;
}

// The batch of one chained draft pass: per drafting sequence j one token
// (`ids`, on the device: the drafts just made) at positions[j], reading the
// sequence's context (context[j], a range of kv_slots) and then `reads`
// scratch slots from scratch_base[j], the last of which it writes.
ForwardBatch chain_batch(const Tensor& ids, const std::vector<int32_t>& positions, const std::vector<int32_t>& kv_slots,
                         const std::vector<std::pair<size_t, size_t>>& context,
                         const std::vector<int32_t>& scratch_base, int reads) {
  const size_t S = positions.size();
  std::vector<int32_t> out_slots, q_start{0}, kv_start{0}, slots, rows;
  for (size_t j = 0; j < S; ++j) {
    out_slots.push_back(scratch_base[j] + reads - 1);
    slots.insert(slots.end(), kv_slots.begin() + static_cast<std::ptrdiff_t>(context[j].first),
                 kv_slots.begin() + static_cast<std::ptrdiff_t>(context[j].second));
    for (int d = 0; d < reads; ++d) slots.push_back(scratch_base[j] + d);
    q_start.push_back(static_cast<int32_t>(j + 1));
    kv_start.push_back(static_cast<int32_t>(slots.size()));
    rows.push_back(static_cast<int32_t>(j));
  }
  const std::vector<int32_t> unknown_ids(S, 0);  // replaced by the device's drafts
  ForwardBatch batch = host_forward_batch(unknown_ids, positions, out_slots, q_start, kv_start, slots, rows);
  batch.token_ids = ids;
  return batch;
}

}  // namespace

LocalModelRunner::LocalModelRunner(Model& model, Backend& backend, int64_t kv_slots, DType kv_dtype,
                                   Model* draft_model)
    : model_(model),
      backend_(backend),
      kv_(model.allocate_kv(kv_slots, kv_dtype)),
      vocab_(static_cast<int32_t>(model.config().vocab_size)),
      kv_slots_(kv_slots),
      kv_dtype_(kv_dtype),
      draft_model_(draft_model) {
  BASALT_CHECK(!draft_model || draft_model->config().vocab_size <= model.config().vocab_size,
               "speculative decoding: the draft model's vocabulary ({} tokens) is larger than the model's ({})",
               draft_model ? draft_model->config().vocab_size : 0, model.config().vocab_size);
  mark_startup_phase("kv_cache");
  // Before the first step: a model that records work (CUDA graphs) does it
  // now, against this KV storage, rather than in the middle of serving.
  model_.prepare(kv_);
  mark_startup_phase("graphs");
}

std::vector<std::vector<TokenLogprob>> LocalModelRunner::top_alternatives(
    const Tensor& lp, std::span<const int> wanted) {
  const int64_t N = lp.dim(0);
  std::vector<std::vector<TokenLogprob>> out(static_cast<size_t>(N));
  int top = 0;
  for (const int n : wanted) top = std::max(top, n);
  top = std::min(top, vocab_);
  if (top > kMaxTopKRows) {
    // Beyond what top_k_rows serves (a server configured for more than 64
    // logprobs): the rows come to the host.
    Tensor host_lp = Tensor::empty({N, vocab_}, DType::kF32);
    backend_.copy(lp, host_lp);
    const size_t V = static_cast<size_t>(vocab_);
    for (size_t r = 0; r < out.size(); ++r)
      if (wanted[r] > 0)
        out[r] =
            top_k_logprobs(std::span<const float>(host_lp.data<float>() + r * V, V), wanted[r]);
  } else if (top > 0) {
    Tensor values = backend_.empty({N, top}, DType::kF32);
    Tensor ids = backend_.empty({N, top}, DType::kI32);
    backend_.top_k_rows(lp, top, values, ids);
    Tensor host_values = Tensor::empty({N, top}, DType::kF32);
    Tensor host_ids = Tensor::empty({N, top}, DType::kI32);
    backend_.copy(values, host_values);
    backend_.copy(ids, host_ids);
    for (size_t r = 0; r < out.size(); ++r) {
      const int n = std::min(wanted[r], top);
      for (int j = 0; j < n; ++j) {
        const size_t at = r * static_cast<size_t>(top) + static_cast<size_t>(j);
        out[r].push_back({host_ids.data<int32_t>()[at], host_values.data<float>()[at]});
      }
    }
  }
  return out;
}

void LocalModelRunner::score_prompts(const StepPlan& plan, const Tensor& logits,
                                     std::vector<PromptLogprob>& scores) {
  const int64_t S = logits.dim(0);
  Tensor lp = backend_.empty({S, vocab_}, DType::kF32);
  backend_.log_softmax(logits, lp);
  std::vector<int32_t> tokens;
  std::vector<int> wanted;
  tokens.reserve(static_cast<size_t>(S));
  wanted.reserve(static_cast<size_t>(S));
  for (const StepPlan::ScoreRow& row : plan.score_rows) {
    tokens.push_back(row.token);
    wanted.push_back(row.logprobs);
  }
  Tensor device_tokens = backend_.empty({S}, DType::kI32);
  backend_.upload(Tensor::from_i32({S}, tokens), device_tokens);
  Tensor values = backend_.empty({S}, DType::kF32), ranks = backend_.empty({S}, DType::kI32);
  backend_.gather_rows(lp, device_tokens, values);
  backend_.rank_rows(lp, device_tokens, ranks);
  std::vector<std::vector<TokenLogprob>> top = top_alternatives(lp, wanted);
  Tensor host_values = Tensor::empty({S}, DType::kF32),
         host_ranks = Tensor::empty({S}, DType::kI32);
  backend_.copy(values, host_values);
  backend_.copy(ranks, host_ranks);
  scores.resize(static_cast<size_t>(S));
  for (size_t s = 0; s < scores.size(); ++s)
    scores[s] = PromptLogprob{tokens[s], host_values.data<float>()[s],
                              host_ranks.data<int32_t>()[s], std::move(top[s])};
}

void LocalModelRunner::run(StepPlan& plan, StepResult& result) {
  backend_.make_current();  // the pipeline's thread drives the device too
  const bool device_ids = !plan.device_drafts.empty() && model_.takes_device_token_ids();
  if (!plan.device_drafts.empty() && !device_ids) resolve_device_drafts(plan);  // waits for them
  ForwardBatch fb = forward_batch_of(plan);
  if (device_ids) fb.token_ids = ids_with_device_drafts(plan, fb.token_ids);
  // The sampled rows' logits, then the score rows'.
  const auto S = static_cast<int64_t>(plan.score_rows.size());
  const auto L = static_cast<int64_t>(plan.logit_rows.size()) - S;
  const size_t R = plan.rows.size();
  Tensor all_logits = backend_.empty({L + S, vocab_}, DType::kF32);
  Tensor logits = S > 0 ? all_logits.rows(0, L) : all_logits;
  Tensor hidden;
  if (plan.capture_hidden) {
    BASALT_CHECK(model_.draft_head() != nullptr, "speculative decoding: the model has no draft head (MTP layer)");
    hidden = backend_.empty({fb.num_tokens(), model_.config().hidden_size}, DType::kF32);
    model_.forward(fb, kv_, all_logits, &hidden);
  } else {
    model_.forward(fb, kv_, all_logits);
  }
  // The forward pass is queued: the host may wait for the drafts now.
  if (device_ids) resolve_device_drafts(plan);
  result.logprobs.assign(R, {});
  result.sampled_logprobs.assign(R, std::numeric_limits<float>::quiet_NaN());
  result.row_errors.clear();
  result.next.clear();
  result.prompt_scores.clear();
  if (S > 0) score_prompts(plan, all_logits.rows(L, S), result.prompt_scores);
  if (R == 0) {  // prefill chunks only: the draft head or model still reads them
    if (plan.capture_hidden) run_draft_head(plan, hidden, result);
    if (plan.run_draft_model) run_draft_model(plan, result);
    return;
  }
  // A constraint that throws fails its own request, not the step.
  auto fail_row = [&](size_t r, const std::exception& e) {
    result.row_errors.resize(R);
    result.row_errors[r] = *e.what() != '\0' ? e.what() : "the request's token constraint failed";
  };
  auto row_failed = [&](size_t r) { return !result.row_errors.empty() && !result.row_errors[r].empty(); };

  // The constraints' masks, filled on the host while the device computes.
  bool masked = false;
  for (const StepPlan::SampleRow& row : plan.rows) masked |= row.constraint != nullptr;
  std::vector<uint32_t> mask;
  const int64_t words = token_mask_words(vocab_);
  if (masked) {
    mask.assign(static_cast<size_t>(L * words), ~uint32_t{0});
    // A draft group's rows are masked as if its drafts were accepted up to
    // each row: the constraint takes each draft after its row's mask, and
    // gives them back at the group's end. Past a draft its mask refuses, the
    // rows are left unmasked (their samples cannot be accepted).
    size_t group_first = 0;
    int advanced = 0;
    bool blocked = false;
    for (size_t r = 0; r < R; ++r) {
      const StepPlan::SampleRow& sample_row = plan.rows[r];
      if (r == 0 || plan.rows[r - 1].draft < 0) {
        group_first = r;
        advanced = 0;
        blocked = false;
      }
      if (!sample_row.constraint) continue;
      std::span<uint32_t> row(mask.data() + r * static_cast<size_t>(words), static_cast<size_t>(words));
      if (!blocked && !row_failed(group_first)) {
        try {
          sample_row.constraint->fill_allowed(row);
          // Bits past the vocabulary do not count.
          if (vocab_ % 32 != 0) row.back() &= (uint32_t{1} << (vocab_ % 32)) - 1;
          BASALT_CHECK(std::any_of(row.begin(), row.end(), [](uint32_t w) { return w != 0; }),
                       "the token constraint of sampled row {} allows no token", r);
          const int32_t d = sample_row.draft;
          if (d >= 0) {
            if (d < vocab_ && (row[static_cast<size_t>(d) / 32] >> (d % 32)) & 1u) {
              sample_row.constraint->accept(d);
              ++advanced;
            } else {
              blocked = true;
            }
          }
        } catch (const std::exception& e) {
          fail_row(group_first, e);
          std::fill(row.begin(), row.end(), ~uint32_t{0});  // sampled, then dropped
        }
      }
      if (sample_row.draft < 0 && advanced > 0) {
        try {
          sample_row.constraint->rollback(advanced);
        } catch (const std::exception& e) {
          fail_row(group_first, e);
        }
      }
    }
  }

  // Only token ids and the requested logprobs cross to the host: the
  // logprobs (raw, before the processors and masks) are reduced on the
  // device to each row's top entries and the drawn token's value.
  std::vector<int> wanted;
  wanted.reserve(R);
  bool want_sampled = false;
  for (const StepPlan::SampleRow& row : plan.rows) {
    wanted.push_back(row.logprobs);
    want_sampled |= row.sampled_logprob;
  }
  const bool want_top = std::any_of(wanted.begin(), wanted.end(), [](int n) { return n > 0; });
  Tensor lp;
  if (want_top || want_sampled) {
    lp = backend_.empty({L, vocab_}, DType::kF32);
    backend_.log_softmax(logits, lp);
  }
  if (want_top) result.logprobs = top_alternatives(lp, wanted);
  // The processors' edits: a draft group's rows as if the drafts before
  // each were sampled (penalties count them), given back at the group's end.
  std::vector<LogitEdit> edits;
  for (size_t r = 0, appended = 0; r < R; ++r) {
    LogitsProcessor& processor = *plan.rows[r].processor;
    if (processor.active()) processor.edits(static_cast<int32_t>(r), edits);
    if (plan.rows[r].draft >= 0) {
      processor.append(plan.rows[r].draft);
      ++appended;
    } else if (appended > 0) {
      processor.rollback(static_cast<int>(appended));
      appended = 0;
    }
  }
  if (!edits.empty()) backend_.adjust_logits(logits, edits);
  if (masked) {
    const Tensor host_mask =
        Tensor::from_i32({L, words}, std::span<const int32_t>(reinterpret_cast<const int32_t*>(mask.data()), mask.size()));
    Tensor device_mask = backend_.empty({L, words}, DType::kI32);
    backend_.upload(host_mask, device_mask);  // no wait: sampling queues behind the forward pass
    backend_.apply_token_bitmask(logits, device_mask);
  }
  std::vector<SamplingRow> rows;
  rows.reserve(R);
  for (const StepPlan::SampleRow& row : plan.rows) rows.push_back(row.sampling);
  // Where every token of the step samples (decode and verification
  // only), the draft head runs on the samples straight away, on the device.
  // The samples (and the drawn tokens' logprobs) start for the host before
  // the head is launched, so the host waits for them alone; the head's
  // drafts for every row follow in a copy of their own, which a step with
  // one draft per sequence does not wait for (complete_proposals).
  const bool early_head = plan.capture_hidden && every_token_samples(plan);
  Tensor out = backend_.empty({L}, DType::kI32);
  backend_.sample(logits, rows, out);
  Tensor host_out = Tensor::empty({L}, DType::kI32);
  const std::unique_ptr<Backend::PendingDownload> samples_down = backend_.download(out, host_out);
  Tensor host_sampled;
  std::unique_ptr<Backend::PendingDownload> sampled_down;
  if (want_sampled) {
    Tensor sampled = backend_.empty({L}, DType::kF32);
    backend_.gather_rows(lp, out, sampled);
    host_sampled = Tensor::empty({L}, DType::kF32);
    sampled_down = backend_.download(sampled, host_sampled);
  }
  Tensor head_hidden, host_drafts, row_drafts;
  std::unique_ptr<Backend::PendingDownload> drafts_down;
  if (early_head) {
    row_drafts = backend_.empty({L}, DType::kI32);
    head_hidden = launch_head_on_samples(plan, fb, hidden, out, row_drafts);
    host_drafts = Tensor::empty({L}, DType::kI32);
    drafts_down = backend_.download(row_drafts, host_drafts);
  }
  samples_down->wait();
  result.next.assign(host_out.data<int32_t>(), host_out.data<int32_t>() + R);
  if (want_sampled) {
    sampled_down->wait();
    for (size_t r = 0; r < R; ++r)
      if (plan.rows[r].sampled_logprob) result.sampled_logprobs[r] = host_sampled.data<float>()[r];
  }
  // Each group's accepted drafts: while a row sampled exactly the draft the
  // next row's input assumed. The request's tokens are the group's first
  // 1 + accepted samples; the processor and constraint take those.
  const bool verifies = std::any_of(plan.rows.begin(), plan.rows.end(), [](const auto& row) { return row.draft >= 0; });
  if (verifies) result.accepted.assign(R, 0);
  else result.accepted.clear();
  std::vector<int32_t> drafts;
  for (size_t r = 0; r < R;) {
    size_t last = r;
    while (plan.rows[last].draft >= 0) ++last;
    drafts.clear();
    for (size_t j = r; j < last; ++j) drafts.push_back(plan.rows[j].draft);
    const size_t take =
        r + accepted_drafts(std::span<const int32_t>(result.next.data() + r, last - r + 1), drafts);
    if (verifies) result.accepted[r] = static_cast<int32_t>(take - r);
    const size_t group = r;
    r = last + 1;
    const StepPlan::SampleRow& row = plan.rows[group];
    if (row_failed(group)) continue;
    for (size_t j = group; j <= take; ++j) row.processor->append(result.next[j]);
    if (!row.constraint) continue;
    try {
      for (size_t j = group; j <= take; ++j) row.constraint->accept(result.next[j]);
    } catch (const std::exception& e) {
      fail_row(group, e);
    }
  }
  const bool one_draft = early_head && head_chain(plan, static_cast<int64_t>(plan.q_start.size()) - 1) <= 1;
  if (one_draft && plan.drafts_behind_samples) {
    defer_head_drafts(plan, row_drafts, std::move(host_drafts), std::move(drafts_down), result);
  } else if (early_head) {
    drafts_down->wait();
    finish_head_on_samples(plan, std::span<const int32_t>(host_drafts.data<const int32_t>(), static_cast<size_t>(L)),
                           head_hidden, result);
  } else if (plan.capture_hidden) {
    run_draft_head(plan, hidden, result);
  }
  if (plan.run_draft_model) run_draft_model(plan, result);
}

// The head's pass where every token of the step samples: it reads the
// step's own batch with each row's sampled token as that row's next token
// (for every kept row that is the token that follows it: an accepted
// draft, or the token sampled after the last), so it needs nothing from
// the host and runs right behind sampling. Its KV goes to every row's slot;
// the rows past a sequence's last kept one (rejected drafts) are written
// with tokens nobody keeps, and their slots are written again when the
// sequence gets there. It drafts at every row (`row_drafts`, on the
// device); finish_head_on_samples() keeps each sequence's draft at its
// last kept row. Returns the head's hidden states for the chain (empty when
// there is none).
Tensor LocalModelRunner::launch_head_on_samples(const StepPlan& plan, const ForwardBatch& fb, const Tensor& hidden,
                                                const Tensor& sampled, Tensor& row_drafts) {
  DraftHead& head = *model_.draft_head();
  ensure_head_kv(head);
  ForwardBatch hb = fb;
  hb.token_ids = sampled;
  const int64_t T = fb.num_tokens();
  Tensor head_logits = backend_.empty({T, vocab_}, DType::kF32);
  const int chain = head_chain(plan, static_cast<int64_t>(plan.q_start.size()) - 1);
  Tensor head_hidden = chain > 1 ? backend_.empty({T, model_.config().hidden_size}, DType::kF32) : Tensor();
  head.forward(hb, hidden, head_kv_, head_logits, chain > 1 ? &head_hidden : nullptr);
  backend_.argmax(head_logits, row_drafts);
  return head_hidden;
}

void LocalModelRunner::defer_head_drafts(const StepPlan& plan, const Tensor& row_drafts, Tensor host_drafts,
                                         std::unique_ptr<Backend::PendingDownload> drafts_down, StepResult& result) {
  const size_t R = plan.rows.size();
  result.proposals.assign(R, {});
  std::vector<std::pair<size_t, size_t>> from;  // (proposal row, the row whose draft it is)
  for (const KeptSequence& seq : kept_sequences(plan, result)) {
    if (!seq.samples) continue;
    from.emplace_back(seq.first, static_cast<size_t>(seq.q0 + seq.kept - 1));
    result.proposals[seq.first].assign(1, kPendingDraft);
  }
  if (from.empty()) return;
  auto copy = std::make_shared<DraftsCopy>();
  copy->download = std::move(drafts_down);
  copy->host = std::move(host_drafts);
  deferred_.step = plan.id;
  deferred_.rows = row_drafts;
  deferred_.row_of.assign(R, -1);
  for (const auto& [row, at] : from) deferred_.row_of[row] = static_cast<int32_t>(at);
  deferred_.copy = copy;
  result.complete_proposals = [copy, from = std::move(from)](StepResult& done) {
    const int32_t* drafts = copy->values();
    for (const auto& [row, at] : from) done.proposals[row].assign(1, drafts[at]);
  };
}

const int32_t* LocalModelRunner::DraftsCopy::values() {
  std::lock_guard<std::mutex> lock(mu);
  if (download != nullptr) {
    download->wait();
    download.reset();
  }
  return host.data<const int32_t>();
}

int32_t LocalModelRunner::deferred_at(const StepPlan& plan, const FutureToken& draft) const {
  BASALT_CHECK(plan.drafts_of != 0 && plan.drafts_of == deferred_.step && deferred_.copy != nullptr,
               "step {} takes the drafts of step {}, which this runner does not hold (it holds step {}'s)", plan.id,
               plan.drafts_of, deferred_.step);
  const auto row = static_cast<size_t>(draft.row);
  BASALT_CHECK(draft.row >= 0 && row < deferred_.row_of.size() && deferred_.row_of[row] >= 0 &&
                   draft.index < plan.token_ids.size(),
               "step {}: the draft for input {} (row {} of step {}) is not one the head made", plan.id, draft.index,
               draft.row, plan.drafts_of);
  return deferred_.row_of[row];
}

Tensor LocalModelRunner::ids_with_device_drafts(const StepPlan& plan, const Tensor& host_ids) {
  const auto K = static_cast<int64_t>(plan.device_drafts.size());
  std::vector<int32_t> pairs;  // the drafts' places in deferred_.rows, then their inputs
  for (const FutureToken& d : plan.device_drafts) pairs.push_back(deferred_at(plan, d));
  for (const FutureToken& d : plan.device_drafts) pairs.push_back(static_cast<int32_t>(d.index));
  Tensor ids = backend_.empty(host_ids.shape(), DType::kI32);
  backend_.upload(host_ids, ids);
  Tensor index = backend_.empty({2 * K}, DType::kI32);
  backend_.upload(i32_tensor(pairs), index);
  backend_.copy_indexed(deferred_.rows, index.rows(0, K), ids, index.rows(K, K));
  return ids;
}

void LocalModelRunner::resolve_device_drafts(StepPlan& plan) {
  for (const FutureToken& d : plan.device_drafts) deferred_at(plan, d);  // every one checked before the wait
  const int32_t* values = deferred_.copy->values();
  for (const FutureToken& d : plan.device_drafts) plan.token_ids[d.index] = values[deferred_at(plan, d)];
  // A draft row's draft is the input one position after its logits row.
  for (size_t i = 0; i < plan.rows.size(); ++i)
    if (plan.rows[i].draft == kPendingDraft)
      plan.rows[i].draft = plan.token_ids[static_cast<size_t>(plan.logit_rows[i]) + 1];
  plan.device_drafts.clear();
  plan.drafts_of = 0;
}

void LocalModelRunner::finish_head_on_samples(const StepPlan& plan, std::span<const int32_t> row_drafts,
                                              const Tensor& head_hidden, StepResult& result) {
  const size_t R = plan.rows.size();
  result.proposals.assign(R, {});
  std::vector<size_t> proposal_rows;
  std::vector<int32_t> last_rows, first_drafts, next_position;
  std::vector<std::pair<size_t, size_t>> context;  // ranges of plan.kv_slots
  for (const KeptSequence& seq : kept_sequences(plan, result)) {
    if (!seq.samples) continue;
    const int32_t last = seq.q0 + seq.kept - 1;
    proposal_rows.push_back(seq.first);
    last_rows.push_back(last);
    first_drafts.push_back(row_drafts[static_cast<size_t>(last)]);
    next_position.push_back(plan.positions[static_cast<size_t>(last)] + 1);
    context.emplace_back(static_cast<size_t>(seq.k0), static_cast<size_t>(seq.k1 - (seq.n - seq.kept)));
  }
  const auto S = static_cast<int64_t>(proposal_rows.size());
  if (S == 0) return;
  const int chain = head_chain(plan, static_cast<int64_t>(plan.q_start.size()) - 1);
  if (chain <= 1) {
    for (int64_t j = 0; j < S; ++j)
      result.proposals[proposal_rows[static_cast<size_t>(j)]].push_back(first_drafts[static_cast<size_t>(j)]);
    return;
  }
  Tensor drafts = backend_.empty({chain * S}, DType::kI32);
  Tensor first = drafts.rows(0, S);
  backend_.upload(i32_tensor(first_drafts), first);
  Tensor rows = backend_.empty({S}, DType::kI32);
  backend_.upload(i32_tensor(last_rows), rows);
  Tensor chained_hidden = backend_.empty({S, model_.config().hidden_size}, DType::kF32);
  backend_.embedding(rows, head_hidden, chained_hidden);
  chain_head(chain, drafts, chained_hidden, plan.kv_slots, context, next_position);
  hand_out_drafts(drafts, chain, proposal_rows, result);
}

// The head reads, at each position the step computed and kept, the model's
// hidden state there and the token that follows it (the next input, or for
// a sequence's last kept position the token sampled there, or for a prefill
// chunk the prompt's next token), writes its KV at that position's slot,
// and at each sampling sequence's last kept position predicts the token
// after the one just sampled: the next step's first draft. It reads every
// row of the step, in the step's layout, so that a step whose sequences
// all have the same number of rows gives the head a batch of that shape
// too (a GraphedModel's head replays it): the rows past a sequence's last
// kept one (rejected drafts; a chunk's last position while the token after
// it is unknown) write no KV (slot -1) and their outputs are not read;
// causal attention keeps them out of the kept rows. The rejected positions
// are written again when the sequence gets there. Each further draft
// (plan.draft_chain) runs the head once more, on the draft before it and
// the head's own hidden state, one position on; its KV goes to scratch
// slots past the pool's (kHeadScratchSlots), which the next step's pass
// replaces with KV at the real slots.
void LocalModelRunner::run_draft_head(const StepPlan& plan, const Tensor& hidden, StepResult& result) {
  DraftHead& head = *model_.draft_head();
  ensure_head_kv(head);
  const size_t R = plan.rows.size();
  result.proposals.assign(R, {});
  std::vector<int32_t> ids, positions, out_slots, q_start{0}, kv_start{0}, kv_slots, logit_rows, hidden_rows;
  std::vector<size_t> proposal_rows;  // per head logits row: the plan row (a group's first) it drafts for
  // Per head logits row: its sequence's kept slots (a range of kv_slots)
  // and the position after its last kept one.
  std::vector<std::pair<size_t, size_t>> context;
  std::vector<int32_t> next_position;
  for (const KeptSequence& seq : kept_sequences(plan, result)) {
    const auto [s, q0, n, k0, k1, sequence_kept, samples, first, sampled] = seq;
    int32_t kept = sequence_kept, follow = samples ? sampled : plan.next_known[s];
    if (!samples && follow < 0) --kept;  // the token after the chunk is not known yet: its last position waits
    if (kept <= 0) continue;
    for (int32_t i = 0; i < n; ++i) {
      const int32_t t = q0 + i;
      const bool keep = i < kept;
      if (i == kept - 1 && follow >= 0)
        ids.push_back(follow);
      else
        ids.push_back(plan.token_ids[static_cast<size_t>(keep ? t + 1 : t)]);
      positions.push_back(plan.positions[static_cast<size_t>(t)]);
      out_slots.push_back(keep ? plan.out_slots[static_cast<size_t>(t)] : -1);
      hidden_rows.push_back(t);
    }
    kv_slots.insert(kv_slots.end(), plan.kv_slots.begin() + k0, plan.kv_slots.begin() + k1);
    if (samples) {
      logit_rows.push_back(static_cast<int32_t>(ids.size()) - (n - kept) - 1);
      proposal_rows.push_back(first);
      context.emplace_back(kv_slots.size() - static_cast<size_t>(k1 - k0), kv_slots.size() - (n - kept));
      next_position.push_back(plan.positions[static_cast<size_t>(q0 + kept - 1)] + 1);
    }
    q_start.push_back(static_cast<int32_t>(ids.size()));
    kv_start.push_back(static_cast<int32_t>(kv_slots.size()));
  }
  if (ids.empty()) return;
  if (logit_rows.empty()) logit_rows.push_back(0);  // the head wants a row; nobody reads it
  const ForwardBatch hb = host_forward_batch(ids, positions, out_slots, q_start, kv_start, kv_slots, logit_rows);
  const auto N = static_cast<int64_t>(ids.size()), L = static_cast<int64_t>(logit_rows.size());
  // The step's hidden states as they are when the head reads every row of
  // the step; else the rows it reads, gathered.
  Tensor kept_hidden = hidden;
  if (N != hidden.dim(0)) {
    Tensor rows = backend_.empty({N}, DType::kI32);
    backend_.upload(i32_tensor(hidden_rows), rows);
    kept_hidden = backend_.empty({N, model_.config().hidden_size}, DType::kF32);
    backend_.embedding(rows, hidden, kept_hidden);
  }
  Tensor head_logits = backend_.empty({L, vocab_}, DType::kF32);
  const int64_t H = model_.config().hidden_size;
  const auto S = static_cast<int64_t>(proposal_rows.size());
  const int chain = head_chain(plan, S);
  Tensor head_hidden = chain > 1 ? backend_.empty({N, H}, DType::kF32) : Tensor();
  head.forward(hb, kept_hidden, head_kv_, head_logits, chain > 1 ? &head_hidden : nullptr);
  if (S == 0) return;
  // Each draft stays on the device, where the next chained pass reads it;
  // all of them come to the host together at the end (one wait per step,
  // not one per draft).
  Tensor drafts = backend_.empty({chain * S}, DType::kI32);
  Tensor first_drafts = drafts.rows(0, S);
  backend_.argmax(head_logits, first_drafts);
  if (chain > 1) {
    // The head's own hidden states at the sequences' last kept rows.
    Tensor last_rows = backend_.empty({S}, DType::kI32);
    backend_.upload(i32_tensor(std::vector<int32_t>(logit_rows.begin(), logit_rows.begin() + S)), last_rows);
    Tensor chained_hidden = backend_.empty({S, H}, DType::kF32);
    backend_.embedding(last_rows, head_hidden, chained_hidden);
    chain_head(chain, drafts, chained_hidden, kv_slots, context, next_position);
  }
  hand_out_drafts(drafts, chain, proposal_rows, result);
}

// The draft model reads, per sequence, the tokens the step kept at their own
// positions and slots (what the target read there: its KV is the draft's
// slot for slot), and at each sampling sequence the token just sampled, one
// position on, in a scratch slot past the pool's: its logits there are the
// first draft (greedy). Each further draft (plan.draft_chain) reads the
// draft before it, one more scratch slot on. The next step writes the
// sampled token's KV at its real slot, as the target does. Rejected drafts'
// positions are not kept: the slots they would take are written again.
void LocalModelRunner::run_draft_model(const StepPlan& plan, StepResult& result) {
  BASALT_CHECK(draft_model_ != nullptr, "speculative decoding: no draft model was loaded");
  Model& draft = *draft_model_;
  if (!draft_kv_ready_) {
    draft_kv_ = draft.allocate_kv(kv_slots_ + kHeadScratchSlots, kv_dtype_);
    draft_kv_ready_ = true;
  }
  const size_t R = plan.rows.size();
  result.proposals.assign(R, {});
  const std::vector<KeptSequence> sequences = kept_sequences(plan, result);
  // The sampling sequences first: how many, to share the scratch slots.
  const auto S = static_cast<int64_t>(
      std::count_if(sequences.begin(), sequences.end(), [](const KeptSequence& k) { return k.samples; }));
  const int chain =
      S == 0 ? 1 : static_cast<int>(std::clamp<int64_t>(kHeadScratchSlots / S, 1, plan.draft_chain));
  // Past kHeadScratchSlots sampling sequences (a batch larger than any
  // that drafts: the off-switch is far below) the rest draft nothing; their
  // kept tokens are still read, so that their KV is complete.
  const int64_t drafting = std::min<int64_t>(S, kHeadScratchSlots / chain);
  const auto scratch = [&](int64_t j, int d) { return static_cast<int32_t>(kv_slots_ + j * chain + d); };
  std::vector<int32_t> ids, positions, out_slots, q_start{0}, kv_start{0}, kv_slots, logit_rows;
  std::vector<size_t> proposal_rows;                // per drafting sequence: its group's first plan row
  std::vector<std::pair<size_t, size_t>> context;   // its kept slots, a range of kv_slots
  std::vector<int32_t> sampled_position;            // the position of the token just sampled
  for (const KeptSequence& seq : sequences) {
    const auto [s, q0, n, k0, k1, kept, samples, first, sampled] = seq;
    for (int32_t i = 0; i < kept; ++i) {
      ids.push_back(plan.token_ids[static_cast<size_t>(q0 + i)]);
      positions.push_back(plan.positions[static_cast<size_t>(q0 + i)]);
      out_slots.push_back(plan.out_slots[static_cast<size_t>(q0 + i)]);
    }
    kv_slots.insert(kv_slots.end(), plan.kv_slots.begin() + k0, plan.kv_slots.begin() + (k1 - (n - kept)));
    if (samples && static_cast<int64_t>(proposal_rows.size()) < drafting) {
      const auto j = static_cast<int64_t>(proposal_rows.size());
      context.emplace_back(kv_slots.size() - static_cast<size_t>(k1 - k0 - (n - kept)), kv_slots.size());
      ids.push_back(sampled);
      sampled_position.push_back(positions.back() + 1);
      positions.push_back(sampled_position.back());
      out_slots.push_back(scratch(j, 0));
      kv_slots.push_back(scratch(j, 0));
      logit_rows.push_back(static_cast<int32_t>(ids.size()) - 1);
      proposal_rows.push_back(first);
    }
    q_start.push_back(static_cast<int32_t>(ids.size()));
    kv_start.push_back(static_cast<int32_t>(kv_slots.size()));
  }
  if (ids.empty()) return;
  if (logit_rows.empty()) logit_rows.push_back(0);  // the model wants a row; nobody reads it
  const auto draft_vocab = draft.config().vocab_size;
  Tensor logits = backend_.empty({static_cast<int64_t>(logit_rows.size()), draft_vocab}, DType::kF32);
  ForwardBatch fb = host_forward_batch(ids, positions, out_slots, q_start, kv_start, kv_slots, logit_rows);
  fb.mode = ForwardMode::kDraft;
  draft.forward(fb, draft_kv_, logits);
  if (proposal_rows.empty()) return;
  const auto P = static_cast<int64_t>(proposal_rows.size());
  // As the head's chain: drafts stay on the device until the last.
  Tensor drafts = backend_.empty({chain * P}, DType::kI32);
  Tensor first_drafts = drafts.rows(0, P);
  backend_.argmax(logits, first_drafts);
  Tensor chained_logits = backend_.empty({P, draft_vocab}, DType::kF32);
  std::vector<int32_t> scratch_base(static_cast<size_t>(P)), chain_positions(static_cast<size_t>(P));
  for (int64_t j = 0; j < P; ++j) scratch_base[static_cast<size_t>(j)] = scratch(j, 0);
  for (int step = 1; step < chain; ++step) {
    for (size_t j = 0; j < proposal_rows.size(); ++j) chain_positions[j] = sampled_position[j] + step;
    // The draft before, one position on, in scratch slot step (slot 0 holds the sampled token).
    ForwardBatch cb =
        chain_batch(drafts.rows((step - 1) * P, P), chain_positions, kv_slots, context, scratch_base, step + 1);
    cb.mode = ForwardMode::kDraft;
    draft.forward(cb, draft_kv_, chained_logits);
    Tensor step_drafts = drafts.rows(step * P, P);
    backend_.argmax(chained_logits, step_drafts);
  }
  hand_out_drafts(drafts, chain, proposal_rows, result);
}

int LocalModelRunner::head_chain(const StepPlan& plan, int64_t sequences) const {
  // Chained drafts share the scratch slots: draft_chain - 1 per sequence.
  return sequences == 0 ? 1
                        : static_cast<int>(std::clamp<int64_t>(kHeadScratchSlots / sequences + 1, 1, plan.draft_chain));
}

void LocalModelRunner::ensure_head_kv(DraftHead& head) {
  if (head_kv_ready_) return;
  head_kv_ = head.allocate_kv(kv_slots_ + kHeadScratchSlots, kv_dtype_);
  head_kv_ready_ = true;
}

// Each further draft runs the head once more, on the draft before it (row
// step - 1 of `drafts`, on the device) and its own hidden state, one
// position on; its KV goes to scratch slots past the pool's, which the next
// step's pass replaces with KV at the real slots. Sequence j reads
// kv_slots[context[j]] and its scratch slots so far.
void LocalModelRunner::chain_head(int chain, Tensor& drafts, Tensor chained_hidden, const std::vector<int32_t>& kv_slots,
                                  const std::vector<std::pair<size_t, size_t>>& context,
                                  const std::vector<int32_t>& next_position) {
  DraftHead& head = *model_.draft_head();
  const auto S = static_cast<int64_t>(next_position.size());
  Tensor chained_logits = backend_.empty({S, vocab_}, DType::kF32);
  Tensor next_hidden = backend_.empty({S, model_.config().hidden_size}, DType::kF32);
  std::vector<int32_t> scratch_base(static_cast<size_t>(S)), positions(static_cast<size_t>(S));
  for (int64_t j = 0; j < S; ++j)
    scratch_base[static_cast<size_t>(j)] = static_cast<int32_t>(kv_slots_ + j * (chain - 1));
  for (int step = 1; step < chain; ++step) {
    for (int64_t j = 0; j < S; ++j)
      positions[static_cast<size_t>(j)] = next_position[static_cast<size_t>(j)] + step - 1;
    // The draft before, at the next position, in scratch slot step - 1.
    ForwardBatch cb = chain_batch(drafts.rows((step - 1) * S, S), positions, kv_slots, context, scratch_base, step);
    head.forward(cb, chained_hidden, head_kv_, chained_logits, step + 1 < chain ? &next_hidden : nullptr);
    Tensor step_drafts = drafts.rows(step * S, S);
    backend_.argmax(chained_logits, step_drafts);
    std::swap(chained_hidden, next_hidden);
  }
}

// Copies a step's drafts ([chain, sequences] on the device, chain-major) to
// the host and appends each sequence's to its group's proposals.
void LocalModelRunner::hand_out_drafts(const Tensor& drafts, int chain, const std::vector<size_t>& proposal_rows,
                                       StepResult& result) {
  const auto S = static_cast<int64_t>(proposal_rows.size());
  Tensor host = Tensor::empty({chain * S}, DType::kI32);
  backend_.copy(drafts, host);
  for (int step = 0; step < chain; ++step)
    for (int64_t j = 0; j < S; ++j)
      result.proposals[proposal_rows[static_cast<size_t>(j)]].push_back(host.data<const int32_t>()[step * S + j]);
}

// --- StepPipeline -----------------------------------------------------------------

StepPipeline::StepPipeline(ModelRunner& runner, bool threaded) : runner_(runner) {
  if (threaded) thread_ = std::thread([this] { loop(); });
}

StepPipeline::~StepPipeline() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<StepPipeline::Step> StepPipeline::launch(std::shared_ptr<StepPlan> plan) {
  auto step = std::make_shared<Step>();
  step->plan = std::move(plan);
  if (threaded()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(step);
    }
    cv_.notify_one();
  }
  return step;
}

std::shared_ptr<StepPipeline::Step> StepPipeline::launch_inline(std::shared_ptr<StepPlan> plan) {
  auto step = std::make_shared<Step>();
  step->plan = std::move(plan);
  step->on_caller = true;
  if (threaded()) {
    // The runner's thread is idle: nothing queued, and its last step's
    // writes (last_next_) are visible, by this lock, to the caller's run.
    std::lock_guard<std::mutex> lock(mu_);
    BASALT_CHECK(queue_.empty() && !running_, "step {} launched inline while a step is still to run",
                 step->plan->id);
  }
  return step;
}

void StepPipeline::wait(Step& step) {
  if (!threaded() || step.on_caller) {
    if (!step.done) {
      run(step);
      step.done = true;
    }
    return;
  }
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return step.done; });
}

void StepPipeline::loop() {
  pthread_setname_np(pthread_self(), "basalt-runner");
  for (;;) {
    std::shared_ptr<Step> step;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping
      step = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    run(*step);
    {
      std::lock_guard<std::mutex> lock(mu_);
      step->done = true;
      running_ = false;
    }
    done_cv_.notify_all();
  }
}

void StepPipeline::run(Step& step) {
  StepPlan& plan = *step.plan;
  StepResult& result = step.result;
  result.exec_start = Clock::now();
  try {
    if (!plan.futures.empty()) {
      BASALT_CHECK(plan.futures_of == last_id_, "step {} needs the tokens of step {}, which failed", plan.id,
                   plan.futures_of);
      for (const FutureToken& f : plan.futures) {
        BASALT_CHECK(static_cast<size_t>(f.row) < last_next_.size(), "future row {} of {}", f.row,
                     last_next_.size());
        plan.token_ids[f.index] = last_next_[static_cast<size_t>(f.row)];
      }
    }
    last_id_ = 0;
    runner_.run(plan, result);
    last_next_ = result.next;
    last_id_ = plan.id;
  } catch (const std::exception& e) {
    result.error = e.what();
    if (result.error.empty()) result.error = "unknown error";
  }
  result.exec_end = Clock::now();
}

}  // namespace basalt
