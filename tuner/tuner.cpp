#include "tuner/tuner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
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
  if (!device_lock_) return DeviceLock::Guard();
  return device_lock_->acquire([this](long pid) {
    // Once per holder: a contended run would otherwise say it before every config.
    if (pid == last_holder_pid_) return;
    last_holder_pid_ = pid;
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

Result<TuneReport> Tuner::tune(const AttentionProblem& problem) { return tune_one(problem, 0, 1); }

Result<std::vector<TuneReport>> Tuner::tune_all(const std::vector<AttentionProblem>& problems) {
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

  TuneReport report;
  report.problem = problem;
  report.key = ProblemKey::of(problem);
  const std::vector<AttentionConfig> configs = backend_.legal_configs(problem);
  Result<AttentionConfig> default_cfg = backend_.default_config(problem);

  TuneProgress progress;
  progress.problem = &problem;
  progress.problem_index = index;
  progress.problem_count = count;
  progress.steps = static_cast<int>(configs.size()) + 1;
  auto finish = [&]() {
    mark_inflight(report.key, nullptr);
    report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    TuneProgress done = progress;
    done.phase = TuneProgress::Phase::Done;
    done.step = done.steps;
    done.report = &report;
    notify(done);
    return report;
  };
  if (configs.empty() || !default_cfg.ok()) {
    report.note = "no legal config on " + device.name;
    if (!default_cfg.ok()) report.note += ": " + default_cfg.error().message;
    return finish();
  }
  report.default_config = *default_cfg;
  const size_t default_index =
      std::find(configs.begin(), configs.end(), *default_cfg) - configs.begin();
  if (default_index == configs.size()) {  // an invariant of the generator
    return make_error(ErrorCode::Unsupported, "default config " + default_cfg->to_string() +
                                                  " is not among the legal configs of " +
                                                  problem.to_string());
  }

  // Results so far: from the store (resume), then measured.
  std::vector<std::optional<TuneResult>> results(configs.size());
  std::optional<TuneChoice> stored_choice;
  if (store_ != nullptr && options_.resume) {
    Result<std::vector<TuneResult>> rows = store_->results(fingerprint_, report.key);
    if (!rows.ok()) return rows.error();
    for (TuneResult& row : *rows) {
      // Rows measured while the device was disturbed are measured again.
      if (row.message.find(kDisturbedNote) != std::string::npos) continue;
      auto at = std::find(configs.begin(), configs.end(), row.config);
      if (at != configs.end()) results[at - configs.begin()] = std::move(row);
    }
  }
  if (store_ != nullptr) {  // resumed, or kept when this run's timings are unstable
    Result<std::optional<TuneChoice>> choice = store_->choice(fingerprint_, report.key);
    if (!choice.ok()) return choice.error();
    stored_choice = choice.value();
  }
  for (size_t i = 0; i < configs.size(); ++i) {
    if (results[i]) results[i]->is_default = i == default_index;
  }
  const bool all_recorded =
      std::all_of(results.begin(), results.end(), [](const auto& r) { return r.has_value(); });
  if (stored_choice && all_recorded) {
    report.resumed = true;
    for (auto& result : results) report.results.push_back(*result);
    report.choice = stored_choice;
    const TuneResult& def = report.results[default_index];
    report.default_ms = def.status == TuneStatus::Timed ? def.median_ms : stored_choice->default_ms;
    report.kept_default = false;
    if (stored_choice->config == *default_cfg) {
      for (const TuneResult& r : report.results) {
        if (r.status == TuneStatus::Timed && r.median_ms < report.default_ms) {
          report.kept_default = true;
        }
      }
    }
    report.note = "from the store";
    return finish();
  }

  // Compiles for this problem (tune_all queued them already; this is a no-op then).
  slot(problem, *default_cfg);
  for (size_t i = 0; i < configs.size(); ++i) {
    if (!results[i]) slot(problem, configs[i]);
  }

  FLASHJIT_TRY(ensure_buffers(problem));
  std::vector<AttentionArgs> sets;
  for (const DeviceTensors& set : buffers_->sets) sets.push_back(set.args);

  const double batch_ms = options_.min_time_ms / options_.min_samples;
  std::vector<std::vector<double>> samples(configs.size());
  double best_ms = 0;
  for (const auto& r : results) {
    if (r && r->status == TuneStatus::Timed && (best_ms == 0 || r->median_ms < best_ms)) {
      best_ms = r->median_ms;
    }
  }

  // Default first (it is the yardstick of the abandon rule), then the legal order.
  std::vector<size_t> order{default_index};
  for (size_t i = 0; i < configs.size(); ++i) {
    if (i != default_index) order.push_back(i);
  }
  int step = 0;
  for (size_t i : order) {
    progress.step = step;
    if (!results[i] && fault_of(report.key, configs[i]) != nullptr) {
      TuneResult failed;
      failed.config = configs[i];
      failed.is_default = i == default_index;
      failed.status = TuneStatus::LaunchFailed;
      failed.message = "a tuning worker died running it: " + fault_of(report.key, configs[i])->why;
      FLASHJIT_TRY(record(report.key, failed));
      results[i] = std::move(failed);
    }
    if (!results[i]) {
      std::shared_ptr<Slot> s = slot(problem, configs[i]);
      Result<TuneResult> prepared = prepare_kernel(*s, problem, progress, report.key);
      if (!prepared.ok()) {  // the device is unusable after its verification launch (the in-flight
                             // mark stays, for the supervisor)
        TuneResult failed;
        failed.config = configs[i];
        failed.is_default = i == default_index;
        failed.status = TuneStatus::LaunchFailed;
        failed.message = "left the device unusable: " + prepared.error().describe();
        FLASHJIT_TRY(record(report.key, failed));
        return prepared.error();
      }
      mark_inflight(report.key, nullptr);  // waits follow: compiles, the device's lock
      TuneResult result = std::move(prepared.value());
      result.is_default = i == default_index;
      if (result.status == TuneStatus::Timed) {
        // On the CPU the compiler would take a core from the kernel being timed.
        if (backend_.compiles_share_the_device()) wait_for_compiles();
        Rotation rotation(*s->kernel, problem, sets);
        const std::function<Status()> work = std::ref(rotation);
        Measurement m;
        Result<DeviceLock::Guard> held = hold_device();
        if (!held.ok()) return held.error();
        mark_inflight(report.key, &configs[i]);
        Result<int> reps = warm_up(backend_, work, options_.warmup_ms, batch_ms);
        Status status = reps.ok() ? ok_status() : Status(reps.error());
        if (reps.ok()) m.reps = *reps;
        double total_ms = 0;
        while (status.ok()) {
          Result<double> sample = backend_.time_ms(work, m.reps);
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
          if (n >= kAbandonAfterSamples && best_ms > 0 && options_.abandon_factor > 0 &&
              median_of(m.samples) > options_.abandon_factor * best_ms) {
            m.abandoned = true;
            break;
          }
        }
        held->release();
        if (!status.ok()) {
          result.status = TuneStatus::LaunchFailed;
          result.message = "timing: " + status.error().describe();
          if (Status health = device_health(configs[i].to_string() + " failed to launch");
              !health.ok()) {
            append_note(result.message, "left the device unusable");
            FLASHJIT_TRY(record(report.key, result));
            return health.error();
          }
        } else {
          result.median_ms = median_of(m.samples);
          result.min_ms = *std::min_element(m.samples.begin(), m.samples.end());
          result.max_ms = *std::max_element(m.samples.begin(), m.samples.end());
          result.repetitions = static_cast<int>(m.samples.size()) * m.reps;
          result.tflops = tflops_of(problem, result.median_ms);
          if (m.abandoned) append_note(result.message, "stopped early: slower than the best");
          samples[i] = std::move(m.samples);
          if (best_ms == 0 || result.median_ms < best_ms) best_ms = result.median_ms;
        }
        mark_inflight(report.key, nullptr);
      }
      FLASHJIT_TRY(record(report.key, result));
      results[i] = std::move(result);
    }
    progress.step = ++step;
    TuneProgress timed = progress;
    timed.phase = TuneProgress::Phase::Timing;
    timed.result = &*results[i];
    notify(timed);
  }

  // Re-time the top configs and the default, interleaved.
  std::vector<size_t> timed;
  for (size_t i = 0; i < configs.size(); ++i) {
    if (results[i]->status == TuneStatus::Timed) timed.push_back(i);
  }
  std::sort(timed.begin(), timed.end(),
            [&](size_t a, size_t b) { return results[a]->median_ms < results[b]->median_ms; });
  std::vector<size_t> candidates(
      timed.begin(), timed.begin() + std::min<size_t>(timed.size(), options_.retime_top));
  const bool default_timed = results[default_index]->status == TuneStatus::Timed;
  if (default_timed &&
      std::find(candidates.begin(), candidates.end(), default_index) == candidates.end()) {
    candidates.push_back(default_index);
  }
  std::vector<size_t> retimed;  // candidates with re-timed samples
  // One re-time: the candidates' batches round-robin, holding the device.
  auto retime = [&]() -> Status {
    retimed.clear();
    TuneProgress retiming = progress;
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
      Candidate run;
      run.index = i;
      run.slot = slot(problem, configs[i]);
      Result<TuneResult> prepared = prepare_kernel(*run.slot, problem, progress, report.key);
      if (!prepared.ok()) return prepared.error();
      mark_inflight(report.key, nullptr);
      if (prepared->status != TuneStatus::Timed) {  // recorded as timed, fails now
        TuneResult result = std::move(prepared.value());
        result.is_default = i == default_index;
        FLASHJIT_TRY(record(report.key, result));
        results[i] = std::move(result);
        continue;
      }
      run.rotation = std::make_unique<Rotation>(*run.slot->kernel, problem, sets);
      run.work = std::ref(*run.rotation);
      runs.push_back(std::move(run));
    }
    Result<DeviceLock::Guard> held = hold_device();
    if (!held.ok()) return held.error();
    for (Candidate& run : runs) {
      mark_inflight(report.key, &configs[run.index]);
      Result<int> reps = warm_up(backend_, run.work, options_.warmup_ms, batch_ms);
      if (reps.ok()) {
        run.reps = *reps;
      } else {
        FLASHJIT_TRY(device_health(configs[run.index].to_string() + " failed to launch"));
        run.failed = true;
        results[run.index]->status = TuneStatus::LaunchFailed;
        results[run.index]->message = "re-time: " + reps.error().describe();
      }
    }
    for (int round = 0; round < options_.max_samples; ++round) {
      bool enough = round >= options_.min_samples;
      bool long_enough = round + 1 >= kMinSamplesOfLongLaunches;  // samples after this round
      for (Candidate& run : runs) {
        if (run.failed) continue;
        mark_inflight(report.key, &configs[run.index]);
        Result<double> sample = backend_.time_ms(run.work, run.reps);
        if (!sample.ok()) {
          FLASHJIT_TRY(device_health(configs[run.index].to_string() + " failed to launch"));
          run.failed = true;
          results[run.index]->status = TuneStatus::LaunchFailed;
          results[run.index]->message = "re-time: " + sample.error().describe();
          continue;
        }
        run.samples.push_back(*sample);
        run.total_ms += *sample * run.reps;
        if (run.total_ms < options_.min_time_ms) enough = false;
        if (run.total_ms < options_.max_time_ms) long_enough = false;
      }
      if (enough || long_enough) break;
    }
    mark_inflight(report.key, nullptr);
    for (Candidate& run : runs) {
      TuneResult& result = *results[run.index];
      if (!run.failed && !run.samples.empty()) {
        result.median_ms = median_of(run.samples);
        result.min_ms = *std::min_element(run.samples.begin(), run.samples.end());
        result.max_ms = *std::max_element(run.samples.begin(), run.samples.end());
        result.repetitions = static_cast<int>(run.samples.size()) * run.reps;
        result.tflops = tflops_of(problem, result.median_ms);
        append_note(result.message, "re-timed");
        samples[run.index] = std::move(run.samples);
        retimed.push_back(run.index);
      }
      FLASHJIT_TRY(record(report.key, result));
    }
    return ok_status();
  };
  if (candidates.size() >= 2) {
    // The disturbance check: the default's median against its previous one (first pass or
    // store, then the previous re-time).
    double previous_ms = default_timed ? results[default_index]->median_ms : 0;
    std::vector<double> previous_samples = samples[default_index];
    std::string medians = previous_ms > 0 ? std::to_string(previous_ms) : "";
    bool stable = false;
    for (int round = 0; round < options_.max_retimes && !stable; ++round) {
      FLASHJIT_TRY(retime());
      const bool checked = previous_ms > 0 && std::find(retimed.begin(), retimed.end(),
                                                        default_index) != retimed.end();
      if (!checked) {
        stable = true;
        break;
      }
      const double now_ms = results[default_index]->median_ms;
      const double noise = std::max({options_.disturbance_tolerance * previous_ms,
                                     interquartile_range(previous_samples),
                                     interquartile_range(samples[default_index])});
      medians += ", " + std::to_string(now_ms);
      stable = std::abs(now_ms - previous_ms) <= noise;
      previous_ms = now_ms;
      previous_samples = samples[default_index];
    }
    if (!stable) {
      report.disturbed = true;
      report.note =
          "timings unstable (something else used " + backend_.device().name + "): the default " +
          configs[default_index].to_string() + " measured " + medians + " ms; " +
          (stored_choice ? "the stored choice " + stored_choice->config.to_string() + " is kept"
                         : std::string("the default is stored as the choice")) +
          "; tune again when the device is quiet";
      message("flashjit tune: " + problem.to_string() + ": " + report.note);
      // Every timing of this problem is suspect: the next run measures them again.
      for (auto& result : results) {
        if (result->status != TuneStatus::Timed) continue;
        append_note(result->message, kDisturbedNote);
        FLASHJIT_TRY(record(report.key, *result));
      }
    }
  }

  // The decision: the fastest re-timed config (measured side by side), else the fastest.
  std::optional<size_t> best;
  for (size_t i = 0; i < configs.size(); ++i) {
    if (results[i]->status != TuneStatus::Timed) continue;
    if (!retimed.empty() && std::find(retimed.begin(), retimed.end(), i) == retimed.end()) continue;
    if (!best || results[i]->median_ms < results[*best]->median_ms) best = i;
  }
  for (auto& result : results) report.results.push_back(std::move(*result));
  if (!best) {
    report.note = "no config passed verification and timing";
    return finish();
  }
  size_t chosen = *best;
  const TuneResult& def = report.results[default_index];
  if (def.status == TuneStatus::Timed) {
    report.default_ms = def.median_ms;
    if (chosen != default_index) {
      report.noise_ms =
          std::max({options_.min_gain * def.median_ms, interquartile_range(samples[chosen]),
                    interquartile_range(samples[default_index])});
      if (def.median_ms - report.results[chosen].median_ms <= report.noise_ms) {
        chosen = default_index;
        report.kept_default = true;
      }
    }
  } else {
    report.note =
        "the default config " + report.default_config.to_string() + " " + to_string(def.status);
  }
  if (report.disturbed) {
    // No choice from noise: the stored one stays, or the default is stored. The rows noted
    // "disturbed" are measured again by the next run (resume skips them).
    if (stored_choice) {
      report.choice = stored_choice;
    } else {
      TuneChoice fallback;
      fallback.config = configs[default_index];
      fallback.median_ms = report.default_ms;
      fallback.default_ms = report.default_ms;
      if (store_ != nullptr) FLASHJIT_TRY(store_->choose(fingerprint_, report.key, fallback));
      report.choice = fallback;
    }
    report.kept_default = false;
    return finish();
  }
  TuneChoice choice;
  choice.config = configs[chosen];
  choice.median_ms = report.results[chosen].median_ms;
  choice.default_ms = report.default_ms;
  if (store_ != nullptr) FLASHJIT_TRY(store_->choose(fingerprint_, report.key, choice));
  report.choice = choice;
  return finish();
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
