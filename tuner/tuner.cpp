#include "tuner/tuner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string_view>
#include <utility>

#include "tuner/measure.hpp"
#include "tuner/reference.hpp"
#include "tuner/tuner_internal.hpp"
#include "tuner/workload.hpp"

namespace flashjit {
using namespace tuner_detail;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// TuneReport

double TuneReport::default_tflops() const { return tflops_of(problem, default_ms); }

double TuneReport::chosen_tflops() const {
  return choice ? tflops_of(problem, choice->median_ms) : 0;
}

double TuneReport::gain() const {
  if (!choice || choice->median_ms <= 0 || default_ms <= 0) return 1;
  return default_ms / choice->median_ms;
}

const TuneResult* TuneReport::result_of(const AttentionConfig& config) const {
  for (const TuneResult& result : results) {
    if (result.config == config) return &result;
  }
  return nullptr;
}

// ---------------------------------------------------------------------------------------------
// Tuner: construction and the compile pool.

Tuner::Tuner(const Backend& backend, const BinaryCache* cache, TuningStore* store,
             TuneOptions options)
    : backend_(backend),
      cache_(cache),
      store_(store),
      options_(std::move(options)),
      fingerprint_(backend.fingerprint()) {
  options_.min_samples = std::max(1, options_.min_samples);
  options_.max_samples = std::max(options_.min_samples, options_.max_samples);
  options_.retime_top = std::max(0, options_.retime_top);
  options_.max_retimes = std::max(1, options_.max_retimes);
  options_.compare_rounds = std::max(1, options_.compare_rounds);
  if (options_.serialize_timing) {
    const std::string device = backend.timing_device_id();
    Result<DeviceLock> lock =
        DeviceLock::open(options_.lock_dir.empty() ? DeviceLock::default_dir()
                                                   : std::filesystem::path(options_.lock_dir),
                         device);
    if (lock.ok()) {
      device_lock_.emplace(std::move(lock.value()));
    } else {
      message("flashjit tune: timing " + device + " without its lock (other tuners on it may " +
              "disturb the timings): " + lock.error().message);
    }
  }
}

void Tuner::message(const std::string& text) const {
  if (options_.on_message) {
    options_.on_message(text);
  } else {
    std::cerr << text << std::endl;
  }
}

void Tuner::mark_inflight(const ProblemKey& key, const AttentionConfig* config) const {
  if (options_.inflight_path.empty()) return;
  std::ofstream out(options_.inflight_path, std::ios::trunc);
  if (config != nullptr) out << key.to_string() << "\t" << config->to_string() << "\n";
}

const TuneOptions::Fault* Tuner::fault_of(const ProblemKey& key,
                                          const AttentionConfig& config) const {
  for (const TuneOptions::Fault& fault : options_.faulted) {
    if (fault.key == key.to_string() && fault.config == config.to_string()) return &fault;
  }
  return nullptr;
}

Result<DeviceLock::Guard> Tuner::hold_device() const {
  if (!device_lock_ || run_holds_device_) return DeviceLock::Guard();
  return device_lock_->acquire([this](long pid) {
    // Once per holder: tuners sharing a device alternate at every candidate (its load,
    // verification and timing take turns), so a contended run would otherwise say it each time.
    if (!holders_named_.insert(pid).second) return;
    message("waiting for " + device_lock_->device() + ": held by " +
            (pid > 0 ? "pid " + std::to_string(pid) : std::string("another process")) + " (" +
            device_lock_->path().string() + ")");
  });
}

Tuner::~Tuner() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

template <class Body>
auto Tuner::holding_device_for_run(const Body& body) -> decltype(body()) {
  if (!backend_.compiles_share_the_device() || run_holds_device_) return body();
  Result<DeviceLock::Guard> held = hold_device();
  if (!held.ok()) return held.error();
  run_holds_device_ = held->held();
  auto result = body();
  run_holds_device_ = false;
  return result;
}

Result<TuneReport> Tuner::tune(const AttentionProblem& problem) {
  return holding_device_for_run([&] { return tune_one(problem, 0, 1); });
}

Result<std::vector<TuneReport>> Tuner::tune_all(const std::vector<AttentionProblem>& problems) {
  return holding_device_for_run(
      [&]() -> Result<std::vector<TuneReport>> { return tune_problems(problems); });
}

Result<std::vector<TuneReport>> Tuner::tune_problems(
    const std::vector<AttentionProblem>& problems) {
  for (size_t i = 0; i < problems.size(); ++i) {
    Status valid = backend_.check_problem(problems[i]);
    if (!valid.ok()) {
      return make_error(valid.error().code,
                        "problem " + std::to_string(i) + ": " + valid.error().message);
    }
  }
  prefetch(problems);
  std::vector<TuneReport> reports;
  reports.reserve(problems.size());
  for (size_t i = 0; i < problems.size(); ++i) {
    Result<TuneReport> report = tune_one(problems[i], i, problems.size());
    if (!report.ok()) return report.error();
    reports.push_back(std::move(report.value()));
  }
  return reports;
}

Result<TuneReport> Tuner::tune_one(const AttentionProblem& problem, size_t index, size_t count) {
  const Clock::time_point start = Clock::now();
  FLASHJIT_TRY(backend_.check_problem(problem));
  const DeviceSpec& device = backend_.device();

  ProblemRun run{problem};
  TuneReport& report = run.report;
  report.problem = problem;
  report.key = ProblemKey::of(problem);
  run.configs = backend_.legal_configs(problem);
  Result<AttentionConfig> default_cfg = backend_.default_config(problem);

  run.progress.problem = &problem;
  run.progress.problem_index = index;
  run.progress.problem_count = count;
  run.progress.steps = static_cast<int>(run.configs.size()) + 1;
  auto finish = [&]() {
    mark_inflight(report.key, nullptr);
    if (run.timer) report.busy_batches = run.timer->discarded();
    report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    TuneProgress done = run.progress;
    done.phase = TuneProgress::Phase::Done;
    done.step = done.steps;
    done.report = &report;
    notify(done);
    return std::move(report);
  };
  if (run.configs.empty() || !default_cfg.ok()) {
    report.note = "no legal config on " + device.name;
    if (!default_cfg.ok()) report.note += ": " + default_cfg.error().message;
    return finish();
  }
  report.default_config = *default_cfg;
  run.default_index =
      std::find(run.configs.begin(), run.configs.end(), *default_cfg) - run.configs.begin();
  if (run.default_index == run.configs.size()) {  // an invariant of the generator
    return make_error(ErrorCode::Unsupported, "default config " + default_cfg->to_string() +
                                                  " is not among the legal configs of " +
                                                  problem.to_string());
  }

  FLASHJIT_TRY(load_stored(run));
  if (resumed(run)) return finish();

  // Compiles for this problem (tune_all queued them already; this is a no-op then).
  slot(problem, *default_cfg);
  for (size_t i = 0; i < run.configs.size(); ++i) {
    if (!run.results[i]) slot(problem, run.configs[i]);
  }
  FLASHJIT_TRY(ensure_buffers(problem));
  for (const DeviceTensors& set : buffers_->sets) run.sets.push_back(set.args);
  run.batch_ms = options_.min_time_ms / options_.min_samples;
  run.samples.resize(run.configs.size());

  run.timer = std::make_unique<QuietTimer>(backend_, options_.max_disturbed_share,
                                           options_.quiet_wait_ms, options_.warmup_ms);

  FLASHJIT_TRY(first_pass(run));
  const std::vector<size_t> candidates = retime_candidates(run);
  // Once the device was found busy beyond the wait, re-times would not be quiet either.
  if (candidates.size() >= 2 && !run.timer->gave_up()) {
    FLASHJIT_TRY(retime_until_stable(run, candidates));
  }
  if (run.timer->gave_up() && !run.report.disturbed) {
    char share[16];
    std::snprintf(share, sizeof(share), "%.0f%%", 100 * run.timer->worst_share());
    FLASHJIT_TRY(mark_disturbed(
        run, "other work took up to " + std::string(share) + " of " + device.name + " during " +
                 std::to_string(run.timer->discarded()) + " timed batches, and " +
                 std::to_string(static_cast<int>(std::lround(run.timer->waited_ms()))) +
                 " ms of waiting did not see it end"));
  }
  if (std::optional<size_t> candidate = winner(run))
    FLASHJIT_TRY(compare_with_default(run, *candidate));
  FLASHJIT_TRY(decide(run));
  return finish();
}

// Results so far from the store (resume; rows measured while the device was disturbed are
// measured again), and the stored choice (resumed, or kept when this run's timings are unstable).
Status Tuner::load_stored(ProblemRun& run) {
  run.results.assign(run.configs.size(), std::nullopt);
  if (store_ == nullptr) return ok_status();
  if (options_.resume) {
    Result<std::vector<TuneResult>> rows = store_->results(fingerprint_, run.report.key);
    if (!rows.ok()) return rows.error();
    for (TuneResult& row : *rows) {
      if (row.message.find(kDisturbedNote) != std::string::npos) continue;
      auto at = std::find(run.configs.begin(), run.configs.end(), row.config);
      if (at != run.configs.end()) run.results[at - run.configs.begin()] = std::move(row);
    }
  }
  Result<std::optional<TuneChoice>> choice = store_->choice(fingerprint_, run.report.key);
  if (!choice.ok()) return choice.error();
  run.stored_choice = choice.value();
  for (size_t i = 0; i < run.configs.size(); ++i) {
    if (run.results[i]) run.results[i]->is_default = i == run.default_index;
  }
  for (const auto& r : run.results) {
    if (r && r->status == TuneStatus::Timed && (run.best_ms == 0 || r->median_ms < run.best_ms)) {
      run.best_ms = r->median_ms;
    }
  }
  return ok_status();
}

// True when the store has every config's result and a choice: the report is made from them.
bool Tuner::resumed(ProblemRun& run) const {
  const bool all_recorded = std::all_of(run.results.begin(), run.results.end(),
                                        [](const auto& r) { return r.has_value(); });
  if (!run.stored_choice || !all_recorded) return false;
  TuneReport& report = run.report;
  report.resumed = true;
  for (auto& result : run.results) report.results.push_back(*result);
  report.choice = run.stored_choice;
  const TuneResult& def = report.results[run.default_index];
  report.default_ms =
      def.status == TuneStatus::Timed ? def.median_ms : run.stored_choice->default_ms;
  report.kept_default = false;
  if (run.stored_choice->config == report.default_config) {
    for (const TuneResult& r : report.results) {
      if (r.status == TuneStatus::Timed && r.median_ms < report.default_ms) {
        report.kept_default = true;
      }
    }
  }
  report.note = "from the store";
  return true;
}

// Every config not yet measured, verified then timed: the default first (it is the yardstick of
// the abandon rule), then the legal order. Each result is recorded as it is measured.
Status Tuner::first_pass(ProblemRun& run) {
  std::vector<size_t> order{run.default_index};
  for (size_t i = 0; i < run.configs.size(); ++i) {
    if (i != run.default_index) order.push_back(i);
  }
  int step = 0;
  for (size_t i : order) {
    run.progress.step = step;
    if (!run.results[i]) FLASHJIT_TRY(measure(run, i));
    run.progress.step = ++step;
    TuneProgress timed = run.progress;
    timed.phase = TuneProgress::Phase::Timing;
    timed.result = &*run.results[i];
    notify(timed);
  }
  return ok_status();
}

// One config of the first pass: a config a previous worker died running is recorded failed
// without a launch; else verified, then timed alone on the device. An Error only when the device
// is unusable (after recording the config that made it so).
Status Tuner::measure(ProblemRun& run, size_t i) {
  const AttentionConfig& config = run.configs[i];
  const ProblemKey& key = run.report.key;
  if (const TuneOptions::Fault* fault = fault_of(key, config)) {
    TuneResult died =
        failed(config, TuneStatus::LaunchFailed, "a tuning worker died running it: " + fault->why);
    died.is_default = i == run.default_index;
    FLASHJIT_TRY(record(key, died));
    run.results[i] = std::move(died);
    return ok_status();
  }
  std::shared_ptr<Slot> s = slot(run.problem, config);
  Result<TuneResult> prepared = prepare_kernel(*s, run.problem, run.progress, key);
  if (!prepared.ok()) {  // the device is unusable after its verification launch (the in-flight
                         // mark stays, for the supervisor)
    TuneResult lost = failed(config, TuneStatus::LaunchFailed,
                             "left the device unusable: " + prepared.error().describe());
    lost.is_default = i == run.default_index;
    FLASHJIT_TRY(record(key, lost));
    return prepared.error();
  }
  mark_inflight(key, nullptr);  // waits follow: compiles, the device's lock
  TuneResult result = std::move(prepared.value());
  result.is_default = i == run.default_index;
  if (result.status == TuneStatus::Timed) {
    // On the CPU the compiler would take a core from the kernel being timed.
    if (backend_.compiles_share_the_device()) wait_for_compiles();
    Rotation rotation(*s->kernel, run.problem, run.sets);
    const std::function<Status()> work = std::ref(rotation);
    Measurement m;
    Result<DeviceLock::Guard> held = hold_device();
    if (!held.ok()) return held.error();
    mark_inflight(key, &config);
    Result<int> reps = warm_up(backend_, work, options_.warmup_ms, run.batch_ms);
    Status status = reps.ok() ? ok_status() : Status(reps.error());
    if (reps.ok()) m.reps = *reps;
    double total_ms = 0;
    while (status.ok()) {
      mark_inflight(key, &config);  // each batch a heartbeat: only a batch that never ends hangs
      Result<double> sample = run.timer->time_ms(work, m.reps);
      if (!sample.ok()) {
        status = sample.error();
        break;
      }
      m.samples.push_back(*sample);
      total_ms += *sample * m.reps;
      const int n = static_cast<int>(m.samples.size());
      if (n >= options_.max_samples) break;
      if (n >= options_.min_samples && total_ms >= options_.min_time_ms) break;
      if (n >= kMinSamplesOfLongLaunches && total_ms >= options_.max_time_ms) break;
      if (n >= kAbandonAfterSamples && run.best_ms > 0 && options_.abandon_factor > 0 &&
          median_of(m.samples) > options_.abandon_factor * run.best_ms) {
        m.abandoned = true;
        break;
      }
    }
    held->release();
    if (!status.ok()) {
      result.status = TuneStatus::LaunchFailed;
      result.message = "timing: " + status.error().describe();
      if (Status health = device_health(config.to_string() + " failed to launch"); !health.ok()) {
        append_note(result.message, "left the device unusable");
        FLASHJIT_TRY(record(key, result));
        return health.error();
      }
    } else {
      result.median_ms = median_of(m.samples);
      result.min_ms = *std::min_element(m.samples.begin(), m.samples.end());
      result.max_ms = *std::max_element(m.samples.begin(), m.samples.end());
      result.repetitions = static_cast<int>(m.samples.size()) * m.reps;
      result.tflops = tflops_of(run.problem, result.median_ms);
      if (m.abandoned) append_note(result.message, "stopped early: slower than the best");
      run.samples[i] = std::move(m.samples);
      if (run.best_ms == 0 || result.median_ms < run.best_ms) run.best_ms = result.median_ms;
    }
    mark_inflight(key, nullptr);
  }
  FLASHJIT_TRY(record(key, result));
  run.results[i] = std::move(result);
  return ok_status();
}

// The configs re-timed side by side: the fastest retime_top of the first pass and the default.
std::vector<size_t> Tuner::retime_candidates(const ProblemRun& run) const {
  std::vector<size_t> timed;
  for (size_t i = 0; i < run.configs.size(); ++i) {
    if (run.results[i]->status == TuneStatus::Timed) timed.push_back(i);
  }
  std::sort(timed.begin(), timed.end(), [&](size_t a, size_t b) {
    return run.results[a]->median_ms < run.results[b]->median_ms;
  });
  std::vector<size_t> candidates(
      timed.begin(), timed.begin() + std::min<size_t>(timed.size(), options_.retime_top));
  if (run.results[run.default_index]->status == TuneStatus::Timed &&
      std::find(candidates.begin(), candidates.end(), run.default_index) == candidates.end()) {
    candidates.push_back(run.default_index);
  }
  return candidates;
}

// One re-time: the candidates' batches round-robin, holding the device; their results replaced
// by the re-timed medians (run.retimed: the candidates that got samples).
Status Tuner::retime(ProblemRun& run, const std::vector<size_t>& candidates) {
  const ProblemKey& key = run.report.key;
  run.retimed.clear();
  TuneProgress retiming = run.progress;
  retiming.phase = TuneProgress::Phase::Retiming;
  notify(retiming);

  struct Candidate {
    size_t index;
    std::shared_ptr<Slot> slot;
    std::unique_ptr<Rotation> rotation;
    std::function<Status()> work;
    int reps = 1;
    std::vector<double> samples;
    double total_ms = 0;
    bool failed = false;
  };
  std::vector<Candidate> runs;
  for (size_t i : candidates) {
    Candidate candidate;
    candidate.index = i;
    candidate.slot = slot(run.problem, run.configs[i]);
    Result<TuneResult> prepared = prepare_kernel(*candidate.slot, run.problem, run.progress, key);
    if (!prepared.ok()) return prepared.error();
    mark_inflight(key, nullptr);
    if (prepared->status != TuneStatus::Timed) {  // recorded as timed, fails now
      TuneResult result = std::move(prepared.value());
      result.is_default = i == run.default_index;
      FLASHJIT_TRY(record(key, result));
      run.results[i] = std::move(result);
      continue;
    }
    candidate.rotation = std::make_unique<Rotation>(*candidate.slot->kernel, run.problem, run.sets);
    candidate.work = std::ref(*candidate.rotation);
    runs.push_back(std::move(candidate));
  }
  Result<DeviceLock::Guard> held = hold_device();
  if (!held.ok()) return held.error();
  for (Candidate& c : runs) {
    mark_inflight(key, &run.configs[c.index]);
    Result<int> reps = warm_up(backend_, c.work, options_.warmup_ms, run.batch_ms);
    if (reps.ok()) {
      c.reps = *reps;
    } else {
      FLASHJIT_TRY(device_health(run.configs[c.index].to_string() + " failed to launch"));
      c.failed = true;
      run.results[c.index]->status = TuneStatus::LaunchFailed;
      run.results[c.index]->message = "re-time: " + reps.error().describe();
    }
  }
  for (int round = 0; round < options_.max_samples; ++round) {
    bool enough = round >= options_.min_samples;
    bool long_enough = round + 1 >= kMinSamplesOfLongLaunches;  // samples after this round
    for (Candidate& c : runs) {
      if (c.failed) continue;
      mark_inflight(key, &run.configs[c.index]);
      Result<double> sample = run.timer->time_ms(c.work, c.reps);
      if (!sample.ok()) {
        FLASHJIT_TRY(device_health(run.configs[c.index].to_string() + " failed to launch"));
        c.failed = true;
        run.results[c.index]->status = TuneStatus::LaunchFailed;
        run.results[c.index]->message = "re-time: " + sample.error().describe();
        continue;
      }
      c.samples.push_back(*sample);
      c.total_ms += *sample * c.reps;
      if (c.total_ms < options_.min_time_ms) enough = false;
      if (c.total_ms < options_.max_time_ms) long_enough = false;
    }
    if (enough || long_enough) break;
  }
  mark_inflight(key, nullptr);
  for (Candidate& c : runs) {
    TuneResult& result = *run.results[c.index];
    if (!c.failed && !c.samples.empty()) {
      result.median_ms = median_of(c.samples);
      result.min_ms = *std::min_element(c.samples.begin(), c.samples.end());
      result.max_ms = *std::max_element(c.samples.begin(), c.samples.end());
      result.repetitions = static_cast<int>(c.samples.size()) * c.reps;
      result.tflops = tflops_of(run.problem, result.median_ms);
      append_note(result.message, "re-timed");
      run.samples[c.index] = std::move(c.samples);
      run.retimed.push_back(c.index);
    }
    FLASHJIT_TRY(record(key, result));
  }
  return ok_status();
}

// The disturbance check: re-times until the default's median agrees with its previous one (first
// pass or store, then the previous re-time) within the noise, at most max_retimes times. When it
// never does, the report says so and every timing is noted "disturbed" (measured again next run).
Status Tuner::retime_until_stable(ProblemRun& run, const std::vector<size_t>& candidates) {
  const size_t d = run.default_index;
  const bool default_timed = run.results[d]->status == TuneStatus::Timed;
  double previous_ms = default_timed ? run.results[d]->median_ms : 0;
  std::vector<double> previous_samples = run.samples[d];
  std::string medians = previous_ms > 0 ? std::to_string(previous_ms) : "";
  bool stable = false;
  for (int round = 0; round < options_.max_retimes && !stable; ++round) {
    FLASHJIT_TRY(retime(run, candidates));
    const bool checked = previous_ms > 0 &&
                         std::find(run.retimed.begin(), run.retimed.end(), d) != run.retimed.end();
    if (!checked) {
      stable = true;
      break;
    }
    const double now_ms = run.results[d]->median_ms;
    const double noise =
        std::max({options_.disturbance_tolerance * previous_ms,
                  interquartile_range(previous_samples), interquartile_range(run.samples[d])});
    medians += ", " + std::to_string(now_ms);
    stable = std::abs(now_ms - previous_ms) <= noise;
    previous_ms = now_ms;
    previous_samples = run.samples[d];
  }
  if (stable) return ok_status();
  return mark_disturbed(run, "something else used " + backend_.device().name + ": the default " +
                                 run.configs[d].to_string() + " measured " + medians + " ms");
}

Status Tuner::mark_disturbed(ProblemRun& run, const std::string& why) {
  TuneReport& report = run.report;
  report.disturbed = true;
  report.note =
      "timings unstable (" + why + "); " +
      (run.stored_choice ? "the stored choice " + run.stored_choice->config.to_string() + " is kept"
                         : std::string("the default is stored as the choice")) +
      "; tune again when the device is quiet";
  message("flashjit tune: " + run.problem.to_string() + ": " + report.note);
  // Every timing of this problem is suspect: the next run measures them again.
  for (auto& result : run.results) {
    if (result->status != TuneStatus::Timed) continue;
    append_note(result->message, kDisturbedNote);
    FLASHJIT_TRY(record(report.key, *result));
  }
  return ok_status();
}

namespace {

// The fastest timed config, among the re-timed ones when there was a re-time.
std::optional<size_t> fastest(const std::vector<std::optional<TuneResult>>& results,
                              const std::vector<size_t>& retimed) {
  std::optional<size_t> best;
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i]->status != TuneStatus::Timed) continue;
    if (!retimed.empty() && std::find(retimed.begin(), retimed.end(), i) == retimed.end()) continue;
    if (!best || results[i]->median_ms < results[*best]->median_ms) best = i;
  }
  return best;
}

double range_of(const std::vector<double>& values) {
  if (values.empty()) return 0;
  const auto [low, high] = std::minmax_element(values.begin(), values.end());
  return *high - *low;
}

}  // namespace

// The fastest re-timed config when it beats the timed default beyond the re-time's noise
// (max(min_gain * default median, the interquartile range of either's samples)); none when the
// default wins, was not timed, or the timings are disturbed (no choice from them).
std::optional<size_t> Tuner::winner(const ProblemRun& run) const {
  const size_t d = run.default_index;
  const std::optional<size_t> best = fastest(run.results, run.retimed);
  if (!best || *best == d || run.report.disturbed) return std::nullopt;
  const TuneResult& def = *run.results[d];
  if (def.status != TuneStatus::Timed) return std::nullopt;
  const double noise =
      std::max({options_.min_gain * def.median_ms, interquartile_range(run.samples[*best]),
                interquartile_range(run.samples[d])});
  if (def.median_ms - run.results[*best]->median_ms <= noise) return std::nullopt;
  return best;
}

// The gain of `candidate` over the default from timings taken close together: their batches
// alternate, the default's first and last (D C D ... C D, compare_rounds of the candidate's), so
// that whatever slows the device for a while slows both alike. The re-time's medians do not
// ensure that: each round times every candidate in turn, and a default a neighbour slowed by less
// than the disturbance tolerance through a re-time passes its check and inflates the gain.
Status Tuner::compare_with_default(ProblemRun& run, size_t candidate) {
  const ProblemKey& key = run.report.key;
  TuneProgress comparing = run.progress;
  comparing.phase = TuneProgress::Phase::Comparing;
  notify(comparing);

  ProblemRun::Comparison comparison;
  comparison.candidate = candidate;
  struct Side {
    size_t index = 0;
    std::vector<double>* samples = nullptr;
    std::shared_ptr<Slot> slot;
    std::unique_ptr<Rotation> rotation;
    std::function<Status()> work;
    int reps = 1;
  };
  Side sides[2];
  sides[0].index = run.default_index;
  sides[0].samples = &comparison.default_samples;
  sides[1].index = candidate;
  sides[1].samples = &comparison.candidate_samples;
  for (Side& side : sides) {
    side.slot = slot(run.problem, run.configs[side.index]);
    Result<TuneResult> prepared = prepare_kernel(*side.slot, run.problem, run.progress, key);
    if (!prepared.ok()) return prepared.error();
    mark_inflight(key, nullptr);
    if (prepared->status != TuneStatus::Timed) {  // timed before: cannot fail now, but if it does
      comparison.failed = true;
      run.comparison = std::move(comparison);
      return ok_status();
    }
    side.rotation = std::make_unique<Rotation>(*side.slot->kernel, run.problem, run.sets);
    side.work = std::ref(*side.rotation);
  }
  Result<DeviceLock::Guard> held = hold_device();
  if (!held.ok()) return held.error();
  for (Side& side : sides) {
    mark_inflight(key, &run.configs[side.index]);
    Result<int> reps = warm_up(backend_, side.work, options_.warmup_ms, run.batch_ms);
    if (!reps.ok()) {
      FLASHJIT_TRY(device_health(run.configs[side.index].to_string() + " failed to launch"));
      comparison.failed = true;
      break;
    }
    side.reps = *reps;
  }
  for (int i = 0; !comparison.failed && i < 2 * options_.compare_rounds + 1; ++i) {
    Side& side = sides[i % 2];
    mark_inflight(key, &run.configs[side.index]);
    Result<double> sample = run.timer->time_ms(side.work, side.reps);
    if (!sample.ok()) {
      FLASHJIT_TRY(device_health(run.configs[side.index].to_string() + " failed to launch"));
      comparison.failed = true;
      break;
    }
    side.samples->push_back(*sample);
  }
  mark_inflight(key, nullptr);
  run.comparison = std::move(comparison);
  return ok_status();
}

// The decision: the winner (winner()) if its alternating comparison with the default shows a
// gain beyond the spread of those repeats (max(min_gain * the default's median, the range of
// either's samples)), else the default; a faster config within the noise is a tie that keeps the
// default. No choice from disturbed timings (the stored one stays, or the default is stored).
Status Tuner::decide(ProblemRun& run) {
  TuneReport& report = run.report;
  const size_t d = run.default_index;
  const std::optional<size_t> best = fastest(run.results, run.retimed);
  for (auto& result : run.results) report.results.push_back(std::move(*result));
  if (!best) {
    report.note = "no config passed verification and timing";
    return ok_status();
  }
  size_t chosen = *best;
  double chosen_ms = report.results[chosen].median_ms;
  const TuneResult& def = report.results[d];
  if (def.status == TuneStatus::Timed) {
    report.default_ms = def.median_ms;
    if (chosen != d) {
      report.noise_ms =
          std::max({options_.min_gain * def.median_ms, interquartile_range(run.samples[chosen]),
                    interquartile_range(run.samples[d])});
      const ProblemRun::Comparison* comparison =
          run.comparison && run.comparison->candidate == chosen ? &*run.comparison : nullptr;
      if (comparison != nullptr && !comparison->failed) {
        const double default_ms = median_of(comparison->default_samples);
        const double candidate_ms = median_of(comparison->candidate_samples);
        report.compared = true;
        report.default_ms = default_ms;
        report.noise_ms =
            std::max({options_.min_gain * default_ms, range_of(comparison->default_samples),
                      range_of(comparison->candidate_samples)});
        chosen_ms = candidate_ms;
        if (default_ms - candidate_ms <= report.noise_ms) {
          chosen = d;
          chosen_ms = default_ms;
          report.kept_default = true;
        }
      } else if (comparison != nullptr) {
        report.note = run.configs[chosen].to_string() +
                      " failed to launch in its comparison with the default: the default stays";
        chosen = d;
        chosen_ms = def.median_ms;
      } else if (def.median_ms - chosen_ms <= report.noise_ms) {
        chosen = d;
        chosen_ms = def.median_ms;
        report.kept_default = true;
      }
    }
  } else {
    report.note =
        "the default config " + report.default_config.to_string() + " " + to_string(def.status);
  }
  TuneChoice choice;
  if (report.disturbed) {
    report.kept_default = false;
    if (run.stored_choice) {
      report.choice = run.stored_choice;
      return ok_status();
    }
    choice.config = run.configs[d];
    choice.median_ms = report.default_ms;
  } else {
    choice.config = run.configs[chosen];
    choice.median_ms = chosen_ms;
  }
  choice.default_ms = report.default_ms;
  if (store_ != nullptr) FLASHJIT_TRY(store_->choose(fingerprint_, report.key, choice));
  report.choice = choice;
  return ok_status();
}

// ---------------------------------------------------------------------------------------------
// Tune on miss.

void install_tune_on_miss(Runtime& runtime, TuneOptions options) {
  struct State {
    TuneOptions options;
    const Runtime* owner = nullptr;
    std::unique_ptr<BinaryCache> cache;
    std::unique_ptr<Tuner> tuner;
  };
  auto state = std::make_shared<State>();
  state->options = std::move(options);
  runtime.set_tune_hook(
      [state](Runtime& rt, const AttentionProblem& problem) -> Result<AttentionConfig> {
        if (!state->tuner || state->owner != &rt) {
          state->tuner.reset();
          state->cache.reset();
          if (rt.options().use_disk_cache) {
            state->cache = std::make_unique<BinaryCache>(
                rt.options().cache_dir.value_or(BinaryCache::default_dir()));
          }
          state->owner = &rt;
          state->tuner = std::make_unique<Tuner>(rt.backend(), state->cache.get(), rt.user_store(),
                                                 state->options);
        }
        Result<TuneReport> report = state->tuner->tune(problem);
        if (!report.ok()) return report.error();
        if (!report->choice) {
          return make_error(ErrorCode::NotFound, "tuning " + problem.to_string() +
                                                     " found no usable config: " + report->note);
        }
        return report->choice->config;
      });
}

}  // namespace flashjit
